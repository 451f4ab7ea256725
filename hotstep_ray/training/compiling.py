"""torch.compile of the trainers' repeated modules (DiT blocks, LM decoder layers): one policy.

Modes: `auto` | `off` | `default` (Inductor) | `reduce-overhead` (Inductor + CUDA graphs).
Compiling is GPU-only: on the CPU Inductor's vectorised C++ kernels gave the DiT blocks the eager
loss but wrong adapter gradients (torch 2.13, tiny DiT; right with `cpp.simdlen` 1; the error:
docs/BENCHMARKS.md, the compile-check note under the DiT tables), and CPU runs are test-size
models that compiling cannot speed up. Each module is compiled on its own with static shapes;
identical modules share their graphs.

Also here: selective activation checkpointing of the DiT's blocks (`install_checkpointing`), the
other knob that decides what a block keeps for its backward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint as activation_checkpoint

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


def with_graphs(requested: str, mode: str, ckpt_layers: int, ddp: bool = False) -> str:
    """`auto` on CUDA adds CUDA graphs ("reduce-overhead") when no layer is checkpointed: both
    compiled steps are still launch-bound, and graphs take the launches off the host (the 4B
    LM: docs/BENCHMARKS.md, row `lm-4b-modes`'s `song_compile` against `lm-4b-song`).
    Checkpointed layers re-run their forward inside the backward, which CUDA-graph trees do not
    capture cleanly, so those runs keep plain compiled modules. So do `ddp` runs (torch's
    DistributedDataParallel reducing inside the backward, the LM trainer's multi-GPU path): that
    pairing has not run on a GPU here; the DiT's ranks all-reduce after the backward instead."""
    if requested == "auto" and mode == "default" and ckpt_layers == 0 and not ddp:
        return "reduce-overhead"
    return mode


def set_activation_budget(budget: float) -> None:
    """AOTAutograd's activation memory budget for the graphs compiled from now on (a process-wide
    setting, read when a graph is first partitioned, i.e. at its first training step): 1.0 keeps
    what the min-cut partitioner saves by default; less trades recompute in the backward for
    memory, cheapest ops first."""
    if not 0.0 < budget <= 1.0:
        raise ValueError(f"activation budget must be in (0, 1], got {budget}")
    import torch._functorch.config as functorch_config

    functorch_config.activation_memory_budget = budget


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


def stable_grads(params: Iterable[torch.Tensor]) -> None:
    """Zeroed `.grad` buffers allocated outside any CUDA graph, for reduce-overhead. Otherwise a
    parameter's first gradient of a step is the compiled backward's output itself, memory of the
    CUDA-graph pool that the next micro-batch's replay overwrites (each micro-batch of a
    gradient-accumulation window replays the graphs again). With a buffer in place the backward
    adds into it; steps then zero the buffers (`zero_grad(set_to_none=False)`) instead of
    dropping them. LoRA r16 on the 4B LM: 33 M fp32 = 126 MiB; LoRA r64 on the 2B DiT: 327 MiB."""
    for param in params:
        if param.grad is None:
            param.grad = torch.zeros_like(param)


def eager(mode: str) -> contextlib.AbstractContextManager:
    """Compiled modules run eagerly inside (`mode` "off": nothing to do). For the per-epoch
    held-out losses: a few no-grad passes at shapes of their own (shorter songs, other batch
    sizes), each of which would otherwise compile, and with CUDA graphs capture, a graph."""
    if mode == "off":
        return contextlib.nullcontext()
    return torch.compiler.set_stance("force_eager")


class SelectiveCheckpoint:
    """diffusers calls `_gradient_checkpointing_func(block, *args)` for every block while
    `gradient_checkpointing` is on; this recomputes only the chosen blocks (non-reentrant, so the
    key masks that stay set on the processors are re-read identically in backward)."""

    def __init__(self, blocks: set[int]) -> None:
        self.blocks = blocks

    def __call__(self, block: nn.Module, *args: Any) -> torch.Tensor:
        if id(block) in self.blocks:
            return activation_checkpoint(block, *args, use_reentrant=False)
        return block(*args)


def install_checkpointing(transformer: nn.Module, ckpt_layers: int, trained: int) -> None:
    """Checkpoint the lowest `ckpt_layers` of the `trained` top layers of a diffusers
    transformer (`transformer.layers`); 0 turns checkpointing off."""
    layers = transformer.layers
    first = len(layers) - trained
    chosen = {id(layers[first + i]) for i in range(ckpt_layers)}
    transformer.gradient_checkpointing = bool(chosen)
    transformer._gradient_checkpointing_func = SelectiveCheckpoint(chosen)
