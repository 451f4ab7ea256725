"""Muon's update on a DiT adapter's real factor shapes: time per step and Newton–Schulz error by
precision (`optim.Muon(ns_precision=...)`), no model needed.

The parameters are the trainable matrices of one adapter on every layer of the full-size 2B or XL
DiT (`dit_vram.targeted_linears` shapes; LoKR by LyCORIS's factor rules), random, with random
gradients. Per (adapter, precision): the median wall time of `Muon.step` (synchronised; bucketed
as the trainer builds it, one bucket per shape on CUDA) and, on one slab of every shape, the
largest relative deviation of `optim.newton_schulz` from the same iteration in float64
(max |x - ref| / max |ref|). The AdamW half of the hybrid (LoKR's w1, biases) is not included.

    python3 bench/muon_bench.py --out $OUT/muon_bench.json
    python3 bench/muon_bench.py --device cpu --models 2b --adapters lora64 --repeat 1 --layers 2
    (dry run)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, no install

from hotstep_ray.core.precision import tf32_matmuls  # noqa: E402
from hotstep_ray.models import full_configs as fc  # noqa: E402
from hotstep_ray.training import dit_vram, optim  # noqa: E402
from hotstep_ray.training.adapters import AdapterSpec  # noqa: E402

SPECS = {
    "lora64": AdapterSpec(kind="lora", rank=64, alpha=128),
    "lokr512": AdapterSpec(kind="lokr", rank=512, alpha=512, factor=6, decompose_both=True),
}
MUON_MIN_DIM = 16  # the trainers' default split (`muon_min_dim`)


def matrix_shapes(
    layout: str, spec: AdapterSpec, layers: int | None = None
) -> list[tuple[int, int]]:
    """Every Muon-bound matrix of `spec` on all layers, or on the first `layers` (the rest,
    e.g. LoKR's 4-6-a-side w1, is AdamW's)."""
    dims = dit_vram.DitDims.from_config(fc.dit_config(layout))
    per_layer = [
        shape
        for shape in dit_vram.adapter_matrices(dims, spec)
        if optim.is_muon_param(torch.empty(shape, device="meta"), MUON_MIN_DIM)
    ]
    return per_layer * (dims.layers if layers is None else min(layers, dims.layers))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_muon(shapes: list[tuple[int, int]], precision: str, device: torch.device):
    """Random parameters of `shapes` with random gradients, under the trainers' Muon."""
    generator = torch.Generator(device).manual_seed(0)
    params = [
        torch.nn.Parameter(torch.randn(s, device=device, generator=generator) * 0.02)
        for s in shapes
    ]
    for param in params:
        param.grad = torch.randn(param.shape, device=device, generator=generator) * 1e-3
    named = [(str(i), p) for i, p in enumerate(params)]
    return optim.build_optimizer(
        named, "muon", muon_min_dim=MUON_MIN_DIM, muon_ns_precision=precision
    ).muon


def step_ms(muon: optim.Muon, device: torch.device, repeat: int) -> float:
    muon.step()  # lazy state
    synchronize(device)
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        muon.step()
        synchronize(device)
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 2)


def ns_error(muon: optim.Muon, shape: tuple[int, int], device: torch.device) -> float:
    """Largest deviation of `muon`'s Newton–Schulz (its coefficients, steps, precision and
    path: per parameter in bf16, bucketed otherwise) from the same iteration in float64."""
    group = muon.param_groups[0]
    ns = (group["ns_coefficients"], group["ns_steps"], group["eps"])
    generator = torch.Generator(device).manual_seed(1)
    grad = torch.randn(shape, device=device, generator=generator, dtype=torch.float64)
    reference = optim.newton_schulz(grad, *ns, torch.float64)
    if muon.ns_precision == "bfloat16":
        got = optim.newton_schulz(grad.float(), *ns, muon.ns_dtype)
    else:
        stack = grad.float().unsqueeze(0)  # the bucketed path's [N, m, n] form
        with tf32_matmuls() if muon.ns_precision == "tf32" else contextlib.nullcontext():
            got = optim.newton_schulz(stack, *ns, muon.ns_dtype)[0]
    return float((got.double() - reference).abs().max() / reference.abs().max())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("muon_bench.json"))
    parser.add_argument("--models", default="2b,xl")
    parser.add_argument("--adapters", default="lora64,lokr512")
    parser.add_argument("--precisions", default="float32,tf32,bfloat16,bfloat16_batched")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--device", default="cuda")
    # a CPU without bfloat16 matmul units takes minutes over all layers; a dry run needs few
    parser.add_argument("--layers", type=int, default=None, help="first N layers only")
    args = parser.parse_args()
    device = torch.device(args.device)
    rows: list[dict[str, Any]] = []
    for layout in args.models.split(","):
        for adapter in args.adapters.split(","):
            shapes = matrix_shapes(layout, SPECS[adapter], args.layers)
            flops = sum(5 * (4 * min(s) ** 2 * max(s) + 2 * min(s) ** 3) for s in shapes)
            for precision in args.precisions.split(","):
                row: dict[str, Any] = {
                    "model": layout,
                    "adapter": adapter,
                    "precision": precision,
                    "matrices": len(shapes),
                    "ns_tflop": round(flops / 1e12, 3),
                }
                try:
                    muon = build_muon(shapes, precision, device)
                    row["step_ms"] = step_ms(muon, device, args.repeat)
                    row["ns_max_rel_error"] = max(
                        round(ns_error(muon, s, device), 6) for s in sorted(set(shapes))
                    )
                except Exception as exc:  # one failed row must not lose the others
                    row["error"] = repr(exc)[:300]
                rows.append(row)
                print(json.dumps(row), flush=True)
                args.out.write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
