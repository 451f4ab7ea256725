#!/bin/bash
# Session 9, call 1 (issue 6), ~9.5 min, carry [".device_wheels"]. LoKR 512 is 7.2% slower than
# LoRA r64 at batch 1 (94.96 vs 88.62 ms, tenth run). Where the difference goes, and whether
# Inductor's GEMM autotuning (Triton templates, with the pointwise build of W + ΔW fusable into
# a template's prologue) changes it:
#   1-2. LoKR 512 and LoRA r64, batch 1, profiled (40 largest kernels, their call counts)
#   3-4. the same two rows with TORCHINDUCTOR_MAX_AUTOTUNE_GEMM=1 (LoKR profiled too)
# 2B, 6000 frames, CUDA graphs, each row in its own process.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
B="python3 bench/dit_bench.py --steps 8 --warmup 3 --compile reduce-overhead --models 2b --crops 6000 --batches 1"
timeout 125 $B --adapters lokr512 --profile --profile-top 40 --time-budget-s 110 --out $OUT/lokr_prof.json > $OUT/lokr_prof.log 2>&1; echo "lokr prof rc=$?"
timeout 115 $B --adapters lora64 --profile --profile-top 40 --time-budget-s 100 --out $OUT/lora_prof.json > $OUT/lora_prof.log 2>&1; echo "lora prof rc=$?"
TORCHINDUCTOR_MAX_AUTOTUNE_GEMM=1 timeout 200 $B --adapters lokr512 --profile --profile-top 25 --time-budget-s 185 --out $OUT/lokr_at.json > $OUT/lokr_at.log 2>&1; echo "lokr autotune rc=$?"
TORCHINDUCTOR_MAX_AUTOTUNE_GEMM=1 timeout 120 $B --adapters lora64 --time-budget-s 105 --out $OUT/lora_at.json > $OUT/lora_at.log 2>&1; echo "lora autotune rc=$?"
grep -h '"step_ms"\|"error": "[^"]' $OUT/lokr_prof.log $OUT/lora_prof.log $OUT/lokr_at.log $OUT/lora_at.log | cut -c1-400
