#!/bin/bash
# What session 4 built but could not measure, in priority order. One `run`, carry
# [".device_wheels"], ~9 min (the timeouts); JSON and logs land in $OUT.
#   1. issue 8: codes -> WAV with the tail window (240 s was 154 ms with 114.6 ms of decode, goal
#      150), the WAV step alone (`wav_only`), once more with huge pages for glibc's large
#      allocations, and reserved memory on a warmed decoder
#   2. issue 5: preprocessing at the product default (one 1536-frame window per forward) with the
#      cache released between stages, per-stage reserved memory (goal <= 8 GiB per actor)
#   3. issue 6: 2B LoRA r64 at batch 2 and 3 with CUDA graphs at 6000 frames (goal 3000 audio-s/s
#      within 24 GB) with the batch-2 step's kernel profile (where the other 25% must come from),
#      then XL with CUDA graphs (goal 1200)
#   4. issue 8: the compiled planner step with a multiplexed LoRA (the goal holds "with adapters")
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 70 python3 bench/audition_bench.py --sections decode --vae-configs fast-nhwc --decode-seconds 30,240 --repeat 5 --budget-s 50 --out $OUT/audition_decode.json > $OUT/decode.log 2>&1; echo "decode rc=$?"
grep -oE '"(seconds|warm_s|reserved_after_warm_gib)": [0-9.]+|"(decode_to_tensor|codes_to_wav_bytes|wav_only)": \{"n": [0-9]+, "median_ms": [0-9.]+|"peak_reserved_gib": [0-9.]+|Traceback.*' $OUT/decode.log
# the same with transparent huge pages for glibc's large allocations: if the WAV step's time is
# page faults of the fresh 46 MB `bytes`, this cuts it (a Serve runtime_env setting if it does)
GLIBC_TUNABLES=glibc.malloc.hugetlb=1 timeout 60 python3 bench/audition_bench.py --sections decode --vae-configs fast-nhwc --decode-seconds 240 --repeat 5 --budget-s 40 --out $OUT/audition_decode_thp.json > $OUT/decode_thp.log 2>&1; echo "decode thp rc=$?"
grep -oE '"(codes_to_wav_bytes|wav_only)": \{"n": [0-9]+, "median_ms": [0-9.]+' $OUT/decode_thp.log
timeout 90 python3 bench/preprocess_bench.py --vae-paths fast-nhwc --vae-chunk 1536 --release-cache on,off --iters 2 --budget-s 75 --out $OUT/preprocess_release.json > $OUT/pre.log 2>&1; echo "preprocess rc=$?"
B="python3 bench/dit_bench.py --steps 5 --warmup 2 --compile reduce-overhead"
timeout 130 $B --time-budget-s 110 --models 2b --adapters lora64 --crops 6000 --batches 2,3 --profile --out $OUT/dit_2b_ro.json 2>&1 | grep '"step_ms"'
python3 -c "import json,os; r=json.load(open(os.environ['OUT']+'/dit_2b_ro.json'))['rows'][0]; print(json.dumps(r.get('profile')))" 2>&1 | cut -c1-1500
timeout 110 $B --time-budget-s 95 --models xl --adapters lora64 --crops 6000 --batches 1 --out $OUT/dit_xl_ro.json 2>&1 | grep '"step_ms"'
timeout 90 python3 bench/audition_bench.py --sections lm --decode-modes compiled --lm-adapter --lm-seconds 30 --lm-repeat 2 --no-check-eager --budget-s 80 --out $OUT/audition_lm_adapter.json > $OUT/lm.log 2>&1; echo "planner rc=$?"
grep -E '"section"|Traceback' $OUT/lm.log | cut -c1-500 | tail -4
python3 - <<'PY'
import json, os
out = os.environ["OUT"]
try:
    for c in json.load(open(f"{out}/preprocess_release.json"))["cases"]:
        print({k: c.get(k) for k in ("vae_batch_windows", "release_cache", "audio_s_per_gpu_s", "peak_reserved_gib", "reserved_after_batch_gib", "stage_reserved_gib", "stage_ms", "skipped")})
except Exception as exc:
    print("preprocess:", exc)
PY
