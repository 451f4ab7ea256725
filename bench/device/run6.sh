#!/bin/bash
# Session 3, last seconds of device time: preprocessing with the new defaults (1536-frame
# windows, short tail, one window per forward, fused residual units, two songs per codes call).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 75 python3 bench/preprocess_bench.py --vae-paths fast-nhwc --vae-chunk 1536 --vae-batch-windows 1 --iters 2 --out $OUT/preprocess_defaults.json 2>&1 | tail -c 1500
