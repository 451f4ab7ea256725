#!/bin/bash
# Second call of the next session (issue 6), ~6 min, carry [".device_wheels"]; run it if
# next_run.sh shows LoKR 512 behind LoRA r64 on 750-frame crops at batch 8. One profiled step of
# each at 750 x 8 and of LoKR at 1500 x 4 (the same 6000 frames, where LoKR ran 82.42 ms against
# 95.13 at 750 x 8 in session 11): the kernels that take the difference, and the phases
# (assembly / forward / backward / clip / optimizer). 2B, compiled blocks + CUDA graphs.
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
row lokr_750_b8_prof 160 --adapters lokr512 --crops 750 --batches 8
row lora_750_b8_prof 105 --adapters lora64 --crops 750 --batches 8
row lokr_1500_b4_prof 105 --adapters lokr512 --crops 1500 --batches 4
