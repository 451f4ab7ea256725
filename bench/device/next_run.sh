#!/bin/bash
# First call of the next session (issue 6 follow-ups), ~9 min, carry [".device_wheels"] (build
# the kit first in a fresh checkout: bash bench/device/make_wheels.sh). Session 13 made
# "step-graph" (one CUDA graph per step) the GPU default and left three things unmeasured:
# 1. a capture of padded batches (masked attention and loss; the bench never padded): songs of
#    600 and 400 frames with 256 / 128 padded condition tokens, 750-frame crops at batch 2 (the
#    400-frame song pads to 600), LoKR and LoRA. Expect one capture and replays, no "failure",
#    and finite losses;
# 2. LoKR 512 at 750 x 1 with the cross-attention K/V merged (KRON_MERGED_MIN_TOKENS 512 merges
#    their 769 rows; session 13's 750 x 1 row ran them factored), with LoRA r64 beside it;
# 3. XL with step graphs at 6000 x 2 (thirteenth run, per-block graphs: LoKR 1312, LoRA 1316
#    audio-s/s).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
bench() {  # name limit args...
  local name=$1 limit=$2; shift 2
  pkill -9 -f "bench/dit_bench.py|compile_worker" 2>/dev/null; sleep 2
  timeout $limit python3 bench/dit_bench.py --compile step-graph --steps 12 --warmup 3 "$@" --time-budget-s $((limit - 10)) --out $OUT/$name.json > $OUT/$name.log 2>&1
  echo "$name rc=$?"
  python3 -c "
import json
for r in json.load(open('$OUT/$name.json'))['rows']:
    print({k: r.get(k) for k in ('model','adapter','crop','batch','step_ms','step_ms_min','audio_s_per_s','peak_reserved_gib','finite','step_graphs','frames','error') if k in r}); print('   all', r.get('step_ms_all'))
"
}
bench s14_padded 170 --models 2b --adapters lokr512,lora64 --crops 750 --batches 2 --padded-frames 600
bench s14_750 150 --models 2b --adapters lokr512,lora64 --crops 750 --batches 1
bench s14_xl 230 --models xl --adapters lokr512,lora64 --crops 6000 --batches 2 --steps 8
