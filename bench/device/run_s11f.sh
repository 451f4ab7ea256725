#!/bin/bash
# Session 11, sixth call (issue 6), ~5 min measured (two rows timed out compiling), carry [".device_wheels"]. The compiled sweep lacks
# 1500- and 3000-frame crops (only the first, eager sweep has them) and LoKR on 750-frame crops.
# 2B, compiled blocks + CUDA graphs, Muon's default, LoKR's fused backward (the default); each
# row in its own process at 6000 frames per step (crop x batch), the shape the 6000-frame rows
# showed to be the throughput knee.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
row() {  # name timeout args...
  local name=$1 limit=$2; shift 2
  timeout $limit python3 bench/dit_bench.py --compile reduce-overhead --models 2b --steps 10 --warmup 3 --optimizer-time "$@" --time-budget-s $((limit - 8)) --out $OUT/$name.json > /tmp/$name.log 2>&1
  echo "$name rc=$? $(grep -h '"step_ms"\|"error": "[^"]' /tmp/$name.log | head -1 | cut -c1-330)"
}
row lokr_1500_b4 140 --adapters lokr512 --crops 1500 --batches 4
row lora_1500_b4 70 --adapters lora64 --crops 1500 --batches 4
row lokr_3000_b2 70 --adapters lokr512 --crops 3000 --batches 2
row lokr_750_b8 70 --adapters lokr512 --crops 750 --batches 8
