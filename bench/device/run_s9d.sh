#!/bin/bash
# Session 9, call 4 (issue 6), ~5.5 min, carry [".device_wheels"]: the last row measured before
# session 8's one-graph fix, XL LoRA r64 at 6000 frames, batch 2 (seventh run: 1342.4
# audio-s/s, 42.3 GiB reserved), and LoRA r64 batch 1 at 6000 frames again (call 1: 88.06 ms),
# against call 3's LoKR rows with the w1-gradient kernel.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
B="python3 bench/dit_bench.py --steps 8 --warmup 3 --compile reduce-overhead --crops 6000 --optimizer-time --adapters lora64"
timeout 190 $B --models xl --batches 2 --time-budget-s 175 --out $OUT/dit_xl.json > $OUT/xl.log 2>&1; echo "xl rc=$?"
timeout 95 $B --models 2b --batches 1 --steps 12 --time-budget-s 80 --out $OUT/lora_b1.json > $OUT/lora_b1.log 2>&1; echo "lora b1 rc=$?"
grep -h '"step_ms"\|"error": "[^"]' $OUT/xl.log $OUT/lora_b1.log | cut -c1-400
