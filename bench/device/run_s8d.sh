#!/bin/bash
# Session 8, call 4 (issue 6), ~2.5 min, carry [".device_wheels"]. Call 3's profile of a LoRA r64
# batch-1 step at 6000 frames: 85.3 ms of kernels in a 120-175 ms step, 167 compiled-region
# calls forward and 167 backward per step (~7 per block, ~10 graph hashes called 23-24 times
# each), 264 dynamo cache lookups: the host, not the GPU, sets the step. Which graph breaks
# split a block? One short run with dynamo's graph-break and recompile logs.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
TORCH_LOGS="graph_breaks,recompiles" timeout 150 python3 bench/dit_bench.py --steps 2 --warmup 2 --compile reduce-overhead --models 2b --crops 6000 --batches 1 --adapters lora64 --time-budget-s 120 --out $OUT/gb.json > $OUT/gb.log 2>&1; echo "rc=$?"
grep -c "Graph break" $OUT/gb.log
grep -A3 "Graph break" $OUT/gb.log | grep -v "^--$" | cut -c1-250 | sort | uniq -c | sort -rn | head -40
