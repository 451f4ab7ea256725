#!/bin/bash
# Session 8, call 5 (issue 6), ~7.5 min, carry [".device_wheels"]. Call 4 (run_s8d.sh) found the
# graph break: diffusers' backend lookup rebuilds an enum member (`AttentionBackendName(member)`),
# which torch 2.11's dynamo cannot trace, at every attention: ~7 graphs per DiT block.
# `acestep_wrappers._attention_backend` now returns the member as is. The same rows as calls
# 1-3, each adapter in its own process, 12 timed steps, 2B, 6000 frames, CUDA graphs:
#   LoRA r64 batch 1 (graph breaks logged), LoKR 512 batch 1, LoKR 512 batch 2, LoRA r64 batch 2.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
B="python3 bench/dit_bench.py --steps 12 --warmup 3 --compile reduce-overhead --models 2b --crops 6000 --optimizer-time"
TORCH_LOGS="graph_breaks" timeout 120 $B --adapters lora64 --batches 1 --time-budget-s 105 --out $OUT/lora_b1.json > $OUT/lora_b1.log 2>&1; echo "lora b1 rc=$? graph breaks: $(grep -c 'Graph break' $OUT/lora_b1.log)"
timeout 120 $B --adapters lokr512 --batches 1 --time-budget-s 105 --out $OUT/lokr_b1.json > $OUT/lokr_b1.log 2>&1; echo "lokr b1 rc=$?"
timeout 130 $B --adapters lokr512 --batches 2 --time-budget-s 115 --out $OUT/lokr_b2.json > $OUT/lokr_b2.log 2>&1; echo "lokr b2 rc=$?"
timeout 130 $B --adapters lora64 --batches 2 --time-budget-s 115 --out $OUT/lora_b2.json > $OUT/lora_b2.log 2>&1; echo "lora b2 rc=$?"
python3 -c "
import json, os
for name in ('lora_b1', 'lokr_b1', 'lokr_b2', 'lora_b2'):
  try:
    rows = json.load(open(os.environ['OUT'] + '/' + name + '.json'))['rows']
  except Exception as exc:
    print(name, repr(exc)); continue
  for r in rows:
    print(name, {k: r.get(k) for k in ('step_ms', 'step_ms_all', 'audio_s_per_s', 'mfu', 'peak_reserved_gib', 'optimizer_ms', 'gc', 'error')})
" 2>&1
