#!/bin/bash
# Session 5, device call 3 (carry [".device_wheels"], ~9 min):
#   1. issue 5: codes through a TF32 pass with float32 rechecks near FSQ boundaries (margin 0.02)
#      vs plain float32, each with and without an 8 GiB allocator cap (goals: 2000 audio-s per
#      GPU-s, <= 8 GiB per actor); codes must equal float32's (codes_mismatch_vs_fp32 = 0)
#   2. issue 8: the compiled planner with a merged LoRA (unmerged: 164.5 codes/s; base 276.4)
#   3. issue 6: the default recipe (LoKR 512, crop 1248, batch 1, grad_accum 4), fold 1 vs 4
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 150 python3 bench/preprocess_bench.py --vae-paths fast-nhwc --vae-chunk 1536 --codes-pass off,tf32 --codes-margin 0.02 --memory-cap-gib 0,8 --iters 2 --budget-s 135 --out $OUT/pre_codes.json > $OUT/pre.log 2>&1; echo "preprocess rc=$?"
python3 - <<'PY'
import json, os
try:
    for c in json.load(open(os.environ["OUT"] + "/pre_codes.json"))["cases"]:
        print({k: c.get(k) for k in ("codes_pass", "memory_cap_gib", "audio_s_per_gpu_s", "peak_reserved_gib", "peak_allocated_gib", "stage_reserved_gib", "stage_ms", "codes_rechecked_fraction", "codes_mismatch_vs_fp32", "codes_max_level_error", "skipped", "error")})
except Exception as exc:
    print("preprocess:", exc)
PY
tail -3 $OUT/pre.log | cut -c1-300
timeout 140 python3 bench/audition_bench.py --sections lm --decode-modes compiled --lm-adapter --lm-merge on --lm-seconds 30 --lm-repeat 2 --no-check-eager --budget-s 130 --out $OUT/audition_lm_merged.json > $OUT/lm.log 2>&1; echo "planner rc=$?"
grep -E '"section"|Traceback' $OUT/lm.log | cut -c1-600 | tail -3
F="python3 bench/dit_bench.py --steps 5 --warmup 2 --compile reduce-overhead --models 2b --adapters lokr512 --crops 1248 --batches 1 --grad-accum 4 --time-budget-s 110"
timeout 120 $F --fold 4 --out $OUT/dit_default_fold4.json 2>&1 | grep '"step_ms"'
timeout 120 $F --fold 1 --out $OUT/dit_default_fold1.json 2>&1 | grep '"step_ms"'
