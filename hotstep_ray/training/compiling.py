"""torch.compile of the trainers' repeated modules (DiT blocks, LM decoder layers): one policy.

Modes: `auto` | `off` | `default` (Inductor) | `reduce-overhead` (Inductor + CUDA graphs).
Compiling is GPU-only: on the CPU Inductor's vectorised C++ kernels gave the DiT blocks the eager
loss but wrong adapter gradients (torch 2.13, 40 % median error on the tiny DiT; right with
`cpp.simdlen` 1), and CPU runs are test-size models that compiling cannot speed up. Each module
is compiled on its own with static shapes; identical modules share their graphs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from hotstep_ray.core.errors import InputError

COMPILE_MODES = ("default", "reduce-overhead")
REQUESTS = ("auto", "off", *COMPILE_MODES)


def resolve_mode(requested: str, device: torch.device, what: str) -> str:
    """`auto` -> `default` on CUDA, `off` elsewhere; a compile mode off CUDA is refused with a
    message naming `what` is compiled."""
    if requested not in REQUESTS:
        raise InputError(f"compile {requested!r}: expected auto, off, default or reduce-overhead")
    if requested == "auto":
        return "default" if device.type == "cuda" else "off"
    if requested != "off" and device.type != "cuda":
        raise InputError(
            f"compile {requested!r} needs a CUDA device, this run is on {device}: torch.compile "
            f"of {what} is GPU-only (Inductor's CPU kernels are not trusted with adapter "
            "gradients); use compile off or auto on the CPU"
        )
    return requested


def compile_each(
    modules: Iterable[nn.Module], mode: str, backend: Any = "inductor", recompile_limit: int = 64
) -> None:
    """`torch.compile` every module in place, static shapes. Dynamo's recompile limits are
    raised to `recompile_limit` (per code object, 4x that in total) so that a run's shapes never
    silently fall back to eager. `backend` other than inductor (tests): dynamo + that backend,
    `mode` ignored."""
    import torch._dynamo as dynamo

    if mode not in COMPILE_MODES:
        raise ValueError(f"compile mode must be one of {COMPILE_MODES}, got {mode!r}")
    for name, limit in (
        ("cache_size_limit", recompile_limit),
        ("recompile_limit", recompile_limit),
        ("accumulated_recompile_limit", 4 * recompile_limit),
        ("accumulated_cache_size_limit", 4 * recompile_limit),
    ):
        if hasattr(dynamo.config, name):
            setattr(dynamo.config, name, max(getattr(dynamo.config, name), limit))
    for module in modules:
        if backend == "inductor":
            module.compile(mode=None if mode == "default" else mode, dynamic=False)
        else:
            module.compile(backend=backend, dynamic=False)
