#!/bin/bash
# Third call of the next session (issue 6), ~9 min, carry [".device_wheels"]. Session 9 left LoKR
# 512 behind LoRA r64 by 5.8-7.6% at batch 1 (94.73 vs 88.06-89.57 ms) and 2.6% at batch 2
# (158.82 vs 154.84), with hybrid Muon. Its profiles put 2.90 ms of the batch-1 difference in
# the update (TF32 Newton-Schulz on LoKR's 512-wide w2 factors, 0.95 TFLOP per step against
# LoRA's 0.106) and 1.68 ms in the forward and backward. The four rows with AdamW, whose update
# costs the same per parameter for both adapters, in one call: is the adapter itself no slower?
# Its session-9 AdamW LoKR row timed out compiling (the first process on a fresh machine, 85 s),
# hence the first row's longer timeout. 2B, 6000 frames, CUDA graphs, each row in its own process.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
B="python3 bench/dit_bench.py --steps 12 --warmup 3 --compile reduce-overhead --models 2b --crops 6000 --optimizer adamw --optimizer-time"
timeout 160 $B --adapters lokr512 --batches 1 --time-budget-s 145 --out $OUT/lokr_b1.json > $OUT/lokr_b1.log 2>&1; echo "lokr b1 rc=$?"
timeout 105 $B --adapters lora64 --batches 1 --time-budget-s 90 --out $OUT/lora_b1.json > $OUT/lora_b1.log 2>&1; echo "lora b1 rc=$?"
timeout 115 $B --adapters lokr512 --batches 2 --time-budget-s 100 --out $OUT/lokr_b2.json > $OUT/lokr_b2.log 2>&1; echo "lokr b2 rc=$?"
timeout 115 $B --adapters lora64 --batches 2 --time-budget-s 100 --out $OUT/lora_b2.json > $OUT/lora_b2.log 2>&1; echo "lora b2 rc=$?"
grep -h '"step_ms"\|"error": "[^"]' $OUT/lokr_b1.log $OUT/lora_b1.log $OUT/lokr_b2.log $OUT/lora_b2.log | cut -c1-400
