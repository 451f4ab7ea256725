#!/bin/bash
# Session 13, fourth call (issue 6), ~4 min, carry [".device_wheels"].
# run_s13c.sh: with the update queued before the read, LoKR 512 led LoRA r64 at 750 x 1 (34.98
# vs 35.73 ms) and on the recipe's path, but trailed at 1500 x 1 (42.40 vs 40.43). There a
# Linear sees 750 rows, under adapters.KRON_MERGED_MIN_TOKENS (1024, arithmetic, not measured),
# so LoKR runs factored; at 3000 x 1 (1500 rows, merged) it led. Same machine: LoKR 1500 x 1
# merged from 512 rows, then factored (the default).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
bench() {  # name limit args...
  local name=$1 limit=$2; shift 2
  pkill -9 -f "bench/dit_bench.py|compile_worker" 2>/dev/null; sleep 2
  timeout $limit python3 bench/dit_bench.py --models 2b --steps 12 --warmup 3 --batches 1 --compile step-graph --adapters lokr512 --crops 1500 "$@" --time-budget-s $((limit - 10)) --out $OUT/$name.json > $OUT/$name.log 2>&1
  echo "$name rc=$?"
  python3 -c "
import json,sys
for r in json.load(open('$OUT/$name.json'))['rows']:
    print({k: r.get(k) for k in ('adapter','crop','batch','step_ms','step_ms_min','audio_s_per_s','peak_gib','peak_reserved_gib','step_graphs','error') if k in r}); print('   all', r.get('step_ms_all'))
"
}
bench s13d_merged512 135 --kron-merged-min-tokens 512
bench s13d_factored 115
