#!/bin/bash
# The planner LM's "compiled" decode engine (the static step through Inductor, then captured in
# our CUDA graph) against "graph" (the same step uncompiled, captured) on the H200. One `run`,
# carry [".device_wheels"], ~9 min at most (the timeouts); each JSON is rewritten after every
# row, so a line cut short keeps the rows it finished. Goal: >= 200 codes/s on 1.7B, CFG 2.0
# (graph measured 167.5 codes/s, 767 ms of kernels in a 975 ms request, 150 codes).
#   line 1  1.7B: graph then compiled on 30 s and 240 s songs (150 / 1200 codes), 2 repeats,
#           kernel vs wall time of one request per row (--lm-profile), `same_codes_as_eager`
#           (greedy 10 s vs eager), `engines_used` (a compile or capture that failed shows as
#           graph / static), `warmup_s` = the first request: compile + capture (30 s), and a
#           second compile for the 2048-token cache bucket (240 s).
#   line 2  4B: graph then compiled on 30 s.
#   line 3  if time is left, 1.7B 30 s compiled-max (Inductor GEMM autotuning, no Inductor CUDA
#           graphs): whether tuned small-batch GEMMs beat cuBLAS's here.
# Then one compact line per row, and any warning or error (a compile fallback logs one).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
B="python3 bench/audition_bench.py --sections lm"
SHOW='Error|error|Traceback|failed|WARNING|Warning: |decoding with|recompil|skipping cudagraphs'
timeout 240 $B --decode-modes graph,compiled --lm-seconds 30,240 --lm-repeat 2 --lm-profile --budget-s 200 --out $OUT/audition_lm_compiled.json 2>&1 | grep -E "$SHOW" | cut -c1-400
timeout 180 $B --lm-size 4B --decode-modes graph,compiled --lm-seconds 30 --lm-repeat 2 --lm-profile --budget-s 150 --out $OUT/audition_lm_compiled_4b.json 2>&1 | grep -E "$SHOW" | cut -c1-400
timeout 120 $B --decode-modes compiled-max --lm-seconds 30 --lm-repeat 2 --no-check-eager --budget-s 100 --out $OUT/audition_lm_compiled_max.json 2>&1 | grep -E "$SHOW" | cut -c1-400
python3 - <<'PY'
import json, os, pathlib
for name in ("audition_lm_compiled", "audition_lm_compiled_4b", "audition_lm_compiled_max"):
    path = pathlib.Path(os.environ["OUT"]) / f"{name}.json"
    if not path.exists():
        print(name, "no results"); continue
    report = json.loads(path.read_text())
    for r in report["rows"]:
        p = r.get("profile", {})
        keep = {k: r.get(k) for k in ("lm", "decode_mode", "seconds", "codes", "warmup_s", "codes_per_s_median",
                                      "same_codes_as_eager", "engines_used", "skipped")}
        keep["median_ms"] = r.get("latency", {}).get("median_ms")
        keep["peak_gib"] = r.get("memory", {}).get("peak_allocated_gib")
        if p:
            keep.update(wall_ms=p["wall_ms"], kernels=p["kernels"], kernel_ms=p["kernel_ms"],
                        top=dict(list(p["top_kernels_ms"].items())[:6]))
        print(name, json.dumps({k: v for k, v in keep.items() if v is not None}))
    for e in report["errors"]:
        print(name, "ERROR", e["section"], e["error"][:300])
PY
