#!/bin/bash
# What session 5 left unmeasured, in priority order. One `run`, carry [".device_wheels"],
# ~9.5 min (the timeouts); JSON and logs land in $OUT.
#   1. issue 6: LoKR 512 vs LoRA r64 (75.5 M vs 81.8 M params) at batch 2, 6000 frames, CUDA
#      graphs: LoKR took 307 ms against LoRA's 154 ms. The w1 mix as a GEMM with K = 4 (and its
#      transpose copy) was the LoKR step's largest kernel; time the pointwise mix (with the
#      step's profile), the "ordered" one (w1 first where that shrinks the w2 GEMM) and the GEMM
#      mix again, one after the other. The fastest becomes `adapters.KRON_MIX`
#   2. issue 5: the preprocessing VAE's kernel profile at the product defaults (TF32 codes,
#      expandable segments), and the same without releasing the cache between stages: a batch
#      took 1135 ms of which the stages 1030, and with expandable segments the release may be
#      what costs (2000 audio-s per GPU-s needs 960 ms)
# Then next_run2.sh.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
B="python3 bench/dit_bench.py --steps 5 --warmup 2 --compile reduce-overhead --models 2b --adapters lokr512 --crops 6000 --batches 2"
timeout 130 $B --time-budget-s 115 --kron-mix pointwise --profile --out $OUT/dit_lokr_pointwise.json 2>&1 | grep '"step_ms"'
timeout 125 $B --time-budget-s 110 --kron-mix ordered --out $OUT/dit_lokr_ordered.json 2>&1 | grep '"step_ms"'
timeout 120 $B --time-budget-s 105 --kron-mix gemm --out $OUT/dit_lokr_gemm.json 2>&1 | grep '"step_ms"'
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 140 python3 bench/preprocess_bench.py --vae-paths fast-nhwc --vae-chunk 1536 --codes-pass tf32 --release-cache on,off --iters 3 --profile --budget-s 125 --out $OUT/pre_profile.json > $OUT/pre.log 2>&1; echo "preprocess rc=$?"
python3 -c "
import json, os
for c in json.load(open(os.environ['OUT'] + '/pre_profile.json'))['cases']:
    print({k: c.get(k) for k in ('release_cache', 'audio_s_per_gpu_s', 'batch_ms_all', 'peak_reserved_gib', 'stage_ms', 'outside_stages_ms', 'encode_profile', 'vae_top_kernels_ms', 'error')})
" 2>&1 | cut -c1-4000
