#!/bin/bash
# Session 5, device call 2 (carry [".device_wheels"], ~9 min):
#   1. issue 6: 2B LoRA r64, 6000 frames, batch 2 and 3, CUDA graphs, with the step's next inputs
#      prepared during the backward (pinned) and one foreach zero of the gradient buffers
#      (160.66 ms / 2987.6 audio-s/s before; goal 3000 within 24 GB)
#   2. issue 6: XL LoRA r64 at batch 2 (batch 1: 217.75 ms, 1102 audio-s/s; goal 1200)
#   3. issue 6: the default recipe (LoKR 512, crop 1248, batch 1, grad_accum 4): fold 1 vs 4
#   4. issue 8: the compiled planner step with a multiplexed LoRA (timed out at 90 s last call)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
B="python3 bench/dit_bench.py --steps 5 --warmup 2 --compile reduce-overhead --adapters lora64 --crops 6000"
timeout 150 $B --time-budget-s 135 --models 2b --batches 2,3 --out $OUT/dit_2b_b23.json 2>&1 | grep '"step_ms"'
timeout 110 $B --time-budget-s 95 --models xl --batches 2 --out $OUT/dit_xl_b2.json 2>&1 | grep '"step_ms"'
F="python3 bench/dit_bench.py --steps 5 --warmup 2 --compile reduce-overhead --models 2b --adapters lokr512 --crops 1248 --batches 1 --grad-accum 4 --time-budget-s 60"
timeout 75 $F --fold 1 --out $OUT/dit_default_fold1.json 2>&1 | grep '"step_ms"'
timeout 75 $F --fold 4 --out $OUT/dit_default_fold4.json 2>&1 | grep '"step_ms"'
timeout 150 python3 bench/audition_bench.py --sections lm --decode-modes compiled --lm-adapter --lm-seconds 30 --lm-repeat 2 --no-check-eager --budget-s 140 --out $OUT/audition_lm_adapter.json > $OUT/lm.log 2>&1; echo "planner rc=$?"
grep -E '"section"|Traceback' $OUT/lm.log | cut -c1-700 | tail -4
