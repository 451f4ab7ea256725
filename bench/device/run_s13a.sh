#!/bin/bash
# Session 13, first step-graph call (issue 6), ~9 min, carry [".device_wheels"].
# next_run.sh (the first call of this session) left LoKR 512 10 ms behind LoRA r64 at 750 x 1
# (68.24 vs 57.65 ms) with the guards measured: on CUDA a block carries 1022 (LoKR) / 955 (LoRA)
# guards and Dynamo times both at ~0.4-0.5 ms per graph, so skipping guards is not the lever.
# Compile "step-graph" replays each step's forwards and backwards as one CUDA graph: rows of
# both adapters with it and with reduce-overhead (per-block graphs), one process, same seed
# (the losses of the two modes must agree to bf16 rounding).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 560 python3 bench/dit_bench.py --compile step-graph,reduce-overhead --models 2b --adapters lokr512,lora64 --steps 12 --warmup 3 --crops 750 --batches 1 --time-budget-s 540 --out $OUT/s13a.json > $OUT/s13a.log 2>&1
echo "rc=$?"
python3 - $OUT/s13a.json <<'PY'
import json, sys
for row in json.load(open(sys.argv[1]))["rows"]:
    keep = ("adapter", "compile", "crop", "batch", "step_ms", "step_ms_min", "audio_s_per_s", "peak_reserved_gib", "step_graphs", "error")
    print({k: row.get(k) for k in keep})
    print("   losses", row.get("losses"))
PY
tail -5 $OUT/s13a.log
