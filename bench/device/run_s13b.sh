#!/bin/bash
# Session 13, second step-graph call (issue 6), ~9 min, carry [".device_wheels"].
# run_s13a.sh: at 750 x 1 compile step-graph gave LoKR 512 37.90 ms and LoRA r64 37.57 (per-block
# graphs: 52.03 / 46.83), losses equal to bf16 rounding. Here: the other batch-1 crops of the
# issue's short-crop rows (1500, 3000) with both adapters and the update timed alone
# (--optimizer-time), then the recipe's default path (crop 1248, grad_accum 4 folded) in both
# modes, which decides whether `auto` should pick step-graph.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
show() {
python3 - "$1" <<'PY'
import json, sys
for row in json.load(open(sys.argv[1]))["rows"]:
    keep = ("adapter", "compile", "crop", "batch", "fold", "step_ms", "step_ms_min", "audio_s_per_s", "mfu", "peak_gib", "peak_reserved_gib", "optimizer_ms", "step_graphs", "error")
    print({k: row.get(k) for k in keep if k in row})
    print("   all", row.get("step_ms_all"), "losses", row.get("losses"))
PY
}
timeout 330 python3 bench/dit_bench.py --compile step-graph --models 2b --adapters lokr512,lora64 --steps 12 --warmup 3 --optimizer-time --crops 1500,3000 --batches 1 --time-budget-s 320 --out $OUT/s13b_short.json > $OUT/s13b_short.log 2>&1
echo "short rc=$?"; show $OUT/s13b_short.json
pkill -9 -f "bench/dit_bench.py|compile_worker" 2>/dev/null; sleep 2
timeout 215 python3 bench/dit_bench.py --compile step-graph,reduce-overhead --models 2b --adapters lokr512 --steps 12 --warmup 3 --crops 1248 --batches 1 --grad-accum 4 --fold 4 --time-budget-s 205 --out $OUT/s13b_recipe.json > $OUT/s13b_recipe.log 2>&1
echo "recipe rc=$?"; show $OUT/s13b_recipe.json
