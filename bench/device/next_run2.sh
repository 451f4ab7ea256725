#!/bin/bash
# Second call of the next session (after next_run.sh), ~9 min, carry [".device_wheels"]:
#   1. issue 8: the merged-adapter planner at 240 s (30 s measured: 276 codes/s; base 255 at 240 s)
#   2. issue 8: p50/p99 of codes -> audio under 8 and 32 concurrent clients on one warmed fast
#      decoder (last measured with the first, plain decoder: 418 / 1676 ms p50)
#   3. issue 6: 2B LoRA r64 at batch 3, 6000 frames (batch 2: 3124.5 audio-s/s in 20.3 GiB)
#   4. issue 6: the LoKR 512 step's kernel profile at batch 2 (what is left beyond the
#      arithmetic bound); set `--kron-compute` to next_run.sh's faster mode first
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 140 python3 bench/audition_bench.py --sections lm --decode-modes compiled --lm-adapter --lm-merge on --lm-seconds 240 --lm-repeat 1 --no-check-eager --budget-s 130 --out $OUT/audition_lm_240.json > $OUT/lm.log 2>&1; echo "planner rc=$?"
grep -E '"section"|Traceback' $OUT/lm.log | cut -c1-500 | tail -3
timeout 90 python3 bench/audition_bench.py --sections decode-load --load-vae-config fast-nhwc --clients 8,32 --budget-s 80 --out $OUT/audition_load.json > $OUT/load.log 2>&1; echo "load rc=$?"
grep -E '"section"|Traceback' $OUT/load.log | cut -c1-400 | tail -3
timeout 140 python3 bench/dit_bench.py --steps 5 --warmup 2 --compile reduce-overhead --models 2b --adapters lora64 --crops 6000 --batches 3 --time-budget-s 125 --out $OUT/dit_2b_b3.json 2>&1 | grep '"step_ms"'
timeout 170 python3 bench/dit_bench.py --steps 5 --warmup 2 --compile reduce-overhead --models 2b --adapters lokr512 --crops 6000 --batches 2 --time-budget-s 155 --kron-compute master --profile --out $OUT/dit_lokr_profile.json > $OUT/dit.log 2>&1; echo "dit rc=$?"
grep '"step_ms"' $OUT/dit.log
python3 -c "
import json, os
r = json.load(open(os.environ['OUT'] + '/dit_lokr_profile.json'))['rows'][0]
print(json.dumps(r.get('profile'))[:3000])
" 2>&1
