#!/bin/bash
# Second call of the next session (after next_run.sh), ~9.5 min, carry [".device_wheels"]:
#   1. issue 6: LoKR 512 at batch 2 with `--kron-compute autocast` (the w1 mix on bf16
#      activations instead of float32 copies of every adapted input; the default "master"
#      took 202 ms against LoRA r64's 154, the arithmetic bound ~185). The faster becomes
#      `adapters.KRON_COMPUTE`.
#   2. issue 6: the LoKR step's kernel profile (default "master"; rerun with the faster mode)
#   3. issue 6: 2B LoRA r64 at batch 3, 6000 frames (batch 2: 3124.5 audio-s/s in 20.3 GiB)
#   4. issue 8: the merged-adapter planner at 240 s (30 s measured: 276 codes/s; base 255 at 240 s)
# Left for later: codes -> audio under 8 and 32 concurrent clients on one warmed fast decoder
# (`audition_bench.py --sections decode-load --load-vae-config fast-nhwc --clients 8,32`), the
# 4B LM step with hybrid Muon (`lm_bench.py --sizes 4B --configs song_ro_muon`).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
B="python3 bench/dit_bench.py --steps 5 --warmup 2 --compile reduce-overhead --models 2b --crops 6000"
timeout 130 $B --adapters lokr512 --batches 2 --time-budget-s 115 --kron-compute autocast --out $OUT/dit_lokr_autocast.json 2>&1 | grep '"step_ms"'
timeout 165 $B --adapters lokr512 --batches 2 --time-budget-s 150 --kron-compute master --profile --out $OUT/dit_lokr_profile.json > $OUT/dit.log 2>&1; echo "dit rc=$?"
grep '"step_ms"' $OUT/dit.log
python3 -c "
import json, os
r = json.load(open(os.environ['OUT'] + '/dit_lokr_profile.json'))['rows'][0]
print(json.dumps(r.get('profile'))[:3000])
" 2>&1
timeout 125 $B --adapters lora64 --batches 3 --time-budget-s 110 --out $OUT/dit_2b_b3.json 2>&1 | grep '"step_ms"'
timeout 130 python3 bench/audition_bench.py --sections lm --decode-modes compiled --lm-adapter --lm-merge on --lm-seconds 240 --lm-repeat 1 --no-check-eager --budget-s 120 --out $OUT/audition_lm_240.json > $OUT/lm.log 2>&1; echo "planner rc=$?"
grep -E '"section"|Traceback' $OUT/lm.log | cut -c1-500 | tail -3
