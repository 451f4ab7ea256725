#!/bin/bash
# Session 11, fourth call (issues 6 and 7), ~9 min, carry [".device_wheels"]. XL at batch 2 with
# the fused LoKR backward against LoRA r64 (the seventh run's XL LoRA b2: 357.56 ms; XL LoKR has
# not been timed since its kernels landed), then the 4B LM step with hybrid Muon (left from
# session 7). Each row in its own process; a fresh machine compiles the first one.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
B="python3 bench/dit_bench.py --steps 12 --warmup 3 --compile reduce-overhead --models xl --crops 6000 --batches 2 --optimizer-time"
row() {  # name timeout args...
  local name=$1 limit=$2; shift 2
  timeout $limit $B "$@" --time-budget-s $((limit - 10)) --out $OUT/$name.json > /tmp/$name.log 2>&1
  echo "$name rc=$? $(grep -h '"step_ms"\|"error": "[^"]' /tmp/$name.log | head -1 | cut -c1-330)"
}
row xl_lokr_fused_b2 220 --adapters lokr512 --fused-mix
row xl_lora_b2 170 --adapters lora64
timeout 140 python3 bench/lm_bench.py --steps 8 --sizes 4B --configs song_ro_muon --out $OUT/lm_4b_muon.json > /tmp/lm_4b_muon.log 2>&1; echo "lm 4B muon rc=$?"
grep -E "^\| 4B|Error" /tmp/lm_4b_muon.log | head -3
