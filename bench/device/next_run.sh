#!/bin/bash
# The measurements session 2 could not fit in its device time, in priority order (one `run`,
# carry [".device_wheels"], ~9 min). Each line has its own timeout; JSON lands in $OUT.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# issue 12: 4B LM calibration wall clock (a small grid; the report projects the default grid)
timeout 150 python3 bench/calibrate_bench.py --milestones 2 --scales 0.75,1.0 --seeds 2 --out $OUT/calibrate_4b.json 2>&1 | tail -20
# issue 5: preprocessing with the fast Oobleck encode vs the old path
timeout 150 python3 bench/preprocess_bench.py --quick --budget-s 120 --out $OUT/preprocess_fast.json 2>&1 | tail -c 2000
# issue 6: compiled LoKR (the DiT default adapter), reduce-overhead at batch 2, XL batch 2
B="python3 bench/dit_bench.py --steps 5 --warmup 2 --time-budget-s 100"
timeout 110 $B --models 2b --adapters lokr512 --crops 6000 --batches 1,2 --compile default --profile --out $OUT/dit_lokr.json 2>&1 | grep '"step_ms"'
timeout 110 $B --models 2b --adapters lokr512 --crops 6000 --batches 1,2 --compile default --kron-mix pointwise --profile --out $OUT/dit_lokr_pointwise.json 2>&1 | grep '"step_ms"'
timeout 110 $B --models 2b --adapters lora64 --crops 6000 --batches 2 --compile reduce-overhead --out $OUT/dit_ro_b2.json 2>&1 | grep '"step_ms"'
