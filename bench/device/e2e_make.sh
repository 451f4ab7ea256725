#!/bin/bash
# `hotstep-ray make` end to end on a GPU machine at real size, over two back-to-back device calls
# (the Ray kit does not fit one; make_ray_kit.sh says why):
#
#   call 1, carry [".device_wheels", ".device_ray1"]:  bash bench/device/e2e_make.sh prepare
#       the wheel kit, Ray's first part, the random tree (2B DiT, LM $LM) and $SONGS songs of
#       $SECONDS_PER_SONG s with Side-Step sidecars, all under /tmp
#   call 2 within 30 s, carry [".device_ray2"]:        bash bench/device/e2e_make.sh run [ARGS]
#       Ray's second part, then `hotstep-ray make /tmp/e2e/songs --checkpoints /tmp/e2e/tree
#       ARGS` on a local Ray, nvidia-smi sampled every second beside it
#
# $OUT gets make.log, result.json (the main job's) and gpu.csv (utilisation %, memory MiB).
set -u
LM=${LM:-0.6B}
SONGS=${SONGS:-4}
SECONDS_PER_SONG=${SECONDS_PER_SONG:-240}
OUT=${OUT:-/tmp/e2e/out}
mkdir -p "$OUT" /tmp/e2e
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
phase=${1:?prepare or run}
shift

if [ "$phase" = prepare ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .device_wheels/*.whl
  bash bench/device/install_ray_kit.sh
  start=$SECONDS
  python3 - "$LM" <<'EOF'
import sys
from hotstep_ray.core.contracts import MakeRandomOptions
from hotstep_ray.models.random_tree import tree_configs, write_random_tree
options = MakeRandomOptions(dit="2b", lm=sys.argv[1], force=True)
write_random_tree("/tmp/e2e/tree", tree_configs(options), force=True, say=print)
EOF
  echo "tree: $((SECONDS - start)) s"
  python3 - "$SONGS" "$SECONDS_PER_SONG" <<'EOF'
import sys
from pathlib import Path
from hotstep_ray.audio.io import encode_audio
from hotstep_ray.audio.synth import SongSpec, render_song
count, seconds = int(sys.argv[1]), float(sys.argv[2])
folder = Path("/tmp/e2e/songs")
folder.mkdir(parents=True, exist_ok=True)
keys = [("A", "minor", 92), ("E", "major", 120), ("D", "minor", 100), ("G", "major", 128)]
for i in range(count):
    root, mode, bpm = keys[i % len(keys)]
    spec = SongSpec(f"song {i}", bpm, root, mode, seconds, seed=i)
    (folder / f"song_{i:02d}.wav").write_bytes(encode_audio(render_song(spec), 48_000, "WAV"))
    (folder / f"song_{i:02d}.txt").write_text(
        f"caption: A {mode}-key synth groove at {bpm} BPM\nbpm: {bpm}\nkey: {root} {mode}\n"
        "signature: 4/4\nis_instrumental: true\nlyrics:\n[Instrumental]\n"
    )
print(f"{count} songs of {seconds:g} s in {folder}")
EOF
  exit 0
fi

bash bench/device/install_ray_kit.sh
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader,nounits \
  -l 1 > "$OUT/gpu.csv" &
sampler=$!
start=$SECONDS
python3 -m hotstep_ray.cli.main make /tmp/e2e/songs --checkpoints /tmp/e2e/tree \
  --data /tmp/e2e/data --json "$@" > "$OUT/result.json" 2> "$OUT/make.log"
rc=$?
echo "make: rc=$rc, $((SECONDS - start)) s"
kill $sampler
tail -40 "$OUT/make.log"
