#!/bin/bash
# Issue 7: the LM trainer's compiled decoder layers (`LmEngine.compile`, `lm_loss.compile_layers`) on
# the H200. One `run`, carry [".device_wheels"], about 7 min (timeouts sum to 9 min, each line's
# results are written after every configuration, so a line cut short keeps what it finished).
# JSON per line in $OUT/<line>/lm_bench.json; the table rows and any error go to stdout.
#   line 1  4B: eager `song` (this session's reference for the 186 ms / 16.5 % of BENCHMARKS.md),
#           then Inductor default on song, song_fit16 (checkpointing to fit 16 GiB) and
#           pack4_varlen; `song_compile` also times one row 64 tokens wider (the cost of each new
#           width in a run). Expected: ~1 min compile per configuration, steps in seconds.
#   line 2  4B: the same three in reduce-overhead (CUDA graphs); Inductor's on-disk cache from
#           line 1 shortens their compiles.
#   line 3  1.7B: eager song, then song compiled.
# Also shown: why Inductor skipped CUDA graphs, if it did, and any recompile warning.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
B="python3 bench/lm_bench.py --steps 8"
ROWS='^\| |Error|error|Traceback|skipping cudagraphs|recompil'
timeout 250 $B --sizes 4B --configs song song_compile song_fit16_compile pack4_varlen_compile --new-shape song_compile --out $OUT/lm_4b_default 2>&1 | grep -E "$ROWS" | cut -c1-400
timeout 190 $B --sizes 4B --configs song_ro song_fit16_ro pack4_varlen_ro --out $OUT/lm_4b_ro 2>&1 | grep -E "$ROWS" | cut -c1-400
timeout 100 $B --sizes 1.7B --configs song song_compile --out $OUT/lm_17b 2>&1 | grep -E "$ROWS" | cut -c1-400
python3 - <<'PY'
import json, os, pathlib
for line in ("lm_4b_default", "lm_4b_ro", "lm_17b"):
    path = pathlib.Path(os.environ["OUT"]) / line / "lm_bench.json"
    if not path.exists():
        print(line, "no results"); continue
    for r in json.loads(path.read_text())["results"]:
        keys = ("size", "config", "compile", "width", "checkpointed_layers", "ms_step", "mfu", "peak_gib",
                "first_step_ms", "graph_breaks", "graphs", "new_shape_ms", "break_reasons", "error")
        print(line, {k: r[k] for k in keys if k in r})
PY
