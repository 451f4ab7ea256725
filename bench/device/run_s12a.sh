#!/bin/bash
# Session 12, first call (issue 6), ~6 min, carry [".device_wheels"]. Session 11 put LoKR 512
# level with LoRA r64 at 6000 frames, batch 1, and 3% ahead at batch 2 (the fused backward,
# run_s11a/b/e.sh). On 750-frame crops at batch 8 LoKR ran 95.13 ms (run_s11f.sh) against
# LoRA's 83.48 ms from session 9: across sessions, so this call measures the pairs on one machine.
# 2B, compiled blocks + CUDA graphs, Muon's default, each row in its own process (new shapes
# compile for ~70-100 s on a warm cache, ~150 s on a fresh machine):
#   750 x 8 (LoKR, LoRA), 1500 x 4 (LoRA; LoKR's is in run_s12b.sh), the recipe's default path
#   (crop 1248, batch 1, grad_accum 4 folded).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
row() {  # name timeout args...
  local name=$1 limit=$2; shift 2
  # a row killed by `timeout` may leave compile workers or a dying process on the GPU: clear them
  pkill -9 -f "bench/dit_bench.py|compile_worker" 2>/dev/null; sleep 2
  echo "$name: GPU apps before: $(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | tr '\n' ' ')"
  timeout $limit python3 bench/dit_bench.py --compile reduce-overhead --models 2b --steps 12 --warmup 3 --optimizer-time "$@" --time-budget-s $((limit - 8)) --out $OUT/$name.json > /tmp/$name.log 2>&1
  echo "$name rc=$? $(grep -h '"step_ms"\|"error": "[^"]' /tmp/$name.log | head -1 | cut -c1-330)"
}
row lokr_750_b8 160 --adapters lokr512 --crops 750 --batches 8
row lora_750_b8 105 --adapters lora64 --crops 750 --batches 8
row lora_1500_b4 105 --adapters lora64 --crops 1500 --batches 4
row lora_recipe 105 --adapters lora64 --crops 1248 --batches 1 --grad-accum 4 --fold 4
row lokr_recipe 90 --adapters lokr512 --crops 1248 --batches 1 --grad-accum 4 --fold 4
