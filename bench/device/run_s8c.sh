#!/bin/bash
# Session 8, call 3 (issue 6), ~8 min, carry [".device_wheels"]. Calls 1-2 (run_s8a/b.sh): batch-1
# steps spread 110-162 ms (LoRA r64) and 118-183 ms (LoKR 512) at 6000 frames, and the second
# adapter of a process ran 15-20 ms slower than the first. Where does a batch-1 step's time go?
#   P1: LoRA r64, batch 1, 12 steps with the Python GC's collections counted, then --profile
#       (each phase synchronised, the update alone, kernels, top host ops)
#   P2: LoKR 512, batch 1, gc.freeze() after the warm-up;  P3: LoRA r64, the same
# `--gc-freeze` was removed after this run (no effect): the script runs as written at 0bdf889.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
B="python3 bench/dit_bench.py --steps 12 --warmup 3 --compile reduce-overhead --models 2b --crops 6000 --batches 1"
timeout 200 $B --adapters lora64 --profile --time-budget-s 100 --out $OUT/p1.json > $OUT/p1.log 2>&1; echo "P1 rc=$?"
timeout 125 $B --adapters lokr512 --gc-freeze --time-budget-s 110 --out $OUT/p2.json > $OUT/p2.log 2>&1; echo "P2 rc=$?"
timeout 125 $B --adapters lora64 --gc-freeze --time-budget-s 110 --out $OUT/p3.json > $OUT/p3.log 2>&1; echo "P3 rc=$?"
python3 -c "
import json, os
for name in ('p1', 'p2', 'p3'):
  try:
    rows = json.load(open(os.environ['OUT'] + '/' + name + '.json'))['rows']
  except Exception as exc:
    print(name, repr(exc)); continue
  for r in rows:
    print(name, {k: r.get(k) for k in ('adapter', 'step_ms', 'step_ms_all', 'audio_s_per_s', 'peak_reserved_gib', 'gc', 'error')})
    p = r.get('profile')
    if p: print(json.dumps(p)[:3000])
" 2>&1
