#!/bin/bash
# Second call of the next session, ~6 min, carry [".device_wheels"]; documentation rows left
# from sessions 6-7 (no default depends on them):
#   1. issue 6: 2B LoRA r64 at batch 3, 6000 frames (batch 2: 155.57 ms, 20.34 GiB reserved)
#   2. issue 8: the merged-adapter planner at 240 s (30 s measured: 276 codes/s; base 255 at 240 s)
# Left for later: codes -> audio under 8 and 32 concurrent clients on one warmed fast decoder
# (`audition_bench.py --sections decode-load --load-vae-config fast-nhwc --clients 8,32`), the
# 4B LM step with hybrid Muon (`lm_bench.py --sizes 4B --configs song_ro_muon`).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 125 python3 bench/dit_bench.py --steps 5 --warmup 2 --compile reduce-overhead --models 2b --crops 6000 --adapters lora64 --batches 3 --time-budget-s 110 --out $OUT/dit_2b_b3.json 2>&1 | grep '"step_ms"'
timeout 130 python3 bench/audition_bench.py --sections lm --decode-modes compiled --lm-adapter --lm-merge on --lm-seconds 240 --lm-repeat 1 --no-check-eager --budget-s 120 --out $OUT/audition_lm_240.json > $OUT/lm.log 2>&1; echo "planner rc=$?"
grep -E '"section"|Traceback' $OUT/lm.log | cut -c1-500 | tail -3
