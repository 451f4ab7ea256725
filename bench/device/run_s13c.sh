#!/bin/bash
# Session 13, third step-graph call (issue 6), ~9 min, carry [".device_wheels"].
# run_s13b.sh: with step-graph LoKR 512 still trailed LoRA r64 at 1500 x 1 (42.33 vs 40.58 ms;
# the update alone 5.47 vs 4.97 ms) and led at 3000 x 1 (56.01 vs 59.48). The step then still
# waited for the backward before launching the update onto an idle GPU. Now the step-graph
# update is queued before the loss is read (dit._update_unread: the NaN stop gates the update on
# the device). Rows: batch 1 at 750 and 1500 for both adapters; the recipe's default path for
# both adapters; a full 240 s song at batch 1 in both modes (LoKR), for `auto`.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
show() {
python3 - "$1" <<'PY'
import json, sys
for row in json.load(open(sys.argv[1]))["rows"]:
    keep = ("adapter", "compile", "crop", "batch", "fold", "step_ms", "step_ms_min", "audio_s_per_s", "mfu", "peak_gib", "peak_reserved_gib", "step_graphs", "error")
    print({k: row.get(k) for k in keep if k in row})
    print("   all", row.get("step_ms_all"), "losses", row.get("losses"))
PY
}
bench() {  # name limit args...
  local name=$1 limit=$2; shift 2
  pkill -9 -f "bench/dit_bench.py|compile_worker" 2>/dev/null; sleep 2
  timeout $limit python3 bench/dit_bench.py --models 2b --steps 16 --warmup 3 --batches 1 "$@" --time-budget-s $((limit - 10)) --out $OUT/$name.json > $OUT/$name.log 2>&1
  echo "$name rc=$?"; show $OUT/$name.json
}
bench s13c_short 230 --compile step-graph --adapters lokr512,lora64 --crops 750,1500
bench s13c_recipe 150 --compile step-graph --adapters lokr512,lora64 --crops 1248 --grad-accum 4 --fold 4
bench s13c_song 160 --compile step-graph,reduce-overhead --adapters lokr512 --crops 6000 --steps 10
