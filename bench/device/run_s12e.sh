#!/bin/bash
# Session 12, fifth call (issue 6), ~5 min, carry [".device_wheels"]. run_s12d.sh's profile of
# LoKR 512 at 750 x 1 had the same GPU kernel time as LoRA r64 (32.31 against 32.58 ms) but a
# slower, jittery step (41-78 ms against 39): 375 rows per Linear is under
# KRON_MERGED_MIN_TOKENS (1024, set by arithmetic), so LoKR ran its factored forward there (and
# at 1500 x 1) and merged at 3000 x 1, where it was ahead of LoRA. LoKR with the merged forward
# at every row count (750 and 1500, batch 1), then the default again at 750 x 1.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
row() {  # name timeout args...
  local name=$1 limit=$2; shift 2
  pkill -9 -f "bench/dit_bench.py|compile_worker" 2>/dev/null; sleep 2
  echo "$name: GPU apps before: $(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | tr '\n' ' ')"
  timeout $limit python3 bench/dit_bench.py --compile reduce-overhead --models 2b --steps 12 --warmup 3 --optimizer-time --adapters lokr512 --batches 1 "$@" --time-budget-s $((limit - 8)) --out $OUT/$name.json > /tmp/$name.log 2>&1
  echo "$name rc=$?"; grep -h '"step_ms"\|"error": "[^"]' /tmp/$name.log | cut -c1-300
}
row lokr_b1_merged 200 --crops 750,1500 --kron-merged-min-tokens 0
row lokr_750_b1_factored 110 --crops 750
