"""One trainer at a time compiles or captures CUDA graphs in a process.

A CUDA graph capture is invalidated when another thread of the process synchronizes the device
while it records ("operation not permitted when stream is capturing"), and torch's graph
capture, Inductor's CUDA-graph trees (around their warm-up and recording) and its kernel
autotuning all synchronize the device. Two trainers in one process (`make --no-ray-train` trains
the DiT and the LM side by side on threads) would so break each other's first steps. Each
trainer therefore runs the first `WARM_RUNS` steps of every step shape (where compiling and
capturing happen) under this process's lock; steps that only replay graphs run side by side,
since a replay, a stream sync and a kernel launch do not touch another thread's capture. With
one trainer per process (Ray Train, the CLI) the lock is never contended.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Hashable

import torch

# CUDA-graph trees warm a shape up, record it, then replay it; the step graph runs a shape's
# first step eagerly and captures it. By the third run of a shape everything is captured.
WARM_RUNS = 3

# Process-wide because what it guards is: the CUDA context's capture state.
_LOCK = threading.Lock()


class Warmup:
    """Counts one trainer's runs of each step shape: `step(shape)` holds the process's lock
    while that shape is among its first `WARM_RUNS` runs (on CUDA; elsewhere nothing)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.runs: Counter[Hashable] = Counter()

    def step(self, shape: Hashable) -> contextlib.AbstractContextManager[object]:
        self.runs[shape] += 1
        if self.cuda and self.runs[shape] <= WARM_RUNS:
            return _LOCK
        return contextlib.nullcontext()
