#!/bin/bash
# Session 9, call 2 (issue 6), ~7 min, carry [".device_wheels"]. Call 1's profile (run_s9a.sh):
# LoKR's w1 gradient, a batched GEMM of one [a, b] @ [b, c] per token, ran as 16x16 sm80 WMMA
# kernels, 5.39 + 0.70 ms of a 96 ms batch-1 step. `kron_kernels.pair_sums`, one Triton pass:
#   1. the kernel against the batched GEMM on the 2B / XL shapes (bench/kron_kernel_bench.py)
#   2. LoKR 512 batch 1 (profiled: 25 largest kernels) and batch 2, 2B, 6000 frames, CUDA graphs
#   3. LoRA r64 batch 2 in the same call, to compare with (call 1 gave LoRA batch 1: 88.06 ms)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 90 python3 bench/kron_kernel_bench.py --out $OUT/kron_kernel.json 2>&1 | cut -c1-400
B="python3 bench/dit_bench.py --steps 12 --warmup 3 --compile reduce-overhead --models 2b --crops 6000 --optimizer-time"
timeout 130 $B --adapters lokr512 --batches 1 --profile --profile-top 25 --time-budget-s 115 --out $OUT/lokr_b1.json > $OUT/lokr_b1.log 2>&1; echo "lokr b1 rc=$?"
timeout 120 $B --adapters lokr512 --batches 2 --time-budget-s 105 --out $OUT/lokr_b2.json > $OUT/lokr_b2.log 2>&1; echo "lokr b2 rc=$?"
timeout 110 $B --adapters lora64 --batches 2 --time-budget-s 95 --out $OUT/lora_b2.json > $OUT/lora_b2.log 2>&1; echo "lora b2 rc=$?"
grep -h '"step_ms"\|"error": "[^"]\|w1-gradient' $OUT/lokr_b1.log $OUT/lokr_b2.log $OUT/lora_b2.log | cut -c1-400
