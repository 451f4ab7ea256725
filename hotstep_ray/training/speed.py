"""Speed switches of the adapter layers and the DiT step, in one typed, frozen value.

None of them changes the math (every pair of paths is tested against the other); each default
is the faster path on the GPU benches (docs/BENCHMARKS.md, DiT tables). The run's `SpeedOptions`
reaches the code that reads them explicitly: `adapters.inject(..., speed=)` sets it on every
LoKR layer (`adapters.set_speed` changes it later), `dit_vram.estimate(..., speed=)` sizes the
run with it, and `engine.StepEngine` reads `flat_grads`. The benches' A/B flags and the tests
build their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

KronMix = Literal["auto", "gemm", "pointwise", "ordered"]
KronForward = Literal["factored", "merged"]
KRON_MIXES = ("gemm", "pointwise", "ordered")  # the concrete mixes; `kron_mix` may also be "auto"
KRON_FORWARDS = ("factored", "merged")


@dataclass(frozen=True)
class SpeedOptions:
    """How the adapters and the step run, never what they compute.

    kron_mix: how `adapters.kron_linear` mixes LoKR's w1 side. "gemm": a matmul with K = c (4 on
        2B, 5 on XL), which cuBLAS runs with unaligned low-occupancy kernels (the LoKR step's
        largest kernel on the GPU), then a transpose copy of the output. "pointwise":
        `adapters.KronMix`, c multiply-adds per output that torch.compile fuses into one pass,
        with the w1 gradient as one split-K GEMM. "ordered": the pointwise mix on whichever side
        makes the w2 GEMM smaller: w1 first when a <= c (the GEMM then costs tokens·a·d·b
        instead of tokens·c·d·b and writes the output in its final layout; 2B: every attention
        projection and the MLP's down), else w2 first as "pointwise". On the GPU "ordered" beats
        "gemm", more so with the w1 gradient as a batched GEMM per token (`adapters.w1_grad`);
        on the CPU the GEMM mix is the faster (the A/B: bench/dit_bench.py --kron-mix), so
        "auto" picks "ordered" for CUDA tensors and "gemm" otherwise. `MergedKron`'s backward
        reuses the choice for its one w1 mix; only the factored forward was timed per mix.
    kron_forward: how a trained LoKR Linear runs. "factored" adds `kron_linear`'s output to the
        base Linear's; "merged" runs one Linear with `W + scale · (w1 ⊗ w2)`, built per call
        (`adapters.MergedKron`). Per adapted Linear, in base-GEMM units with f = max(a, c):
        factored = forward 1 + 1/f plus a mix pass, backward 1 (dx) + 2/f plus mix passes;
        merged = forward 1, backward 1 + 2/f plus one mix pass, and two passes over W to build
        W'. On the GPU merged is the faster and reserves less once the rows are many enough
        (below). Merged rounds W + ΔW to bf16 where factored rounds the two outputs' sum; a
        bf16 toy fit stays as close to float32 either way (tests/training/test_kron_merged.py).
    kron_merged_min_tokens: rows of x (all leading axes: batch × tokens) below which "merged"
        keeps the factored path. Building W' moves ~2 weights of memory (read W, write W'; again
        in the backward) for the 1/f-base GEMM it saves (f = 4: rows · in · out / 2 FLOPs): on an
        H200 (4.8 TB/s, ~700 TFLOP/s bf16) the two meet near 1200 rows (arithmetic). Once the
        step is not host-bound (step graph) merged wins lower: it beats factored at 750 rows,
        while at 375 rows factored LoKR already leads LoRA r64 (docs/BENCHMARKS.md, row
        `dit-2b-750x1`, whose run kept those rows factored), so 512. A decode step (1-2 rows)
        would otherwise rebuild every weight per token. The DiT's rows are batch × frames / 2
        (patch 2): a 240 s crop 3000 per song, the recipe's 1248-frame crop 624 (2496 with its
        4 micro-batches folded); the cross-attention K/V see batch × condition tokens; the LM's
        rows are ~1700 per 240 s song.
    fused_mix: whether `MergedKron`'s backward takes w1's pair sums and w2's mix from one kernel
        pass (`kron_kernels.pair_partials_mix`), saving a read of one activation-sized operand
        per adapted Linear: ~7.7 GB per 2B batch-2 step at 6000 frames (arithmetic). The kernel
        against the torch mix: docs/BENCHMARKS.md, row `kron-kernels`; the step's A/B is
        `dit_bench --no-fused-mix`.
    flat_grads: the CUDA-graph step's gradients as views of one flat buffer (`flat_grads.
        FlatGrads`); False keeps one buffer per parameter (`compiling.stable_grads`) and torch's
        per-tensor clip (`dit_bench --no-flat-grads`). Graph-replayed steps change no more than
        their spread; the flat buffer shortens the clip wherever steps are not replayed (host
        work: hundreds of small launches against two; `flat_grads`' docstring).
    """

    kron_mix: KronMix = "auto"
    kron_forward: KronForward = "merged"
    kron_merged_min_tokens: int = 512
    fused_mix: bool = True
    flat_grads: bool = True

    def __post_init__(self) -> None:
        if self.kron_mix not in ("auto", *KRON_MIXES):
            raise ValueError(f"kron_mix {self.kron_mix!r}: expected auto or one of {KRON_MIXES}")
        if self.kron_forward not in KRON_FORWARDS:
            raise ValueError(f"kron_forward {self.kron_forward!r}: expected one of {KRON_FORWARDS}")
        if self.kron_merged_min_tokens < 0:
            raise ValueError(
                f"kron_merged_min_tokens must be >= 0, got {self.kron_merged_min_tokens}"
            )

    def kron_merges(self, rows: int) -> bool:
        """Whether a LoKR Linear whose input has `rows` rows (all leading axes) takes the merged
        forward; the VRAM model asks the same question."""
        return self.kron_forward == "merged" and rows >= self.kron_merged_min_tokens
