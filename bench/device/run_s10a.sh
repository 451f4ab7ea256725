#!/bin/bash
# Session 10, first call (issue 6; written as next_run.sh in session 9), ~5 min, carry
# [".device_wheels"]. Session 9 made the
# CUDA-graph step's gradients views of one flat buffer (`training/flat_grads.py`, `dit.FLAT_GRADS`),
# so the clip and the zeroing are a few kernels instead of lists of 528 tensors (the clip phase
# of a batch-1 step took 3.7 ms with LoRA r64 and 5.6 ms with LoKR 512; on the CPU torch's clip
# over 528 gradients is 1.6 ms of host time, the flat one 0.035 ms). Not yet measured on a GPU.
# A/B in one call, 2B, 6000 frames, batch 1, CUDA graphs, hybrid Muon, each row in its own
# process (the first one with time to compile on a fresh machine):
#   LoKR 512 flat, LoKR 512 --no-flat-grads, LoRA r64 flat, LoRA r64 --no-flat-grads
# Session 9's rows without it: LoKR 94.73 ms, LoRA 88.06 / 89.57 ms.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
B="python3 bench/dit_bench.py --steps 12 --warmup 3 --compile reduce-overhead --models 2b --crops 6000 --batches 1 --optimizer-time"
timeout 160 $B --adapters lokr512 --time-budget-s 145 --out $OUT/lokr_flat.json > $OUT/lokr_flat.log 2>&1; echo "lokr flat rc=$?"
timeout 110 $B --adapters lokr512 --no-flat-grads --time-budget-s 95 --out $OUT/lokr_lists.json > $OUT/lokr_lists.log 2>&1; echo "lokr lists rc=$?"
timeout 110 $B --adapters lora64 --time-budget-s 95 --out $OUT/lora_flat.json > $OUT/lora_flat.log 2>&1; echo "lora flat rc=$?"
timeout 110 $B --adapters lora64 --no-flat-grads --time-budget-s 95 --out $OUT/lora_lists.json > $OUT/lora_lists.log 2>&1; echo "lora lists rc=$?"
grep -h '"step_ms"\|"error": "[^"]' $OUT/lokr_flat.log $OUT/lokr_lists.log $OUT/lora_flat.log $OUT/lora_lists.log | cut -c1-400
