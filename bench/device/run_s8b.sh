#!/bin/bash
# Session 8, call 2 (issue 6), ~9 min, carry [".device_wheels"]. Call 1 (run_s8a.sh) measured
# LoKR 512 at batch 1 131.6 ms against LoRA r64's 135.8 in one session, but the steps spread
# 118-138 ms and LoKR at batch 2 read 198 ms (166.7-204.2) where session 7 had 171. So: 12 timed
# steps per row, both adapters in one process each, in opposite orders:
#   A: batch 1, LoRA r64 then LoKR 512;  B: batch 2, LoKR 512 then LoRA r64;
#   C: batch 1, LoKR 512 then LoRA r64 (if time is left).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv
B="python3 bench/dit_bench.py --steps 12 --warmup 3 --compile reduce-overhead --models 2b --crops 6000 --optimizer-time"
timeout 200 $B --adapters lora64,lokr512 --batches 1 --time-budget-s 185 --out $OUT/dit_b1_ab.json > $OUT/b1_ab.log 2>&1; echo "A rc=$?"
timeout 215 $B --adapters lokr512,lora64 --batches 2 --time-budget-s 200 --out $OUT/dit_b2_ba.json > $OUT/b2_ba.log 2>&1; echo "B rc=$?"
timeout 130 $B --adapters lokr512,lora64 --batches 1 --time-budget-s 115 --out $OUT/dit_b1_ba.json > $OUT/b1_ba.log 2>&1; echo "C rc=$?"
python3 -c "
import json, os
for name in ('dit_b1_ab', 'dit_b2_ba', 'dit_b1_ba'):
  try:
    rows = json.load(open(os.environ['OUT'] + '/' + name + '.json'))['rows']
  except Exception as exc:
    print(name, repr(exc)); continue
  for r in rows:
    print(name, {k: r.get(k) for k in ('adapter', 'batch', 'step_ms', 'step_ms_all', 'audio_s_per_s', 'peak_reserved_gib', 'optimizer_ms', 'build_s', 'error')})
" 2>&1
