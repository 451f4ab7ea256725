#!/bin/bash
# Session 7, seventh call (issue 6), carry [".device_wheels"], ~4.5 min: the merged LoKR forward
# (now the default) on the recipe's default path (LoKR 512, crop 1248, batch 1, grad_accum 4
# folded: 205.8 ms per optimizer step before) and on one 240 s song at batch 1 (163.2 ms).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
B="python3 bench/dit_bench.py --steps 5 --warmup 2 --compile reduce-overhead --models 2b --adapters lokr512"
timeout 150 $B --crops 1248 --batches 1 --grad-accum 4 --fold 4 --time-budget-s 140 --out $OUT/dit_recipe.json > $OUT/dit_recipe.log 2>&1; echo "recipe rc=$?"
timeout 110 $B --crops 6000 --batches 1 --time-budget-s 100 --out $OUT/dit_b1.json > $OUT/dit_b1.log 2>&1; echo "b1 rc=$?"
python3 -c "
import json, os
for name in ('dit_recipe', 'dit_b1'):
  r = json.load(open(os.environ['OUT'] + '/' + name + '.json'))['rows'][0]
  print(name, {k: r.get(k) for k in ('crop', 'batch', 'fold', 'step_ms', 'step_ms_all', 'audio_s_per_s', 'mfu', 'peak_reserved_gib', 'error')})
" 2>&1
