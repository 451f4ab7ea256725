#!/bin/bash
# Session 6, first call (carry [".device_wheels"], ~8 min):
#   1. issue 5 at the product defaults (expandable segments, so no cache release; TF32 codes,
#      margin 0.02): the conditions beside the VAE (auto = from the 2nd batch) vs not, and the
#      Snake kernels' fast sin vs libdevice's
#   2. issue 6: LoKR 512 at batch 2, 6000 frames, "ordered" mix (214 ms last run) with the
#      step's kernel profile, and the same with the batched-GEMM w1 gradient
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout 200 python3 bench/preprocess_bench.py --vae-paths fast-nhwc --vae-chunk 1536 --codes-pass tf32 --overlap auto,off --snake-sin fast,accurate --iters 3 --budget-s 185 --out $OUT/pre.json > $OUT/pre.log 2>&1; echo "preprocess rc=$?"
python3 -c "
import json, os
for c in json.load(open(os.environ['OUT'] + '/pre.json'))['cases']:
    print({k: c.get(k) for k in ('overlap', 'snake_sin', 'audio_s_per_gpu_s', 'batch_ms_all', 'peak_reserved_gib', 'stage_ms', 'outside_stages_ms', 'codes_rechecked_fraction', 'codes_mismatch_vs_fp32', 'max_abs_mean_diff_vs_first_case', 'error', 'skipped')})
" 2>&1 | cut -c1-1500
grep -E "Traceback|Error" $OUT/pre.log | head -5
B="python3 bench/dit_bench.py --steps 5 --warmup 2 --compile reduce-overhead --models 2b --adapters lokr512 --crops 6000 --batches 2 --kron-mix ordered"
timeout 160 $B --time-budget-s 145 --kron-w1-grad gemm --profile --out $OUT/dit_ordered_profile.json > $OUT/dit1.log 2>&1; echo "dit1 rc=$?"
grep '"step_ms"' $OUT/dit1.log
python3 -c "
import json, os
r = json.load(open(os.environ['OUT'] + '/dit_ordered_profile.json'))['rows'][0]
print(json.dumps(r.get('profile'))[:3500])
" 2>&1
timeout 120 $B --time-budget-s 105 --kron-w1-grad bmm --out $OUT/dit_ordered_bmm.json 2>&1 | grep '"step_ms"'
