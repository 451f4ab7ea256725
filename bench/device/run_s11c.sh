#!/bin/bash
# Session 11, third call, ~4 min measured, carry [".device_wheels"]; documentation rows left
# from sessions 6-7 (no default depends on them):
#   1. issue 6: 2B LoRA r64 at batch 3, 6000 frames (batch 2: 155.57 ms, 20.34 GiB reserved)
#   2. issue 8: the merged-adapter planner at 240 s (30 s measured: 276 codes/s; base 255 at 240 s)
#   3. issue 7: the 4B LM step with its gradients as one flat buffer (session 9, `FlatGrads`;
#      sixth run without it: 95.0 ms, song_ro with the 0.8 activation budget, AdamW)
# Left for later: codes -> audio under 8 and 32 concurrent clients on one warmed fast decoder
# (`audition_bench.py --sections decode-load --load-vae-config fast-nhwc --clients 8,32`), the
# 4B LM step with hybrid Muon (`lm_bench.py --sizes 4B --configs song_ro_muon`).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 125 python3 bench/dit_bench.py --steps 5 --warmup 2 --compile reduce-overhead --models 2b --crops 6000 --adapters lora64 --batches 3 --time-budget-s 110 --out $OUT/dit_2b_b3.json 2>&1 | grep '"step_ms"'
timeout 130 python3 bench/audition_bench.py --sections lm --decode-modes compiled --lm-adapter --lm-merge on --lm-seconds 240 --lm-repeat 1 --no-check-eager --budget-s 120 --out $OUT/audition_lm_240.json > $OUT/lm.log 2>&1; echo "planner rc=$?"
grep -E '"section"|Traceback' $OUT/lm.log | cut -c1-500 | tail -3
timeout 150 python3 bench/lm_bench.py --steps 8 --sizes 4B --configs song_ro --out $OUT/lm_4b.json > $OUT/lm_4b.log 2>&1; echo "lm 4B rc=$?"
grep -E "^\| 4B" $OUT/lm_4b.log | head -3
