#!/bin/bash
# Session 7, second call (issue 6), carry [".device_wheels"], ~5 min: LoKR 512 at batch 2,
# 6000 frames, CUDA graphs, with `--kron-compute autocast` (the w1 mix on bf16 activations)
# against the default "master" with its kernel profile. The faster becomes
# `adapters.KRON_COMPUTE`.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
B="python3 bench/dit_bench.py --steps 5 --warmup 2 --compile reduce-overhead --models 2b --crops 6000"
timeout 130 $B --adapters lokr512 --batches 2 --time-budget-s 115 --kron-compute autocast --profile --out $OUT/dit_lokr_autocast.json > $OUT/dit_autocast.log 2>&1; echo "autocast rc=$?"
grep '"step_ms"' $OUT/dit_autocast.log
timeout 165 $B --adapters lokr512 --batches 2 --time-budget-s 150 --kron-compute master --profile --out $OUT/dit_lokr_profile.json > $OUT/dit.log 2>&1; echo "master rc=$?"
grep '"step_ms"' $OUT/dit.log
python3 -c "
import json, os
for name in ('dit_lokr_autocast', 'dit_lokr_profile'):
  r = json.load(open(os.environ['OUT'] + '/' + name + '.json'))['rows'][0]
  print(name, json.dumps(r.get('profile'))[:2500])
" 2>&1
