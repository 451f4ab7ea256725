#!/bin/bash
# Session 7, fifth call (issue 5), carry [".device_wheels"], ~4 min: the product defaults as
# committed (one 240 s song per audio-tokenizer call, songs staged one by one), from pageable
# memory (an encoder actor's input) and from pinned memory, each in its own process.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
P="python3 bench/preprocess_bench.py --vae-paths fast-nhwc --vae-chunk 1536 --codes-pass tf32 --iters 5 --budget-s 100"
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 110 $P --pageable-audio --out $OUT/pre_final_pageable.json > $OUT/pre_final_pageable.log 2>&1; echo "pageable rc=$?"
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 110 $P --out $OUT/pre_final_pinned.json > $OUT/pre_final_pinned.log 2>&1; echo "pinned rc=$?"
python3 -c "
import json, os
for name in ('pre_final_pageable', 'pre_final_pinned'):
  d = json.load(open(os.environ['OUT'] + '/' + name + '.json'))
  for c in d['cases']:
    print(name, d.get('codes_frames_per_call'), {k: c.get(k) for k in ('staged_upload', 'audio_s_per_gpu_s', 'batch_ms_all', 'peak_reserved_gib', 'peak_allocated_gib', 'stage_ms', 'codes_rechecked', 'codes_mismatch_vs_fp32', 'meets_goal', 'error')})
" 2>&1 | cut -c1-3000
