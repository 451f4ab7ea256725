#!/bin/bash
# Session 4, first call: what session 3 built but could not measure, in priority order.
# One `run`, carry [".device_wheels"], ~9 min; JSON lands in $OUT. Then, one `run` each:
#   bash bench/device/lm_compile_run.sh   (issue 7: compiled LM layers, ~7 min)
#   bash bench/device/lm_decode_run.sh    (issue 8: compiled planner decode step, <= 9.5 min)
#   bash bench/device/calibrate_run.sh    (issue 12: seeds decoded together + DiT batch 3, ~5 min)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# issue 5: the new defaults (1536-frame windows + short tail, one window per forward, codes calls
# of two songs) against 384-frame windows; reserved memory per case is now the case's own
timeout 120 python3 bench/preprocess_bench.py --vae-paths fast-nhwc --vae-chunk 1536,384 --vae-batch-windows 1,4 --iters 2 --budget-s 100 --out $OUT/preprocess_defaults.json 2>&1 | tail -c 400
# issue 8: 240 s decode reserved memory after returning the warm-up's side-stream cache
timeout 80 python3 bench/audition_bench.py --sections decode --vae-configs fast-nhwc --decode-seconds 30,240 --repeat 5 --budget-s 60 --out $OUT/audition_decode.json 2>&1 | tail -c 300
# issue 6: CUDA graphs with gradient accumulation (the trainer's default grad_accum 4) must give
# the eager run's losses step by step (the "losses" field of both rows; bf16 rounding only)
A="python3 bench/dit_bench.py --models 2b --adapters lora64 --crops 1504 --batches 2 --grad-accum 4 --steps 3 --warmup 2"
timeout 45 $A --compile none --out $OUT/dit_accum_eager.json 2>&1 | grep '"step_ms"'
timeout 100 $A --compile reduce-overhead --out $OUT/dit_accum_ro.json 2>&1 | grep '"step_ms"'
# issue 6: the auto mode (CUDA graphs) for LoKR at batch 2, and XL
B="python3 bench/dit_bench.py --steps 5 --warmup 2 --time-budget-s 90"
timeout 100 $B --models 2b --adapters lokr512,lora64 --crops 6000 --batches 2 --compile reduce-overhead --out $OUT/dit_b2_ro.json 2>&1 | grep '"step_ms"'
timeout 100 $B --models xl --adapters lora64 --crops 6000 --batches 1,2 --compile reduce-overhead --out $OUT/dit_xl_ro.json 2>&1 | grep '"step_ms"'
