#!/bin/bash
# Session 12, sixth call (issue 6), ~6 min, carry [".device_wheels"]. LoKR 512 trails LoRA r64 at
# 750 x 1 by 12-17 ms with the same GPU kernel time (run_s12d/e.sh): a host-side cost. A
# timeline (host + GPU, gzipped Chrome trace, `dit_bench --profile --trace`) of two steps of each
# shows where the GPU waits.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
row() {  # name timeout args...
  local name=$1 limit=$2; shift 2
  pkill -9 -f "bench/dit_bench.py|compile_worker" 2>/dev/null; sleep 2
  timeout $limit python3 bench/dit_bench.py --compile reduce-overhead --models 2b --steps 8 --warmup 3 --crops 750 --batches 1 --profile --profile-top 30 --trace "$@" --time-budget-s $((limit - 8)) --out $OUT/$name.json > /tmp/$name.log 2>&1
  echo "$name rc=$? $(grep -h '"step_ms"\|"error": "[^"]' /tmp/$name.log | head -1 | cut -c1-300)"
}
row lokr_750_b1_trace 200 --adapters lokr512
row lora_750_b1_trace 170 --adapters lora64
ls -la $OUT
