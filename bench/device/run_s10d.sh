#!/bin/bash
# Session 10, fourth call (issue 6), ~6 min, carry [".device_wheels"]. With Muon's new default
# ("bfloat16_batched" on CUDA): the batch-1 pair once more (the third call's batch-1 rows ran out
# of time after the batch-2 compiles), then a kernel profile of a batch-2 LoKR 512 step (where
# LoKR is still 1.7-2.4% behind LoRA r64) to see which kernels carry the difference.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
B="python3 bench/dit_bench.py --warmup 4 --compile reduce-overhead --models 2b --crops 6000 --optimizer-time"
row() {  # name timeout args...
  local name=$1 limit=$2; shift 2
  timeout $limit $B "$@" --time-budget-s $((limit - 8)) --out $OUT/$name.json > $OUT/$name.log 2>&1
  echo "$name rc=$? $(grep -h '"step_ms"\|"error": "[^"]' $OUT/$name.log | head -1 | cut -c1-330)"
}
row lokr_b1 140 --adapters lokr512 --batches 1 --steps 30
row lora_b1 85 --adapters lora64 --batches 1 --steps 30
row lokr_b2_prof 130 --adapters lokr512 --batches 2 --steps 6 --profile --profile-top 40
