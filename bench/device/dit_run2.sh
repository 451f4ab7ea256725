#!/bin/bash
# GPU session 2, call 2: compiled DiT step with one-bucket Muon + fused AdamW; flex; LoKR; XL; 750 crops.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
B="python3 bench/dit_bench.py --steps 5 --warmup 2 --time-budget-s 100"
s() { grep '"step_ms"' | cut -c1-260; }
timeout 135 $B --models 2b --adapters lora64 --crops 6000 --batches 1,2 --compile reduce-overhead --profile --out $OUT/r2_lora_ro.json 2>&1 | s
timeout 135 $B --models 2b --adapters lora64 --crops 6000 --batches 1,2 --compile default --attention flex --profile --out $OUT/r2_lora_flex.json 2>&1 | s
timeout 100 $B --models 2b --adapters lokr512 --crops 6000 --batches 1,2 --compile default --profile --out $OUT/r2_lokr.json 2>&1 | s
timeout 80 $B --models 2b --adapters lora64 --crops 750 --batches 8,16 --compile default --out $OUT/r2_lora750.json 2>&1 | s
timeout 115 $B --models xl --adapters lora64 --crops 6000 --batches 1,2 --compile default --profile --out $OUT/r2_xl.json 2>&1 | s
