#!/bin/bash
# Session 6, third call (carry [".device_wheels"], ~6 min), issue 5:
#   1. the fused residual kernel's tile sweep on one encoder window's shapes
#   2. the product defaults (overlap off, release auto = off under expandable segments, fast
#      sin, the swept Snake configs) with the committed residual tiles, then with the sweep's
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 170 python3 bench/oobleck_kernel_sweep.py --kernels residual --out $OUT/residual_sweep.json 2> $OUT/sweep.err | cut -c1-700; echo "sweep rc=${PIPESTATUS[0]}"
tail -2 $OUT/sweep.err
show() { python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
print(d.get('kernel_sweep_applied'), d.get('residual_tiles'))
for c in d['cases']:
    print({k: c.get(k) for k in ('overlap', 'release_cache', 'audio_s_per_gpu_s', 'batch_ms_all', 'peak_reserved_gib', 'stage_ms', 'outside_stages_ms', 'codes_mismatch_vs_fp32', 'error', 'skipped')})
" $1 2>&1 | cut -c1-900; }
P="python3 bench/preprocess_bench.py --vae-paths fast-nhwc --vae-chunk 1536 --codes-pass tf32 --iters 3"
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 110 $P --budget-s 100 --out $OUT/pre_base.json > $OUT/pre_base.log 2>&1; echo "base rc=$?"; show $OUT/pre_base.json
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 110 $P --budget-s 100 --kernel-sweep $OUT/residual_sweep.json --out $OUT/pre_swept.json > $OUT/pre_swept.log 2>&1; echo "swept rc=$?"; show $OUT/pre_swept.json
