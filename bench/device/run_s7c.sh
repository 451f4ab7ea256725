#!/bin/bash
# Session 7, third call, carry [".device_wheels"], ~6.5 min:
#   1. issue 5: the product defaults as an encoder actor runs them (songs from pageable memory,
#      now staged one by one; the float32 codes recheck in chunks of 480 windows instead of
#      one call of ~1900, which took the peak reserved to 8.10 GiB). Then the same from pinned
#      memory, in its own process (the first case of a process is the real number).
#   2. issue 6: LoKR 512 at batch 2 with `--kron-compute autocast`, no profile (with one it ran
#      past 130 s; "master" took 202.35 ms per step in the same session).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
P="python3 bench/preprocess_bench.py --vae-paths fast-nhwc --vae-chunk 1536 --codes-pass tf32 --iters 5"
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 110 $P --pageable-audio --budget-s 100 --out $OUT/pre_pageable.json > $OUT/pre_pageable.log 2>&1; echo "pageable rc=$?"
timeout 170 python3 bench/dit_bench.py --steps 5 --warmup 2 --compile reduce-overhead --models 2b --crops 6000 --adapters lokr512 --batches 2 --time-budget-s 160 --kron-compute autocast --out $OUT/dit_lokr_autocast.json > $OUT/dit_autocast.log 2>&1; echo "autocast rc=$?"
grep '"step_ms"' $OUT/dit_autocast.log
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 110 $P --budget-s 100 --out $OUT/pre_pinned.json > $OUT/pre_pinned.log 2>&1; echo "pinned rc=$?"
python3 -c "
import json, os
for name in ('pre_pageable', 'pre_pinned'):
  for c in json.load(open(os.environ['OUT'] + '/' + name + '.json'))['cases']:
    print(name, {k: c.get(k) for k in ('staged_upload', 'audio_s_per_gpu_s', 'batch_ms_all', 'peak_reserved_gib', 'peak_allocated_gib', 'stage_ms', 'stage_peak_allocated_gib', 'codes_rechecked', 'codes_mismatch_vs_fp32', 'meets_goal', 'error')})
" 2>&1 | cut -c1-3000
