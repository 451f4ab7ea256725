"""GPU sweep of the Oobleck fast path's Triton kernels (`hotstep_ray.models.oobleck_kernels`):
tile / warp / stage choices of the fused residual kernel per channel count, and rows per program
/ warps of the channels-last Snake, on the shapes one 1536-frame encoder window gives.

Each configuration runs on the same random channels-last [1, C, 1, T] tensors, timed with CUDA
events (median of `--reps` after a warm-up), and is checked against the current configuration's
output (max |difference|; only the accumulation order may differ). Prints one JSON line per
shape with the current and the best configuration, their ms and GB/s (bytes the kernel must
move: the residual kernel reads h and x and writes out, 3 passes; the Snake 2), and writes
everything to `--out`.

    python3 bench/oobleck_kernel_sweep.py --out $OUT/kernel_sweep.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, no install

from hotstep_ray.models import oobleck_kernels as ok  # noqa: E402

WINDOW_SAMPLES = 1536 * 1920  # one encoder window of audio samples
# (channels, length) of the encoder's residual units for one window: level 0 at full rate, then
# the strides 2, 4, 4 (channel multiples 1, 1, 2, 4)
RESIDUAL_SHAPES = [(128, WINDOW_SAMPLES), (128, WINDOW_SAMPLES // 2), (256, WINDOW_SAMPLES // 8)]
SNAKE_SHAPES = RESIDUAL_SHAPES + [(512, WINDOW_SAMPLES // 32)]


def bench(fn, reps: int) -> float:
    """Median ms of `fn()` over `reps` CUDA-event-timed calls, after two warm-up calls."""
    fn(), fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def channels_last(c: int, t: int, generator: torch.Generator) -> torch.Tensor:
    x = torch.randn(1, c, 1, t, generator=generator, device="cuda", dtype=torch.bfloat16)
    return x.contiguous(memory_format=torch.channels_last)


def sweep(
    launch: Callable[[tuple[int, ...]], torch.Tensor],
    current: tuple[int, ...],
    configs: list[tuple[int, ...]],
    gbytes: float,
    reps: int,
) -> dict[str, Any]:
    """Time `launch(cfg)` for the current configuration and every other one in `configs`,
    each checked against the current one's output. {"current", "best", "top5", "tried",
    "results"}: results are the configurations that ran (one that does not fit, e.g. out of
    shared memory, is counted in "tried" only)."""
    current = tuple(current)
    reference = launch(current)
    results = []
    tried = [current] + [tuple(cfg) for cfg in configs if tuple(cfg) != current]
    for cfg in tried:
        try:
            diff = float((launch(cfg).float() - reference.float()).abs().max())
            ms = bench(lambda cfg=cfg: launch(cfg), reps)
        except Exception:  # this tile / program size does not fit the kernel
            continue
        results.append({"cfg": cfg, "ms": ms, "gb_s": gbytes / ms * 1e3, "max_diff": diff})
    ranked = sorted(results, key=lambda r: r["ms"])
    return {
        "current": results[0],
        "best": ranked[0],
        "top5": ranked[:5],
        "tried": len(tried),
        "results": results,
    }


def residual_sweep(c: int, t: int, reps: int) -> dict[str, Any]:
    generator = torch.Generator(device="cuda").manual_seed(c + t)
    h, x = channels_last(c, t, generator), channels_last(c, t, generator)
    w_t = (torch.randn(c, c, generator=generator, device="cuda") / c**0.5).bfloat16()
    vec = [torch.rand(c, generator=generator, device="cuda") + 0.5 for _ in range(4)]
    kernel = ok._triton_residual_kernel()
    rows = t

    def launch(cfg: tuple[int, int, int, int, int]) -> torch.Tensor:
        block_m, block_n, block_k, warps, stages = cfg
        out = torch.empty_like(x)
        grid = (ok.triton_cdiv(rows, block_m) * (c // block_n),)
        kernel[grid](
            h, x, w_t, *vec, out, rows, c,
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
            FAST_SIN=ok.RESIDUAL_FAST_SIN, num_warps=warps, num_stages=stages,
        )  # fmt: skip
        return out

    configs = [
        cfg
        for cfg in itertools.product((64, 128, 256), (64, 128, 256), (32, 64), (4, 8), (3,))
        if cfg[1] <= c and cfg[2] <= c and cfg[0] * cfg[1] <= 256 * 128
    ]
    gbytes = 3 * h.numel() * h.element_size() / 1e9  # read h and x, write out
    found = sweep(launch, ok.RESIDUAL_TILES[c], configs, gbytes, reps)
    return {"kernel": "residual", "channels": c, "rows": rows, **found}


def snake_sweep(c: int, t: int, reps: int) -> dict[str, Any]:
    generator = torch.Generator(device="cuda").manual_seed(7 * c + t)
    x = channels_last(c, t, generator)
    alpha, inv_beta, shift = (torch.rand(c, generator=generator, device="cuda") for _ in range(3))
    _, snake_nwc, next_power_of_2 = ok._triton_kernels()
    width = next_power_of_2(c)
    rows = t

    def launch(cfg: tuple[int, int]) -> torch.Tensor:
        elements, warps = cfg
        per_program = max(1, elements // width)
        out = torch.empty_like(x)
        snake_nwc[(ok.triton_cdiv(rows, per_program),)](
            x, alpha, inv_beta, shift, out, rows, c,
            ROWS=per_program, CH=width, HAS_SHIFT=True, FAST_SIN=True, num_warps=warps,
        )  # fmt: skip
        return out

    configs = list(itertools.product((2048, 4096, 8192, 16384, 32768), (2, 4, 8, 16)))
    gbytes = 2 * x.numel() * x.element_size() / 1e9  # read x, write out
    current = ok.SNAKE_NWC_CONFIGS.get(width, ok.SNAKE_NWC_CONFIG)
    found = sweep(launch, current, configs, gbytes, reps)
    return {"kernel": "snake_nwc", "channels": c, "rows": rows, **found}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--kernels", default="snake,residual", help="comma list")
    parser.add_argument(
        "--out", default=os.path.join(os.environ.get("OUT", "."), "kernel_sweep.json")
    )
    args = parser.parse_args()
    if not torch.cuda.is_available() or not ok.triton_usable():
        raise SystemExit("needs a CUDA GPU and Triton")
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(), "shapes": []}
    kernels = args.kernels.split(",")
    jobs = [(snake_sweep, s) for s in SNAKE_SHAPES if "snake" in kernels]
    jobs += [(residual_sweep, s) for s in RESIDUAL_SHAPES if "residual" in kernels]
    for sweep, (c, t) in jobs:
        found = sweep(c, t, args.reps)
        report["shapes"].append(found)
        Path(args.out).write_text(json.dumps(report, indent=1))
        brief = {k: found[k] for k in ("kernel", "channels", "rows", "current", "best")}
        print(json.dumps(brief), flush=True)


if __name__ == "__main__":
    main()
