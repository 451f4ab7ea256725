#!/bin/bash
# Session 6, fourth call (carry [".device_wheels"], ~3.5 min), issue 5: the product defaults
# after the stage reordering (the VAE's work only queued, the conditions launched behind it,
# noise and token ids through pinned memory, one sync for the NaN check and one for the
# conditions' counts), twice in two processes for the spread.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
show() { python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
for c in d['cases']:
    print({k: c.get(k) for k in ('overlap', 'release_cache', 'audio_s_per_gpu_s', 'batch_ms_all', 'peak_reserved_gib', 'stage_ms', 'outside_stages_ms', 'codes_mismatch_vs_fp32', 'finite_latents', 'error', 'skipped')})
" $1 2>&1 | cut -c1-900; }
P="python3 bench/preprocess_bench.py --vae-paths fast-nhwc --vae-chunk 1536 --codes-pass tf32 --iters 4"
for run in 1 2; do
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 95 $P --budget-s 85 --out $OUT/pre_$run.json > $OUT/pre_$run.log 2>&1; echo "run $run rc=$?"; show $OUT/pre_$run.json
done
