#!/bin/bash
# First call of the next session (issue 6), ~7 min, carry [".device_wheels"]. Session 9 left LoKR
# 512 5.8-7.6% slower than LoRA r64 at batch 1 (94.73 vs 88.06-89.57 ms) and 2.6% at batch 2;
# its profiles put 2.90 ms of the batch-1 difference in the update (TF32 Newton-Schulz on the
# 512-wide w2 factors) and 1.68 ms in the forward and backward. Its AdamW LoKR row timed out
# compiling (the first process on a fresh machine, 85 s). The three rows in one call, each in
# its own process, 2B, 6000 frames, batch 1, CUDA graphs: LoKR with AdamW (first, with time to
# compile), LoKR with Muon, LoRA r64 with Muon.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
B="python3 bench/dit_bench.py --steps 12 --warmup 3 --compile reduce-overhead --models 2b --crops 6000 --batches 1 --optimizer-time"
timeout 160 $B --adapters lokr512 --optimizer adamw --time-budget-s 145 --out $OUT/lokr_adamw.json > $OUT/lokr_adamw.log 2>&1; echo "lokr adamw rc=$?"
timeout 110 $B --adapters lokr512 --time-budget-s 95 --out $OUT/lokr_muon.json > $OUT/lokr_muon.log 2>&1; echo "lokr muon rc=$?"
timeout 110 $B --adapters lora64 --time-budget-s 95 --out $OUT/lora_muon.json > $OUT/lora_muon.log 2>&1; echo "lora muon rc=$?"
grep -h '"step_ms"\|"error": "[^"]' $OUT/lokr_adamw.log $OUT/lokr_muon.log $OUT/lora_muon.log | cut -c1-400
