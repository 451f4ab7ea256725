#!/bin/bash
# Session 10, third call (issue 6), ~9 min, carry [".device_wheels"]. Muon's "auto" precision is
# now "bfloat16_batched" on CUDA (the second call: LoKR 512's update alone 8.78 -> 5.41 ms, its
# batch-1 step 89.61 ms against LoRA r64's 93.36-95.09). Both adapters at batch 2 with the new
# default, then batch 1 once more, LoKR and LoRA alternating, each row in its own process.
# Only the JSON rows come back (the device returns at most 8 files); logs stay in /tmp.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
B="python3 bench/dit_bench.py --warmup 4 --compile reduce-overhead --models 2b --crops 6000 --optimizer-time"
row() {  # name timeout args...
  local name=$1 limit=$2; shift 2
  timeout $limit $B "$@" --time-budget-s $((limit - 8)) --out $OUT/$name.json > /tmp/$name.log 2>&1
  echo "$name rc=$? $(grep -h '"step_ms"\|"error": "[^"]' /tmp/$name.log | cut -c1-330)"
}
row lokr_b2_1 150 --adapters lokr512 --batches 2 --steps 20
row lora_b2_1 95 --adapters lora64 --batches 2 --steps 20
row lokr_b2_2 95 --adapters lokr512 --batches 2 --steps 20
row lora_b2_2 95 --adapters lora64 --batches 2 --steps 20
row lora_b1 70 --adapters lora64 --batches 1 --steps 30
row lokr_b1 70 --adapters lokr512 --batches 1 --steps 30
