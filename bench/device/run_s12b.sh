#!/bin/bash
# Session 12, second call (issue 6), ~6.5 min, carry [".device_wheels"]: LoKR at 1500 x 4 (the
# pair for run_s12a.sh's LoRA row), then LoKR's compiled batch-1 sweep; LoRA's is run_s12c.sh.
# The compiled sweep lacks batch-1 rows on 750-, 1500- and 3000-frame crops (only the first,
# eager sweep has them); the best-batch rows at 6000 frames (batch 2-3) and on short crops
# (750 x 8, 1500 x 4: next_run.sh) are measured elsewhere. One process per adapter, three crop
# shapes each (each new shape compiles, ~60-90 s), CUDA graphs, Muon's default.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
row() {  # name timeout args...
  local name=$1 limit=$2; shift 2
  pkill -9 -f "bench/dit_bench.py|compile_worker" 2>/dev/null; sleep 2
  echo "$name: GPU apps before: $(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | tr '\n' ' ')"
  timeout $limit python3 bench/dit_bench.py --compile reduce-overhead --models 2b --steps 10 --warmup 3 --optimizer-time --crops 750,1500,3000 --batches 1 "$@" --time-budget-s $((limit - 10)) --out $OUT/$name.json > /tmp/$name.log 2>&1
  echo "$name rc=$?"; grep -h '"step_ms"\|"error": "[^"]' /tmp/$name.log | cut -c1-300
}
pkill -9 -f "bench/dit_bench.py|compile_worker" 2>/dev/null; sleep 2
timeout 105 python3 bench/dit_bench.py --compile reduce-overhead --models 2b --steps 12 --warmup 3 --optimizer-time --adapters lokr512 --crops 1500 --batches 4 --time-budget-s 97 --out $OUT/lokr_1500_b4.json > /tmp/lokr_1500_b4.log 2>&1
echo "lokr_1500_b4 rc=$? $(grep -h '"step_ms"\|"error": "[^"]' /tmp/lokr_1500_b4.log | head -1 | cut -c1-330)"
row lokr_b1_sweep 285 --adapters lokr512
