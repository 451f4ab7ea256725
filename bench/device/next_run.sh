#!/bin/bash
# First call of the next session (issue 6), ~6.5 min, carry [".device_wheels"]: does LoKR 512
# (75.5 M params) train a 240 s song no slower than LoRA r64 (81.8 M) at batch 1? Session 7
# measured LoKR with the merged forward at 113.62 ms per step (batch 1) and 170.99 ms (batch 2,
# LoRA 155.57 ms in the same session), but LoRA at batch 1 only in older sessions (153.5-183 ms,
# before several step changes). All three rows in one session, CUDA graphs, 2B, 6000 frames:
#   1. LoRA r64, batch 1
#   2. LoKR 512, batch 1, the default (merged forward; inputs under 1024 rows factored, added
#      after session 7's runs)
#   3. LoKR 512, batch 2, the same default (session 7: 170.99 ms before the threshold)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
B="python3 bench/dit_bench.py --steps 5 --warmup 2 --compile reduce-overhead --models 2b --crops 6000"
timeout 125 $B --adapters lora64 --batches 1 --time-budget-s 110 --out $OUT/dit_lora_b1.json > $OUT/lora_b1.log 2>&1; echo "lora b1 rc=$?"
timeout 140 $B --adapters lokr512 --batches 1 --time-budget-s 125 --out $OUT/dit_lokr_b1.json > $OUT/lokr_b1.log 2>&1; echo "lokr b1 rc=$?"
timeout 160 $B --adapters lokr512 --batches 2 --time-budget-s 145 --out $OUT/dit_lokr_b2.json > $OUT/lokr_b2.log 2>&1; echo "lokr b2 rc=$?"
python3 -c "
import json, os
for name in ('dit_lora_b1', 'dit_lokr_b1', 'dit_lokr_b2'):
  r = json.load(open(os.environ['OUT'] + '/' + name + '.json'))['rows'][0]
  print(name, {k: r.get(k) for k in ('adapter', 'batch', 'step_ms', 'step_ms_all', 'audio_s_per_s', 'mfu', 'peak_reserved_gib', 'error')})
" 2>&1
