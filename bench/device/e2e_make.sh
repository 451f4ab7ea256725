#!/bin/bash
# `hotstep-ray bench e2e` (`hotstep-ray make` end to end, timed stage by stage, cold and warm) on a
# GPU machine at real size, over two back-to-back device calls (the Ray kit does not fit one;
# make_ray_kit.sh says why):
#
#   call 1, carry [".device_wheels", ".device_ray1"]:  bash bench/device/e2e_make.sh prepare
#       the wheel kit and Ray's first part, then the random tree ($DIT DiT, $LM LM) and $SONGS
#       songs of $SECONDS_PER_SONG s with Side-Step sidecars under $WORK
#       (`python3 -m hotstep_ray.bench_e2e prepare`: the CLI's typer comes with Ray's second part)
#   call 2 within 30 s, carry [".device_ray2"]:        bash bench/device/e2e_make.sh run [ARGS]
#       Ray's second part, then `hotstep-ray bench e2e ARGS` on the tree and songs call 1 wrote
#       (by default a cold and a warm `make`, each its own process on a local Ray), nvidia-smi
#       sampled every second beside it
#
# $OUT gets e2e.json (the bench's report), each run's make log and result JSON, and gpu.csv
# (timestamp, utilisation %, memory MiB).
set -u
DIT=${DIT:-2b}
LM=${LM:-0.6B}
SONGS=${SONGS:-4}
SECONDS_PER_SONG=${SECONDS_PER_SONG:-240}
WORK=${WORK:-/tmp/e2e}
OUT=${OUT:-$WORK/out}
mkdir -p "$OUT" "$WORK"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
phase=${1:?prepare or run}
shift
# Both phases name the same inputs, so the run finds the tree and the songs the prepare wrote.
inputs=(--work "$WORK" --dit "$DIT" --lm "$LM" --songs "$SONGS" --seconds "$SECONDS_PER_SONG")

# The machine sets PYTHONDONTWRITEBYTECODE and the kits install with --no-compile, so without
# this every process would compile each package's source on import (seconds per Ray worker);
# a user's `pip install` writes the bytecode once, and so does this (py_compile ignores the flag).
compile_site() {
  # the machine's own torch came without bytecode too
  torch_dir=$(python3 -c "import importlib.util as u; print(u.find_spec('torch').submodule_search_locations[0])")
  python3 -m compileall -q -j 0 /tmp/site "$torch_dir" "$PWD/hotstep_ray" "$PWD/serve_apps" >/dev/null
}

if [ "$phase" = prepare ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .device_wheels/*.whl
  bash bench/device/install_ray_kit.sh
  compile_site
  python3 -m hotstep_ray.bench_e2e prepare "${inputs[@]}"
  exit $?
fi

bash bench/device/install_ray_kit.sh
compile_site
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader,nounits \
  -l 1 > "$OUT/gpu.csv" &
sampler=$!
python3 -m hotstep_ray.cli.main bench e2e "${inputs[@]}" --out "$OUT/e2e.json" "$@"
rc=$?
kill $sampler
cp "$WORK"/logs/* "$OUT"/ 2>/dev/null
echo "bench e2e: rc=$rc"
exit $rc
