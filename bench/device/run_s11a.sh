#!/bin/bash
# Session 11, first call (issue 6), ~6 min measured, carry [".device_wheels"]. Session 10 left
# LoKR 512 1.7-2.4% behind LoRA r64 at batch 2 (run_s10c.sh) and put the fused pair sums + mix
# kernel in, off by default until measured (`kron_kernels.pair_partials_mix`,
# `adapters.FUSED_MIX`, `dit_bench --fused-mix`; checked in Triton's CPU interpreter in float32,
# never on a GPU). It saves one read of an activation-sized operand per
# adapted Linear: ~7.7 GB, ~2 ms per batch-2 step (arithmetic, adapters.FUSED_MIX). This call:
# (1) the kernel bench: self-checks of both kernels per shape (bf16 on the H200), the fused
#     kernel against the kernel plus a separate mix;
# (2) batch 2, 2B, 6000 frames, CUDA graphs, Muon's default: LoKR --fused-mix, LoRA r64, LoKR
#     as now (unfused), LoKR --fused-mix again; each row in its own process. Six files come back (the
#     device returns at most 8): the JSONs and the first row's log.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout 100 python3 bench/kron_kernel_bench.py --out $OUT/kron_kernel.json > /tmp/kron_kernel.log 2>&1; echo "kron bench rc=$?"
cut -c1-400 /tmp/kron_kernel.log | grep -v "^$" | tail -10
B="python3 bench/dit_bench.py --steps 20 --warmup 4 --compile reduce-overhead --models 2b --crops 6000 --batches 2 --optimizer-time"
row() {  # name timeout args...
  local name=$1 limit=$2; shift 2
  local log=/tmp/$name.log
  [ "$name" = lokr_fused ] && log=$OUT/$name.log
  timeout $limit $B "$@" --time-budget-s $((limit - 8)) --out $OUT/$name.json > $log 2>&1
  echo "$name rc=$? $(grep -h '"step_ms"\|"error": "[^"]' $log | head -1 | cut -c1-330)"
}
row lokr_fused 150 --adapters lokr512 --fused-mix
row lora 90 --adapters lora64
row lokr_unfused 90 --adapters lokr512
row lokr_fused2 90 --adapters lokr512 --fused-mix
grep -h "lokr_kernels" -A8 $OUT/lokr_fused.log | head -10
