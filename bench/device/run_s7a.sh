#!/bin/bash
# Session 7, first call (planned in session 6 as next_run.sh), in priority order. One `run`, carry [".device_wheels"],
# ~8.5 min (issue 5 only); JSON and logs land in $OUT.
#   1. issue 5: where the preprocessing batch's GPU idles. At the defaults a batch takes
#      979-1009 ms for ~880 ms of stage GPU work (VAE 739, codes 123, conditions ~20): the
#      profile of one whole batch (GPU busy vs wall, top host calls) in the new stage order.
#      2000 audio-s per GPU-s needs 960 ms. Landed since that run, unmeasured: one float32
#      codes recheck per batch (one sync instead of three per tokenizer call), and the batch's
#      results copied to pinned memory with one wait (instead of ~24 waiting copies). Then
#      the VAE's dilated convs as undilated ones over a view
#      (`OobleckFastOptions.dilated_as_rows`), and cuDNN autotuning all algorithms. A faster
#      one becomes the default.
#   2. issue 5: songs from pageable memory (what an encoder actor gets from Ray Data; the bench
#      pins them by default), sent all at once vs one by one on a side stream
#      (`EncoderSettings.staged_upload`). Faster becomes the default.
# Then next_run2.sh.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 130 python3 bench/preprocess_bench.py --vae-paths fast-nhwc --vae-chunk 1536 --codes-pass tf32 --iters 3 --profile --budget-s 115 --out $OUT/pre_profile.json > $OUT/pre.log 2>&1; echo "preprocess rc=$?"
# Two ways at the VAE's sm80 convolution kernels (216 of ~420 ms of conv kernels), each in
# its own process (cuDNN's algorithm cache is per process): the dilated convs as undilated
# ones over a view (fast-rows, with the VAE's kernel profile), and cuDNN autotuning every
# algorithm instead of its top 10
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 100 python3 bench/preprocess_bench.py --vae-paths fast-rows --vae-chunk 1536 --codes-pass tf32 --iters 3 --profile --budget-s 90 --out $OUT/pre_rows.json > $OUT/pre_rows.log 2>&1; echo "rows rc=$?"
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 100 python3 bench/preprocess_bench.py --vae-paths fast-nhwc --vae-chunk 1536 --codes-pass tf32 --iters 3 --cudnn-benchmark-limit 0 --budget-s 90 --out $OUT/pre_cudnn_all.json > $OUT/pre_cudnn.log 2>&1; echo "cudnn-all rc=$?"
# songs from pageable memory, as Ray Data hands them to an encoder actor (the rows above are
# pinned): all at once, then one by one on a side stream (`EncoderSettings.staged_upload`)
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 130 python3 bench/preprocess_bench.py --vae-paths fast-nhwc --vae-chunk 1536 --codes-pass tf32 --iters 3 --pageable-audio --staged-upload off,on --budget-s 120 --out $OUT/pre_staged.json > $OUT/pre_staged.log 2>&1; echo "staged rc=$?"
python3 -c "
import json, os
for name in ('pre_profile', 'pre_rows', 'pre_cudnn_all', 'pre_staged'):
  for c in json.load(open(os.environ['OUT'] + '/' + name + '.json'))['cases']:
    print(name, {k: c.get(k) for k in ('vae', 'staged_upload', 'audio_s_per_gpu_s', 'batch_ms_all', 'peak_reserved_gib', 'stage_ms', 'outside_stages_ms', 'max_abs_mean_diff_vs_first_case', 'encode_profile', 'vae_top_kernels_ms', 'error')})
" 2>&1 | cut -c1-6000
