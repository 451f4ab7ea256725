#!/bin/bash
# GPU session 2, call 3: fast Oobleck decode, LM CUDA-graph decode, DiT host-time breakdown.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
python3 -c "import triton; print('triton', triton.__version__)"
timeout 150 python3 bench/audition_bench.py --sections decode --vae-configs old,fast,fast-nhwc --repeat 5 --profile --budget-s 120 --out $OUT/audition_decode_fast.json 2>&1 | tail -c 2500
timeout 170 python3 bench/audition_bench.py --sections lm --decode-modes graph,eager --lm-seconds 30,240 --eager-max-seconds 30 --lm-repeat 2 --budget-s 140 --out $OUT/audition_lm_graph.json 2>&1 | tail -c 2500
timeout 150 python3 bench/dit_bench.py --models 2b --adapters lora64 --crops 6000 --batches 1 --compile reduce-overhead --steps 5 --warmup 2 --profile --time-budget-s 120 --out $OUT/r3_dit_ro.json 2>&1 | grep '"step_ms"' | cut -c1-250
