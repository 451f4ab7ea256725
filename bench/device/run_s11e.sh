#!/bin/bash
# Session 11, fifth call (issue 6), ~6.5 min, carry [".device_wheels"]. With adapters.FUSED_MIX now
# on by default: 2B LoKR 512 at batch 2 with no flag (the default path, against --fused-mix's
# 150.38 / 150.58 ms earlier this session), and XL LoKR 512 at batch 2 with --no-fused-mix (the
# torch mix, against the fused 365.97 ms of run_s11d.sh). One process per row.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
row() {  # name timeout args...
  local name=$1 limit=$2; shift 2
  timeout $limit python3 bench/dit_bench.py --compile reduce-overhead --crops 6000 --batches 2 --adapters lokr512 --optimizer-time "$@" --time-budget-s $((limit - 10)) --out $OUT/$name.json > /tmp/$name.log 2>&1
  echo "$name rc=$? $(grep -h '"step_ms"\|"error": "[^"]' /tmp/$name.log | head -1 | cut -c1-330)"
}
row lokr_default_b2 160 --models 2b --steps 20 --warmup 4
row xl_lokr_unfused_b2 220 --models xl --steps 12 --warmup 3 --no-fused-mix
grep -h "lokr_kernels" -A6 /tmp/lokr_default_b2.log | head -8
