#!/bin/bash
# Session 6, second call (carry [".device_wheels"], ~6 min):
#   1. issue 5: a sweep of the Oobleck Triton kernels' tiles on one encoder window's shapes (the
#      fused residual kernel ran at ~47% of the H200's bandwidth, the Snake at ~72%)
#   2. issue 5: the product defaults (overlap off, release auto = off under expandable segments,
#      fast sin), with and without a 7.5 GiB allocator cap
#   3. issue 8: codes -> WAV with the fast-sin Snake (240 s was 136.7 ms)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 200 python3 bench/oobleck_kernel_sweep.py --out $OUT/kernel_sweep.json 2> $OUT/sweep.err | cut -c1-900; echo "sweep rc=$?"
tail -3 $OUT/sweep.err
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 130 python3 bench/preprocess_bench.py --vae-paths fast-nhwc --vae-chunk 1536 --codes-pass tf32 --memory-cap-gib 0,7.5 --iters 3 --budget-s 115 --out $OUT/pre.json > $OUT/pre.log 2>&1; echo "preprocess rc=$?"
python3 -c "
import json, os
for c in json.load(open(os.environ['OUT'] + '/pre.json'))['cases']:
    print({k: c.get(k) for k in ('overlap', 'release_cache', 'memory_cap_gib', 'audio_s_per_gpu_s', 'batch_ms_all', 'peak_reserved_gib', 'peak_allocated_gib', 'stage_ms', 'outside_stages_ms', 'codes_mismatch_vs_fp32', 'error', 'skipped')})
" 2>&1 | cut -c1-1200
timeout 70 python3 bench/audition_bench.py --sections decode --vae-configs fast-nhwc --decode-seconds 30,240 --repeat 5 --budget-s 55 --out $OUT/audition_decode.json > $OUT/decode.log 2>&1; echo "decode rc=$?"
grep -E '"section"|Traceback' $OUT/decode.log | cut -c1-700 | tail -4
