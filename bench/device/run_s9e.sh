#!/bin/bash
# Session 9, call 5 (issue 6), ~3.5 min, carry [".device_wheels"]. How much of LoKR's remaining
# batch-1 gap to LoRA is the optimizer's: Muon orthogonalises LoKR's 512-wide square w2 factors
# (0.95 TFLOP of Newton-Schulz per step, arithmetic) where LoRA r64's factors are 64 wide. The
# same two rows with AdamW, whose update costs the same per parameter for both adapters.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
B="python3 bench/dit_bench.py --steps 10 --warmup 3 --compile reduce-overhead --models 2b --crops 6000 --batches 1 --optimizer adamw --optimizer-time"
timeout 85 $B --adapters lokr512 --time-budget-s 72 --out $OUT/lokr_adamw.json > $OUT/lokr_adamw.log 2>&1; echo "lokr adamw rc=$?"
timeout 80 $B --adapters lora64 --time-budget-s 67 --out $OUT/lora_adamw.json > $OUT/lora_adamw.log 2>&1; echo "lora adamw rc=$?"
grep -h '"step_ms"\|"error": "[^"]' $OUT/lokr_adamw.log $OUT/lora_adamw.log | cut -c1-400
