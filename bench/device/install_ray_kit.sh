#!/bin/bash
# Device side of bench/device/make_ray_kit.sh. Run it in each call that carries a part; the parts
# wait in /tmp/ray_kit (a warm machine keeps /tmp for 30 s after a call), and once all are there
# the wheel is joined and installed, with the wheels of .device_ray2, into /tmp/site.
# Prints "ray kit: installed" or "ray kit: waiting for part 2".
set -euo pipefail
mkdir -p /tmp/ray_kit/deps
for folder in .device_ray1 .device_ray2; do
  [ -d "$folder" ] || continue
  cp -f "$folder"/*.part* /tmp/ray_kit/
  cp -f "$folder"/*.whl /tmp/ray_kit/deps/ 2>/dev/null || true
done
if ! ls /tmp/ray_kit/*.part01 >/dev/null 2>&1 || ! ls /tmp/ray_kit/*.part00 >/dev/null 2>&1; then
  echo "ray kit: waiting for part 2"
  exit 0
fi
name=$(basename "$(ls /tmp/ray_kit/*.part00)" .part00)
cat /tmp/ray_kit/"$name".part* > "/tmp/ray_kit/$name"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site "/tmp/ray_kit/$name" /tmp/ray_kit/deps/*.whl
echo "ray kit: installed"
