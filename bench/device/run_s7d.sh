#!/bin/bash
# Session 7, fourth call (issue 5), carry [".device_wheels"], ~4.5 min. The product defaults
# from pageable memory peaked at 8.10 GiB reserved (goal <= 8) with the codes stage's peak
# allocated at 4.77 GiB, and a float32 recheck in chunks of 480 windows did not move it: so it
# is pass 1's call of two 240 s songs. One song per audio-tokenizer call (6000 frames), then
# the current 12000 again, each in its own process.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
P="python3 bench/preprocess_bench.py --vae-paths fast-nhwc --vae-chunk 1536 --codes-pass tf32 --iters 5 --pageable-audio --budget-s 100"
for frames in 6000 12000; do
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 110 $P --codes-frames-per-call $frames --out $OUT/pre_codes_$frames.json > $OUT/pre_codes_$frames.log 2>&1; echo "frames $frames rc=$?"
done
python3 -c "
import json, os
for frames in (6000, 12000):
  for c in json.load(open(os.environ['OUT'] + '/pre_codes_%d.json' % frames))['cases']:
    print(frames, {k: c.get(k) for k in ('audio_s_per_gpu_s', 'batch_ms_all', 'peak_reserved_gib', 'peak_allocated_gib', 'stage_ms', 'stage_peak_allocated_gib', 'codes_rechecked', 'codes_mismatch_vs_fp32', 'meets_goal', 'error')})
" 2>&1 | cut -c1-3000
