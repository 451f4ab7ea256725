#!/bin/bash
# Session 9, call 3 (issue 6), ~9.5 min, carry [".device_wheels"]. Call 2 (run_s9b.sh): the
# Triton w1-gradient kernel took 2.37 ms per batch-1 step, but the torch sum of its partials
# inside the op another 2.25 ms. Now the op returns the partials (2-4 column spans per token
# block: more programs) and the caller's sum fuses with its scale and cast.
#   1. the kernel against the batched GEMM (bench/kron_kernel_bench.py)
#   2. LoKR 512 batch 1 (profiled) and batch 2, 2B, 6000 frames, CUDA graphs
#   3. rows measured before session 8's one-graph fix: the recipe's default path (LoKR 512,
#      crop 1248, batch 1, grad_accum 4 folded; was 116.03 ms, 1720.9 audio-s/s) and 750-frame
#      crops (LoRA r64, batch 8; was 116.1 ms, 2066.7 audio-s/s)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 60 python3 bench/kron_kernel_bench.py --out $OUT/kron_kernel.json 2>&1 | cut -c1-300
B="python3 bench/dit_bench.py --steps 12 --warmup 3 --compile reduce-overhead --models 2b --optimizer-time"
timeout 120 $B --crops 6000 --adapters lokr512 --batches 1 --profile --profile-top 25 --time-budget-s 105 --out $OUT/lokr_b1.json > $OUT/lokr_b1.log 2>&1; echo "lokr b1 rc=$?"
timeout 105 $B --crops 6000 --adapters lokr512 --batches 2 --time-budget-s 90 --out $OUT/lokr_b2.json > $OUT/lokr_b2.log 2>&1; echo "lokr b2 rc=$?"
timeout 120 $B --adapters lokr512 --crops 1248 --batches 1 --grad-accum 4 --fold 4 --time-budget-s 105 --out $OUT/dit_recipe.json > $OUT/recipe.log 2>&1; echo "recipe rc=$?"
timeout 120 $B --adapters lora64 --crops 750 --batches 8 --time-budget-s 105 --out $OUT/dit_750.json > $OUT/750.log 2>&1; echo "750 rc=$?"
grep -h '"step_ms"\|"error": "[^"]\|w1-gradient' $OUT/lokr_b1.log $OUT/lokr_b2.log $OUT/recipe.log $OUT/750.log | cut -c1-400
