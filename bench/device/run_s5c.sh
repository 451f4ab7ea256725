#!/bin/bash
# Session 5, device call 4 (carry [".device_wheels"]): the TF32 codes pass with an 8 GiB
# allocator cap, then without (after the cap's device-index fix).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 185 python3 bench/preprocess_bench.py --vae-paths fast-nhwc --vae-chunk 1536 --codes-pass tf32 --codes-margin 0.02 --memory-cap-gib 8,0 --iters 2 --budget-s 140 --out $OUT/pre_codes.json > $OUT/pre.log 2>&1
