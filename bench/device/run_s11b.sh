#!/bin/bash
# Session 11, second call (issue 6), ~8.5 min, carry [".device_wheels"]. The first call
# (run_s11a.sh) measured the fused LoKR backward at batch 2: LoKR 512 --fused-mix 150.58 / 150.38 ms,
# LoRA r64 157.60, LoKR unfused 158.77. This call checks that against more rows from one machine:
# batch 1 LoKR fused vs LoRA, a second LoRA batch-2 row, and the batch-2 pair with AdamW (whose update
# costs the same per parameter for both adapters). 2B, 6000 frames, CUDA graphs, one process per row.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
B="python3 bench/dit_bench.py --steps 20 --warmup 4 --compile reduce-overhead --models 2b --crops 6000 --optimizer-time"
row() {  # name timeout args...
  local name=$1 limit=$2; shift 2
  timeout $limit $B "$@" --time-budget-s $((limit - 8)) --out $OUT/$name.json > /tmp/$name.log 2>&1
  echo "$name rc=$? $(grep -h '"step_ms"\|"error": "[^"]' /tmp/$name.log | head -1 | cut -c1-330)"
}
row lokr_fused_b1 150 --batches 1 --adapters lokr512 --fused-mix
row lora_b1 85 --batches 1 --adapters lora64
row lora_b2 85 --batches 2 --adapters lora64
row lokr_fused_b2_adamw 85 --batches 2 --adapters lokr512 --fused-mix --optimizer adamw
row lora_b2_adamw 85 --batches 2 --adapters lora64 --optimizer adamw
