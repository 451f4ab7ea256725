#!/bin/bash
# Session 5, device call 5 (carry [".device_wheels"]): the same with expandable allocator
# segments (what GPU encoder processes now start with, `preprocess.items.allocator_env`).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 110 python3 bench/preprocess_bench.py --vae-paths fast-nhwc --vae-chunk 1536 --codes-pass tf32 --codes-margin 0.02 --memory-cap-gib 0 --iters 2 --budget-s 90 --out $OUT/pre_exp.json > $OUT/pre.log 2>&1
