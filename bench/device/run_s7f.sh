#!/bin/bash
# Session 7, sixth call (issue 6), carry [".device_wheels"], ~5 min: LoKR 512 at batch 2, 6000
# frames, CUDA graphs, with `--kron-forward merged` (one Linear on W + scale·(w1 ⊗ w2) built per
# call, `adapters.MergedKron`) against this session's factored 197.89 ms; then LoRA r64 at the
# same shape for a same-session comparison (153.6 ms in session 5's run).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
B="python3 bench/dit_bench.py --steps 5 --warmup 2 --compile reduce-overhead --models 2b --crops 6000 --batches 2"
timeout 175 $B --adapters lokr512 --time-budget-s 160 --kron-forward merged --out $OUT/dit_lokr_merged.json > $OUT/dit_merged.log 2>&1; echo "merged rc=$?"
grep '"step_ms"' $OUT/dit_merged.log; grep -E "Error|error" $OUT/dit_merged.log | head -5
timeout 140 $B --adapters lora64 --time-budget-s 125 --out $OUT/dit_lora.json > $OUT/dit_lora.log 2>&1; echo "lora rc=$?"
grep '"step_ms"' $OUT/dit_lora.log
python3 -c "
import json, os
for name in ('dit_lokr_merged', 'dit_lora'):
  r = json.load(open(os.environ['OUT'] + '/' + name + '.json'))['rows'][0]
  print(name, {k: r.get(k) for k in ('step_ms', 'step_ms_all', 'audio_s_per_s', 'mfu', 'peak_reserved_gib', 'losses', 'error')})
" 2>&1
