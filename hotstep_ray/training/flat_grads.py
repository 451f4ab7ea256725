"""Adapter gradients as views of one flat buffer per (device, dtype), for the CUDA-graph trainer.

The CUDA-graph DiT step keeps its gradient buffers across steps (`compiling.stable_grads`), one
tensor per adapter parameter: 528 on the 2B DiT with LoRA r64 or LoKR 512. Every per-step pass
over them was then a list of 528 tensors: torch's `clip_grad_norm_` builds 528 norms and stacks
them, `zero_grad` zeroes a 528-tensor list, the data-parallel all-reduce concatenated them into
a new buffer every step. That is host work, not arithmetic: the clip phase reads only ~0.3 GB
of float32 (arithmetic: 75-82 M parameters), yet as a list it is hundreds of small launches
where a flat buffer needs one norm and one scale (on the CPU,
`pytest -s tests/training/test_flat_grads.py -k host_time` prints both host times).

With the gradients as views of one buffer, autograd still accumulates into each view in place,
and the clip, the zeroing and the all-reduce are one or two kernels per buffer.

A graph-replayed step gets no faster beyond its spread (the A/B:
`dit_bench --flat-grads/--no-flat-grads`): the replayed graph already removed the per-tensor
launches. What the buffer keeps is a short clip wherever steps are not graph-replayed, and one
all-reduce per buffer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch


class FlatGrads:
    """Zeroed flat buffers, one per (device, dtype) in first-seen order, with every parameter's
    `.grad` set to its slice viewed as the parameter. Allocate them outside any CUDA graph (at a
    step's start, as `compiling.stable_grads`)."""

    def __init__(self, params: Iterable[torch.nn.Parameter]) -> None:
        groups: dict[tuple[torch.device, torch.dtype], list[torch.nn.Parameter]] = {}
        for param in params:
            groups.setdefault((param.device, param.dtype), []).append(param)
        self.buffers: list[torch.Tensor] = []
        self._views: list[tuple[torch.nn.Parameter, torch.Tensor]] = []  # (param, its .grad)
        for (device, dtype), members in groups.items():
            flat = torch.zeros(sum(p.numel() for p in members), device=device, dtype=dtype)
            offset = 0
            for param in members:
                count = param.numel()
                param.grad = flat[offset : offset + count].view_as(param)
                self._views.append((param, param.grad))
                offset += count
            self.buffers.append(flat)

    def backs(self) -> bool:
        """Whether every parameter's `.grad` is still the view given to it (something may have
        set it to None or replaced it since: autograd replaces a gradient only under
        `create_graph`, which the trainer never uses). Identity checks only: no device work."""
        return all(p.grad is view for p, view in self._views)

    def zero_(self) -> None:
        for flat in self.buffers:
            flat.zero_()

    def clip_(self, max_norm: float) -> torch.Tensor:
        """`torch.nn.utils.clip_grad_norm_(params, max_norm)` over the buffers: the global L2
        norm (returned, float32 or wider), and every gradient scaled by
        min(1, max_norm / (norm + 1e-6)). `max_norm` inf: the norm only."""
        norms = [torch.linalg.vector_norm(flat, dtype=_wide(flat.dtype)) for flat in self.buffers]
        total = norms[0] if len(norms) == 1 else torch.linalg.vector_norm(torch.stack(norms))
        if math.isinf(max_norm):
            return total
        scale = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for flat in self.buffers:
            flat.mul_(scale.to(flat.dtype))
        return total

    def finite_(self) -> None:
        """NaN and ±inf gradients set to 0 (finite ones unchanged): for an update gated on the
        device (`optim.HybridOptimizer.step(found_inf)`), which scales a skipped step by 0."""
        for flat in self.buffers:
            flat.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)

    def all_reduce_(self, world_size: int) -> None:
        """Average the gradients over the workers: one all-reduce per buffer, in place."""
        import torch.distributed as dist

        for flat in self.buffers:
            dist.all_reduce(flat)
            flat /= world_size


def live(flats: FlatGrads | None) -> FlatGrads | None:
    """`flats` if every gradient is still its view, else None (the per-tensor paths then stay
    right: something dropped or replaced a gradient since)."""
    return flats if flats is not None and flats.backs() else None


def clip_grads(
    params: Iterable[torch.nn.Parameter], max_norm: float, flats: FlatGrads | None
) -> torch.Tensor:
    """The global-norm clip (returns the norm): over the flat buffers when `flats` (live) is
    given, else torch's per-tensor `clip_grad_norm_`."""
    if flats is not None:
        return flats.clip_(max_norm)
    return torch.nn.utils.clip_grad_norm_(params, max_norm)


def zero_grads(optimizer: Any, flats: FlatGrads | None, set_to_none: bool) -> None:
    """A step's end: the flat buffers zeroed in place, else the optimizer's `zero_grad`."""
    if flats is not None:
        flats.zero_()
    else:
        optimizer.zero_grad(set_to_none=set_to_none)


def _wide(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)
