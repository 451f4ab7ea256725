#!/bin/bash
# First call of the next session (issue 6), ~8.5 min, carry [".device_wheels"]. Session 8 made
# every DiT block one compiled graph on the device's torch 2.11 (the attention-backend lookup
# broke each block into ~7: LoRA r64 at 6000 frames, batch 1, went 123.1-141.0 -> 88.6 ms) and
# moved Muon's Newton-Schulz to TF32. The rows measured before that, again:
#   1. the recipe's default path: LoKR 512, crop 1248, batch 1, grad_accum 4 folded into one
#      forward (session 7: 116.03 ms per optimizer step, 1720.9 audio-s/s)
#   2. 750-frame crops, LoRA r64, batch 8 (fifth run: 116.1 ms, 2066.7 audio-s/s)
#   3. XL, LoRA r64, 6000 frames, batch 2 (seventh run: 1342.4 audio-s/s, 42.3 GiB reserved)
# Each bench prints one line per row (ms, audio-s/s, MFU, peaks, the update alone); the JSON
# files under $OUT hold every step's time.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
B="python3 bench/dit_bench.py --steps 8 --warmup 3 --compile reduce-overhead --optimizer-time"
timeout 140 $B --models 2b --adapters lokr512 --crops 1248 --batches 1 --grad-accum 4 --fold 4 --time-budget-s 125 --out $OUT/dit_recipe.json > $OUT/recipe.log 2>&1; echo "recipe rc=$?"
timeout 140 $B --models 2b --adapters lora64 --crops 750 --batches 8 --time-budget-s 125 --out $OUT/dit_750.json > $OUT/750.log 2>&1; echo "750 rc=$?"
timeout 200 $B --models xl --adapters lora64 --crops 6000 --batches 2 --time-budget-s 185 --out $OUT/dit_xl.json > $OUT/xl.log 2>&1; echo "xl rc=$?"
grep -h '"step_ms"\|"error": "[^"]' $OUT/recipe.log $OUT/750.log $OUT/xl.log | cut -c1-400
