#!/bin/bash
# Session 13, fifth call (issue 6), ~2.5 min on the warm machine of run_s13c/d, carry
# [".device_wheels"]. adapters.KRON_MERGED_MIN_TOKENS is now 512 (run_s13d.sh: LoKR 512 at
# 1500 x 1 merged 38.80 ms, factored 42.85): the defaults, LoKR then LoRA r64, one process.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
pkill -9 -f "bench/dit_bench.py|compile_worker" 2>/dev/null; sleep 1
timeout 170 python3 bench/dit_bench.py --models 2b --steps 12 --warmup 3 --batches 1 --compile step-graph --adapters lokr512,lora64 --crops 1500 --time-budget-s 160 --out $OUT/s13e.json > $OUT/s13e.log 2>&1
echo "rc=$?"
python3 -c "
import json
for r in json.load(open('$OUT/s13e.json'))['rows']:
    print({k: r.get(k) for k in ('adapter','crop','batch','step_ms','step_ms_min','audio_s_per_s','mfu','peak_gib','peak_reserved_gib','step_graphs','error') if k in r}); print('   all', r.get('step_ms_all'))
"
