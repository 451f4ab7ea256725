#!/bin/bash
# Session 12, fourth call (issue 6), ~5 min, carry [".device_wheels"]. run_s12b/c.sh put LoKR 512
# behind LoRA r64 at batch 1 on short crops (750: 66.31 against 49.51 ms; 1500: 63.55 against
# 51.82) though level or ahead at batch 8 and 4 and at 3000 x 1: a host-side cost hidden once the
# GPU has enough work. One profiled step of each at 750 x 1: the phases (draw / assembly /
# forward / backward / clip / optimizer, synchronised), the kernels, and the top host-side ops.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
row() {  # name timeout args...
  local name=$1 limit=$2; shift 2
  # a row killed by `timeout` may leave compile workers or a dying process on the GPU: clear them
  pkill -9 -f "bench/dit_bench.py|compile_worker" 2>/dev/null; sleep 2
  echo "$name: GPU apps before: $(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | tr '\n' ' ')"
  timeout $limit python3 bench/dit_bench.py --compile reduce-overhead --models 2b --steps 6 --warmup 3 --optimizer-time --profile --profile-top 40 "$@" --time-budget-s $((limit - 8)) --out $OUT/$name.json > $OUT/$name.log 2>&1
  echo "$name rc=$? $(grep -h '"step_ms"\|"error": "[^"]' $OUT/$name.log | head -1 | cut -c1-330)"
}
row lokr_750_b1_prof 150 --adapters lokr512 --crops 750 --batches 1
row lora_750_b1_prof 140 --adapters lora64 --crops 750 --batches 1
