#!/bin/bash
# A next call (issue 6), ~5 min, carry [".device_wheels"]. Session 10 measured both adapters with
# AdamW at batch 1 (LoKR 512 89.68 ms, LoRA r64 88.67, within spread; run_s10b.sh) and, with
# Muon's bfloat16_batched default, LoKR 1.7-2.4% behind LoRA at batch 2 (run_s10c.sh). The batch-2
# pair with AdamW, whose update costs the same per parameter for both, says how much of that is
# the forward and backward. 2B, 6000 frames, CUDA graphs, each row in its own process (the first
# one with time to compile on a fresh machine).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
B="python3 bench/dit_bench.py --steps 20 --warmup 4 --compile reduce-overhead --models 2b --crops 6000 --batches 2 --optimizer adamw --optimizer-time"
timeout 150 $B --adapters lokr512 --time-budget-s 140 --out $OUT/lokr_b2.json > $OUT/lokr_b2.log 2>&1; echo "lokr b2 rc=$?"
timeout 95 $B --adapters lora64 --time-budget-s 87 --out $OUT/lora_b2.json > $OUT/lora_b2.log 2>&1; echo "lora b2 rc=$?"
grep -h '"step_ms"\|"error": "[^"]' $OUT/lokr_b2.log $OUT/lora_b2.log | cut -c1-400
