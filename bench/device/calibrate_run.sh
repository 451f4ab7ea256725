#!/bin/bash
# LM calibration with an item's seeds decoded together (max_batch 4) vs one at a time, 4B, the
# calibrate bench's small grid; then the DiT at batch 3 (does 6000 frames reach 3000 audio-s/s
# within 24 GB?). One `run`, carry [".device_wheels"], ~5 min.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# issue 12: calibration with an item's seeds decoded together (max_batch 4) vs one at a time
timeout 90 python3 bench/calibrate_bench.py --milestones 2 --scales 0.75,1.0 --seeds 4 --max-batch 4 --out $OUT/calibrate_4b_b4.json 2>&1 | grep -E '"(calibrate_total_s|codes_per_s_overall|projected_default_grid_s)"'
timeout 90 python3 bench/calibrate_bench.py --milestones 2 --scales 0.75,1.0 --seeds 4 --max-batch 1 --out $OUT/calibrate_4b_b1.json 2>&1 | grep -E '"(calibrate_total_s|codes_per_s_overall|projected_default_grid_s)"'
timeout 100 python3 bench/dit_bench.py --steps 5 --warmup 2 --time-budget-s 90 --models 2b --adapters lora64 --crops 6000 --batches 3 --compile reduce-overhead --profile --out $OUT/dit_b3_ro.json 2>&1 | grep '"step_ms"'
