#!/bin/bash
# What session 5 left unmeasured, in priority order. One `run`, carry [".device_wheels"],
# ~9.5 min (the timeouts); JSON and logs land in $OUT.
#   1. issue 6: LoKR 512 vs LoRA r64 (75.5 M vs 81.8 M params) at batch 2, 6000 frames, CUDA
#      graphs: LoKR took 307 ms against LoRA's 154 ms. The w1 mix as a GEMM with K = 4 was the
#      LoKR step's largest kernel; time the pointwise mix (`--kron-mix pointwise`), with profile
#   2. issue 5: the preprocessing VAE's kernel profile at the product defaults (TF32 codes,
#      expandable segments): the VAE is 79 % of the batch and must get ~20 % faster for 2000
#   3. issue 8: the merged-adapter planner at 240 s (30 s measured: 276 codes/s)
#   4. issue 7: the 4B LM step with hybrid Muon (the recipe's optimizer; the goal rows used AdamW)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
B="python3 bench/dit_bench.py --steps 5 --warmup 2 --compile reduce-overhead --models 2b --adapters lokr512 --crops 6000 --batches 2"
timeout 130 $B --time-budget-s 115 --kron-mix pointwise --profile --out $OUT/dit_lokr_pointwise.json 2>&1 | grep '"step_ms"'
timeout 120 $B --time-budget-s 105 --kron-mix gemm --out $OUT/dit_lokr_gemm.json 2>&1 | grep '"step_ms"'
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 100 python3 bench/preprocess_bench.py --vae-paths fast-nhwc --vae-chunk 1536 --codes-pass tf32 --iters 2 --profile --budget-s 85 --out $OUT/pre_profile.json > $OUT/pre.log 2>&1; echo "preprocess rc=$?"
python3 -c "import json,os; c=json.load(open(os.environ['OUT']+'/pre_profile.json'))['cases'][0]; print({k: c.get(k) for k in ('audio_s_per_gpu_s','peak_reserved_gib','stage_ms','vae_top_kernels_ms')})" 2>&1 | cut -c1-1500
timeout 130 python3 bench/audition_bench.py --sections lm --decode-modes compiled --lm-adapter --lm-merge on --lm-seconds 240 --lm-repeat 1 --no-check-eager --budget-s 120 --out $OUT/audition_lm_240.json > $OUT/lm.log 2>&1; echo "planner rc=$?"
grep -E '"section"|Traceback' $OUT/lm.log | cut -c1-500 | tail -3
timeout 90 python3 bench/lm_bench.py --steps 8 --sizes 4B --configs song_ro_muon --out $OUT/lm_4b_muon 2>&1 | grep -E '^\| 4B|Error|Traceback' | cut -c1-300
