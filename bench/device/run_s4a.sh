#!/bin/bash
# Session 4, first measurement call (existing code): the LM trainer's compiled layers on 4B
# (issue 7) and the planner's "compiled" decode engine on 1.7B (issue 8). One `run`, carry
# [".device_wheels"], ~9 min (timeouts); each bench rewrites its JSON after every row.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
ROWS='^\| |Error|error|Traceback|skipping cudagraphs|recompil'
timeout 300 python3 bench/lm_bench.py --steps 8 --sizes 4B --configs song song_compile pack4_varlen_compile song_ro --out $OUT/lm_4b 2>&1 | grep -E "$ROWS" | cut -c1-300
timeout 210 python3 bench/audition_bench.py --sections lm --decode-modes compiled,graph --lm-seconds 240,30 --lm-repeat 2 --lm-profile --budget-s 180 --out $OUT/audition_lm_compiled.json 2>&1 | grep -E 'Error|error|Traceback|failed|WARNING|decoding with' | cut -c1-300
