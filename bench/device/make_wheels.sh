#!/bin/bash
# The wheel kit the device scripts install (`.device_wheels/`, gitignored; carry it with
# `carry: [".device_wheels"]`). The device machine has Python 3.12, torch, transformers and peft
# but not our pinned diffusers/transformers, pydantic, soundfile or soxr (the resampler); soundfile's manylinux wheel
# needs cffi (and pycparser) beside it, or `import transformers` fails on its audio utilities.
# Versions are read from constraints.txt, so the kit matches CI. ~25 MiB, under the 64 MiB carry.
set -euo pipefail
cd "$(dirname "$0")/../.."
names="diffusers transformers importlib_metadata regex pydantic pydantic_core annotated-types typing-inspection soundfile cffi pycparser soxr"
pins=()
for name in $names; do
  pin=$(grep -i -E "^${name//[-_]/[-_]}==" constraints.txt) || { echo "no pin for $name in constraints.txt" >&2; exit 1; }
  pins+=("$pin")
done
rm -rf .device_wheels  # a kit with two versions of one package would fail to install
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d .device_wheels "${pins[@]}"
ls .device_wheels
