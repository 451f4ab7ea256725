#!/bin/bash
# Second call of the next session (after next_run.sh), ~9.5 min, carry [".device_wheels"]:
#   1. issue 7: the 4B step with the recipe's default optimizer (hybrid Muon) under the trainer's
#      defaults (CUDA graphs, activation budget 0.8): the goal rows (40.4 % MFU) used AdamW
#   2. issue 6: LoKR 512 at batch 2 with CUDA graphs, w1 mixed pointwise (by a GEMM: 307 ms in the
#      sixth device run): LoKR's w2 GEMM is a quarter of the base GEMM per adapted linear, LoRA r64's a
#      sixteenth, so batch 2 is where LoKR falls behind LoRA (204 ms)
#   3. issue 12: calibration with an item's seeds decoded together (max_batch 4) vs one at a time
#   0. (first) issue 6, the default recipe's path: LoKR 512, crop 1248 (auto-fit on an H200),
#      batch 1, grad_accum 4, its 4 micro-batches one forward each vs folded into one forward of
#      4 (`DitSettings.fold_accum`, on by default on CUDA since session 4, unmeasured)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
F="python3 bench/dit_bench.py --steps 5 --warmup 2 --compile reduce-overhead --models 2b --adapters lokr512 --crops 1248 --batches 1 --grad-accum 4 --time-budget-s 60"
timeout 75 $F --fold 1 --out $OUT/dit_default_fold1.json 2>&1 | grep '"step_ms"'
timeout 75 $F --fold 4 --out $OUT/dit_default_fold4.json 2>&1 | grep '"step_ms"'
timeout 100 python3 bench/lm_bench.py --steps 8 --sizes 4B --configs song_ro_muon --out $OUT/lm_4b_muon 2>&1 | grep -E '^\| 4B|Error|Traceback' | cut -c1-300
B="python3 bench/dit_bench.py --steps 5 --warmup 2 --compile reduce-overhead --models 2b --adapters lokr512 --crops 6000 --batches 2"
timeout 110 $B --time-budget-s 95 --kron-mix pointwise --out $OUT/dit_lokr_pointwise.json 2>&1 | grep '"step_ms"'
timeout 90 python3 bench/calibrate_bench.py --milestones 2 --scales 0.75,1.0 --seeds 4 --max-batch 4 --out $OUT/calibrate_4b_b4.json 2>&1 | grep -E '"(calibrate_total_s|codes_per_s_overall|projected_default_grid_s)"'
timeout 90 python3 bench/calibrate_bench.py --milestones 2 --scales 0.75,1.0 --seeds 4 --max-batch 1 --out $OUT/calibrate_4b_b1.json 2>&1 | grep -E '"(calibrate_total_s|codes_per_s_overall|projected_default_grid_s)"'
