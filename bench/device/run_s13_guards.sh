#!/bin/bash
# Session 13, first call (issue 6; written in session 12 as next_run.sh), ~8.5 min, carry [".device_wheels"] (build the kit
# first in a fresh checkout: bash bench/device/make_wheels.sh). Session 12 left
# one gap: at batch 1 on 750- and 1500-frame crops LoKR 512 trails LoRA r64 by 12-17 ms
# (run_s12b/c/e.sh), with the same GPU kernel time per step (32.3 ms) and a host-bound step.
# The timeline (run_s12f.sh) puts the difference in the forward's host time per block: Dynamo's
# cache lookup (guard evaluation) 389 against 167 us (mean), the compiled call 567 against
# 366 us (median).
# Since then a LoKR block carries fewer guards (KronLinear.forward no longer reads peft's
# `_available_adapters`; tiny block 1720 -> 1409 guards, LoRA 1446): the LoKR row measures that.
# Each row: 750 x 1, the timed steps, then the same steps alternately with and without the guards
# (`--guards-ab`, a measurement only), with Dynamo's guard and recompile logs kept in $OUT (how
# many guards each adapter's block carries on CUDA, and whether anything recompiles).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .device_wheels/*.whl
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
row() {  # name timeout args...
  local name=$1 limit=$2; shift 2
  pkill -9 -f "bench/dit_bench.py|compile_worker" 2>/dev/null; sleep 2
  TORCH_LOGS=guards,recompiles timeout $limit python3 bench/dit_bench.py --compile reduce-overhead --models 2b --steps 12 --warmup 3 --crops 750 --batches 1 "$@" --time-budget-s $((limit - 8)) --out $OUT/$name.json > /tmp/$name.log 2>&1
  echo "$name rc=$? $(grep -h '"step_ms"\|"error": "[^"]' /tmp/$name.log | head -1 | cut -c1-330)"
  # the guard dumps: how many guards of each kind, per compiled graph
  python3 - /tmp/$name.log > $OUT/$name.guards.txt <<'PY'
import collections, re, sys
text = open(sys.argv[1], errors="replace").read()
dumps = text.split("GUARDS:")[1:]
# three graphs per adapter are expected (first block, sliding-window and full-attention blocks)
print("graphs compiled:", len(dumps), "recompile lines:", text.count("Recompiling"))
print("guard eval latency (us) per graph:", re.findall(r"Guard eval latency = ([\d.]+) us", text))
for dump in dumps:  # the guards alone: the tree's *Manager nodes are not guards
    kinds = collections.Counter(
        k for k in re.findall(r"\+- (\w+):", dump) if not k.endswith("Manager")
    )
    print(sum(kinds.values()), dict(kinds.most_common(12)))
PY
  [ "${KEEP_LOG:-1}" = 1 ] && gzip -c /tmp/$name.log > $OUT/$name.log.gz  # 8 files come back
}
row lokr_750_b1_guards 170 --adapters lokr512 --guards-ab
row lora_750_b1_guards 150 --adapters lora64 --guards-ab
# the trainer's own policy (dit.SKIP_SEEN_GUARDS, off by default; removed with its flag after this run): every timed step repeats the
# warm-up's shapes, so all of them skip; compare with the LoKR row's step_ms
# (the flag is gone since; this row runs only at f755b02)
# KEEP_LOG=0 row lokr_750_b1_skipseen 150 --adapters lokr512 --skip-seen-guards
cat $OUT/*.guards.txt
