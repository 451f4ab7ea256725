#!/bin/bash
# Session 3, one measurement call (`run`, carry [".device_wheels"], ~7 min): LoKR with the graph
# break gone, CUDA-graph DiT at 750-frame crops, VAE encode chunk sweep with the fused residual
# unit on/off, decode with/without it, and where the planner LM's time goes.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
B="python3 bench/dit_bench.py --steps 5 --warmup 2 --time-budget-s 75"
timeout 90 $B --models 2b --adapters lokr512 --crops 6000 --batches 1,2 --compile reduce-overhead --profile --out $OUT/dit_lokr_ro.json 2>&1 | grep '"step_ms"'
timeout 110 python3 bench/preprocess_bench.py --vae-paths fast-nhwc,fast-nofuse --vae-chunk 384,1536 --vae-batch-windows 2 --iters 2 --profile --budget-s 95 --out $OUT/preprocess_sweep.json 2>&1 | tail -c 300
timeout 100 python3 bench/audition_bench.py --sections decode,lm --vae-configs fast-nhwc,fast-nofuse --decode-seconds 30,240 --repeat 5 --decode-modes graph --lm-seconds 30 --lm-repeat 2 --lm-profile --no-check-eager --budget-s 85 --out $OUT/audition_run5.json 2>&1 | tail -c 300
timeout 85 $B --models 2b --adapters lora64 --crops 750 --batches 8,16 --compile reduce-overhead --out $OUT/dit_750_ro.json 2>&1 | grep '"step_ms"'
