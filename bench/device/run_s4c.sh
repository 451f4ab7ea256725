#!/bin/bash
# Session 4, last call: the planner's compiled decode (issue 8), the codes -> WAV path with the
# warmed tile graph and pinned WAV transfer (issue 8), preprocessing with the cache released
# between stages (issue 5), and the 4B LM step with an 80 % activation budget (issue 7).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 170 python3 bench/audition_bench.py --sections lm --decode-modes compiled --lm-seconds 30,240 --lm-repeat 2 --budget-s 150 --out $OUT/audition_lm_compiled.json > $OUT/lm.log 2>&1; echo "planner rc=$?"; grep -E '"section"|Error|Traceback' $OUT/lm.log | cut -c1-600 | tail -8
timeout 80 python3 bench/audition_bench.py --sections decode --vae-configs fast-nhwc --decode-seconds 30,240 --repeat 5 --budget-s 60 --out $OUT/audition_decode.json > $OUT/decode.log 2>&1; echo "decode rc=$?"; grep -oE '"(seconds|warm_s|reserved_after_warm_gib)": [0-9.]+|"(decode_to_tensor|codes_to_wav_bytes)": \{"n": [0-9]+, "median_ms": [0-9.]+|"peak_reserved_gib": [0-9.]+|Traceback.*' $OUT/decode.log
timeout 130 python3 bench/preprocess_bench.py --vae-paths fast-nhwc --vae-chunk 1536 --release-cache on,off --iters 2 --budget-s 100 --out $OUT/preprocess_release.json > $OUT/pre.log 2>&1; echo "preprocess rc=$?"; tail -c 300 $OUT/pre.log
timeout 90 python3 bench/lm_bench.py --steps 8 --sizes 4B --configs song_ro --activation-budget 0.8 --out $OUT/lm_4b_b80 2>&1 | grep -E '^\| 4B|Error|Traceback' | cut -c1-300
python3 - <<'PY'
import json, os
out = os.environ["OUT"]
try:
    for c in json.load(open(f"{out}/preprocess_release.json"))["cases"]:
        print({k: c.get(k) for k in ("release_cache", "audio_s_per_gpu_s", "peak_reserved_gib", "reserved_after_batch_gib", "stage_reserved_gib", "stage_ms", "skipped")})
except Exception as e: print("preprocess", e)
try:
    for r in json.load(open(f"{out}/lm_4b_b80/lm_bench.json"))["results"]:
        print({k: r.get(k) for k in ("config", "ms_step", "mfu_at_790", "peak_gib", "reserved_gib", "activation_budget", "error")})
except Exception as e: print("lm", e)
PY
