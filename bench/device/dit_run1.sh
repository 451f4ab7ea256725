#!/bin/bash
# GPU session 2, call 1: torch.compile of the DiT blocks (default / reduce-overhead) vs eager.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv
B="python3 bench/dit_bench.py --models 2b --steps 5 --warmup 2 --time-budget-s 200"
timeout 230 $B --adapters lora64 --crops 6000 --batches 1,2 --compile default --profile --out $OUT/c_lora_default.json 2>&1 | grep -v Warning | tail -15
timeout 200 $B --adapters lora64 --crops 6000 --batches 1 --compile reduce-overhead --profile --out $OUT/c_lora_ro.json 2>&1 | grep -v Warning | tail -15
timeout 100 $B --adapters lokr512 --crops 6000 --batches 1 --compile none --profile --out $OUT/c_lokr_none.json 2>&1 | grep -v Warning | tail -8
