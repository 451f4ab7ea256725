#!/bin/bash
# Session 8, call 1 (issue 6), ~8.5 min, carry [".device_wheels"].
# 1. Muon's update alone on the 2B/XL adapters' factor shapes by Newton-Schulz precision: LoKR
#    512 stacks ~0.95 TFLOP of NS per step (LoRA r64: 0.11), and the trainer ran it in IEEE
#    float32 while dit_bench switched TF32 on globally (removed now; Muon's "auto" is TF32 on CUDA).
# 2-4. One session, CUDA graphs, 2B, 6000 frames, each row with the update's time alone:
#    LoRA r64 batch 1, LoKR 512 batch 1, LoKR 512 batch 2 (the merged forward with the 1024-row
#    threshold). Decides "LoKR no slower than LoRA of the same parameter count" at batch 1.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 80 python3 bench/muon_bench.py --out $OUT/muon_bench.json > $OUT/muon.log 2>&1; echo "muon rc=$?"; cat $OUT/muon.log | cut -c1-300
B="python3 bench/dit_bench.py --steps 5 --warmup 2 --compile reduce-overhead --models 2b --crops 6000 --optimizer-time"
timeout 125 $B --adapters lora64 --batches 1 --time-budget-s 110 --out $OUT/dit_lora_b1.json > $OUT/lora_b1.log 2>&1; echo "lora b1 rc=$?"
timeout 140 $B --adapters lokr512 --batches 1 --time-budget-s 125 --out $OUT/dit_lokr_b1.json > $OUT/lokr_b1.log 2>&1; echo "lokr b1 rc=$?"
timeout 160 $B --adapters lokr512 --batches 2 --time-budget-s 145 --out $OUT/dit_lokr_b2.json > $OUT/lokr_b2.log 2>&1; echo "lokr b2 rc=$?"
python3 -c "
import json, os
for name in ('dit_lora_b1', 'dit_lokr_b1', 'dit_lokr_b2'):
  try:
    r = json.load(open(os.environ['OUT'] + '/' + name + '.json'))['rows'][0]
  except Exception as exc:
    print(name, repr(exc)); continue
  print(name, {k: r.get(k) for k in ('adapter', 'batch', 'step_ms', 'step_ms_all', 'audio_s_per_s', 'mfu', 'peak_reserved_gib', 'optimizer_ms', 'error')})
" 2>&1
