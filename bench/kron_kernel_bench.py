"""LoKR's w1-gradient reduction on one GPU: the Triton kernel against the batched GEMM.

For the shapes a 2B / XL LoKR 512 step feeds `adapters.w1_grad` (bf16, 3000 and 6000 tokens: a
240 s song at batch 1 and 2), one line per shape: the self-check's verdict, the kernel's largest
difference from a float32 batched GEMM of the same inputs, the median time of each path (CUDA
events, 50 calls after 5 warm-up calls; the kernel's time is its partials, not their sum) and the bandwidth the kernel reaches (bytes of x and y
read once per call). Then the fused kernel that also mixes one side's rows by w1
(`pair_partials_mix_triton`, side as `adapters.MergedKron` picks it) against the
kernel plus a separate mix (compiled `adapters.mix_rows`, the step's mix), and its
self-check. Each row is written as it finishes.

  device:   python bench/kron_kernel_bench.py --out $OUT/kron_kernel.json
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from the checkout

from hotstep_ray.training import adapters, kron_kernels  # noqa: E402

# (name, a, c, n): x [tokens, a, n], y [tokens, c, n] as `MergedKron.backward` passes them
SHAPES = (
    ("2b attention 2048x2048", 4, 4, 512),
    ("2b mlp gate/up 2048->6144", 6, 4, 1024),
    ("2b mlp down 6144->2048", 4, 6, 1024),
    # not an XL shape (XL's adapted Linears factor as 4 x 5 and 5 x 4): a square 5 x 5 case
    ("synthetic 2560x2560, a = c = 5", 5, 5, 512),
)


def timed_ms(fn, x: torch.Tensor, y: torch.Tensor, repeats: int = 50, warmup: int = 5) -> float:
    """Median ms of `fn(x, y)`."""
    for _ in range(warmup):
        fn(x, y)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(x, y)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


_COMPILED_MIX = torch.compile(adapters.mix_rows)  # the trainer's mix, Inductor-fused


def separate(x: torch.Tensor, y: torch.Tensor, m: torch.Tensor, side: int) -> None:
    """The kernel's partials, then the mix as its own pass (compiled `mix_rows`, as in the step)."""
    kron_kernels.pair_partials_triton(x, y)
    _COMPILED_MIX(x if side == 1 else y, m)


def fused(x: torch.Tensor, y: torch.Tensor, m: torch.Tensor, side: int) -> None:
    kron_kernels.pair_partials_mix_triton(x, y, m, side)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("kron_kernel.json"))
    parser.add_argument("--tokens", default="3000,6000")
    args = parser.parse_args()
    device = torch.device("cuda")
    dtype = torch.bfloat16
    rows = []
    for tokens in (int(t) for t in args.tokens.split(",")):
        for name, a, c, n in SHAPES:
            x = torch.randn(tokens, a, n, device=device, dtype=dtype)
            y = torch.randn(tokens, c, n, device=device, dtype=dtype)
            verdict = kron_kernels.triton_passes(device, dtype, a, c)
            row = {"shape": name, "tokens": tokens, "a": a, "c": c, "n": n, "self_check": verdict}
            row["bmm_ms"] = round(timed_ms(kron_kernels.pair_sums_bmm, x, y), 4)
            try:
                want = kron_kernels.pair_sums_bmm(x.float(), y.float())
                got = kron_kernels.pair_partials_triton(x, y).sum(0)
                row["max_abs_diff"] = (got - want).abs().max().item()
                row["scale"] = want.abs().max().item()
                row["triton_ms"] = round(timed_ms(kron_kernels.pair_partials_triton, x, y), 4)
                moved = (x.numel() + y.numel()) * x.element_size()
                row["triton_gb_s"] = round(moved / row["triton_ms"] / 1e6, 1)
                side = 2 if a < c else 1
                m = torch.randn((a, c) if side == 2 else (c, a), device=device, dtype=dtype)
                row["mix_side"] = side
                row["mix_self_check"] = kron_kernels.triton_mix_passes(device, dtype, a, c, side)

                split = functools.partial(separate, m=m, side=side)
                row["separate_ms"] = round(timed_ms(split, x, y), 4)
                row["fused_ms"] = round(timed_ms(functools.partial(fused, m=m, side=side), x, y), 4)
            except Exception as exc:  # the bmm row stands without it
                row["error"] = repr(exc)[:400]
            print(json.dumps(row), flush=True)
            rows.append(row)
            args.out.write_text(json.dumps({"rows": rows}, indent=1))
    args.out.write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
