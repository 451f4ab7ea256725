#!/bin/bash
# Session 4, LM call: CUDA graphs in the real LM trainer against eager (epoch losses, tiny LM,
# grad_accum 2, several row widths), then 4B steps with the warm-up cache released.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 170 python3 bench/lm_graph_check.py --modes off,reduce-overhead,auto --out $OUT/lm_graph_check.json 2>&1 | grep -E '^\{|Error|Traceback' | cut -c1-700
timeout 230 python3 bench/lm_bench.py --steps 8 --sizes 4B --configs song_ro pack2_varlen_ro song_fit16_compile --new-shape song_ro --out $OUT/lm_4b 2>&1 | grep -E '^\| |Error|error|Traceback|skipping cudagraphs' | cut -c1-300
python3 -c "
import json,os
for r in json.load(open(os.environ['OUT']+'/lm_4b/lm_bench.json'))['results']:
    print({k: r.get(k) for k in ('config','ms_step','mfu','mfu_at_790','peak_gib','reserved_gib','checkpointed_layers','new_shape_ms','graphs','error')})
"
