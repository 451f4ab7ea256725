#!/bin/bash
# Session 4, closing call: preprocessing at the product default (one 1536-frame window per VAE
# forward) with the cache released between stages, and the WAV step of codes -> WAV on its own.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 70 python3 bench/audition_bench.py --sections decode --vae-configs fast-nhwc --decode-seconds 240 --repeat 5 --budget-s 50 --out $OUT/audition_decode.json > $OUT/decode.log 2>&1; echo "decode rc=$?"; grep -oE '"(warm_s|reserved_after_warm_gib)": [0-9.]+|"(decode_to_tensor|codes_to_wav_bytes|wav_only)": \{"n": [0-9]+, "median_ms": [0-9.]+|"peak_reserved_gib": [0-9.]+|Traceback.*' $OUT/decode.log
timeout 80 python3 bench/preprocess_bench.py --vae-paths fast-nhwc --vae-chunk 1536 --vae-batch-windows 1 --release-cache on --iters 2 --budget-s 60 --out $OUT/preprocess_release.json > $OUT/pre.log 2>&1; echo "preprocess rc=$?"
python3 -c "
import json,os
for c in json.load(open(os.environ['OUT']+'/preprocess_release.json'))['cases']:
    print({k: c.get(k) for k in ('vae_batch_windows','release_cache','audio_s_per_gpu_s','peak_reserved_gib','reserved_after_batch_gib','stage_reserved_gib','stage_peak_allocated_gib','stage_ms','skipped')})
"
