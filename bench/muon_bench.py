"""Muon's update on a DiT adapter's real factor shapes: time per step and Newton–Schulz error by
precision (`optim.Muon(ns_precision=...)`), no model needed.

The parameters are the trainable matrices of one adapter on every layer of the full-size 2B or XL
DiT (`dit_vram.targeted_linears` shapes; LoKR by LyCORIS's factor rules), random, with random
gradients. Per (adapter, precision): the median wall time of `Muon.step` (synchronised; bucketed
as the trainer builds it, one bucket per shape on CUDA) and, on one slab of every shape, the
largest relative deviation of `optim.newton_schulz` from the same iteration in float64
(max |x - ref| / max |ref|). The AdamW half of the hybrid (LoKR's w1, biases) is not included.

    python3 bench/muon_bench.py --out $OUT/muon_bench.json
    python3 bench/muon_bench.py --device cpu --models 2b --adapters lora64 --repeat 1  (dry run)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, no install

from hotstep_ray.models import full_configs as fc  # noqa: E402
from hotstep_ray.training import dit_vram, optim  # noqa: E402
from hotstep_ray.training.adapters import AdapterSpec, lokr_shape  # noqa: E402

SPECS = {
    "lora64": AdapterSpec(kind="lora", rank=64, alpha=128),
    "lokr512": AdapterSpec(kind="lokr", rank=512, alpha=512, factor=6, decompose_both=True),
}
NS = (3.4445, -4.7750, 2.0315)


def matrix_shapes(layout: str, spec: AdapterSpec) -> list[tuple[int, int]]:
    """Every Muon-bound matrix of `spec` on all layers (both sides >= 16)."""
    dims = dit_vram.DitDims.from_config(fc.dit_config(layout))
    per_layer: list[tuple[int, int]] = []
    for _, fan_in, fan_out, _ in dit_vram.targeted_linears(dims, spec):
        if spec.kind == "lora":
            per_layer += [(spec.rank, fan_in), (fan_out, spec.rank)]
            continue
        shape = lokr_shape(fan_in, fan_out, spec)
        if shape.w2_full:
            per_layer.append((shape.out_k, shape.in_n))
        else:  # LyCORIS's low-rank w2: w2_a [out_k, dim] @ w2_b [dim, in_n]
            per_layer += [(shape.out_k, spec.rank), (spec.rank, shape.in_n)]
        if not shape.w1_full:
            per_layer += [(shape.out_l, spec.rank), (spec.rank, shape.in_m)]
        # a full w1 [out_l, in_m] (4-6 a side) is AdamW's; so is any side under 16
    return [s for s in per_layer if min(s) >= 16] * dims.layers


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_ms(shapes: list[tuple[int, int]], precision: str, device: torch.device, repeat: int):
    generator = torch.Generator(device).manual_seed(0)
    params = [
        torch.nn.Parameter(torch.randn(s, device=device, generator=generator) * 0.02)
        for s in shapes
    ]
    for param in params:
        param.grad = torch.randn(param.shape, device=device, generator=generator) * 1e-3
    muon = optim.build_optimizer(
        [(str(i), p) for i, p in enumerate(params)], "muon", muon_ns_precision=precision
    ).muon
    muon.step()  # lazy state
    synchronize(device)
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        muon.step()
        synchronize(device)
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 2)


def ns_error(shape: tuple[int, int], precision: str, device: torch.device) -> float:
    generator = torch.Generator(device).manual_seed(1)
    grad = torch.randn(shape, device=device, generator=generator, dtype=torch.float64)
    reference = optim.newton_schulz(grad, NS, 5, 1e-7, torch.float64)
    stack = grad.float().unsqueeze(0)  # the bucketed path's [N, m, n] form
    if precision == "bfloat16":
        got = optim.newton_schulz(grad.float(), NS, 5, 1e-7, torch.bfloat16)
    elif precision == "tf32":
        with optim.tf32_matmuls():
            got = optim.newton_schulz(stack, NS, 5, 1e-7)[0]
    else:
        got = optim.newton_schulz(stack, NS, 5, 1e-7)[0]
    return float((got.double() - reference).abs().max() / reference.abs().max())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("muon_bench.json"))
    parser.add_argument("--models", default="2b,xl")
    parser.add_argument("--adapters", default="lora64,lokr512")
    parser.add_argument("--precisions", default="float32,tf32,bfloat16")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device = torch.device(args.device)
    rows: list[dict[str, Any]] = []
    for layout in args.models.split(","):
        for adapter in args.adapters.split(","):
            shapes = matrix_shapes(layout, SPECS[adapter])
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
                    row["step_ms"] = step_ms(shapes, precision, device, args.repeat)
                    row["ns_max_rel_error"] = max(
                        round(ns_error(s, precision, device), 6) for s in sorted(set(shapes))
                    )
                except Exception as exc:  # one failed row must not lose the others
                    row["error"] = repr(exc)[:300]
                rows.append(row)
                print(json.dumps(row), flush=True)
                args.out.write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
