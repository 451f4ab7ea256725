"""Whole-step CUDA graphs: a DiT step's forwards and backwards replayed as one graph.

Why: with CUDA-graph trees on each compiled block (`reduce-overhead`) the host still calls
Python for every block twice a step (Dynamo's guards, the tree's replay and its output
tensors): 48 calls per 2B step (24 blocks). At batch 1 on a 30 s crop the host needs longer
than the GPU, so the step is the host's, and an adapter with more tensors per block (LoKR: three
per Linear against LoRA's two) pays for them in step time (docs/BENCHMARKS.md, rows
`dit-2b-750x1-guards` and `dit-guards-cpu`). One captured graph per input shape replays the
whole forward and backward with one call, whatever the adapter.

How: the first step at a shape copies its inputs into device tensors of its own (the static
inputs), runs the step body on them eagerly on a side stream (that run is the step: its loss and
its gradients are kept; it also compiles and warms everything the capture must not meet for the
first time), then captures the same body into a graph. Later steps at that shape copy their
inputs into the static tensors and replay. The gradients accumulate into buffers allocated
before any capture (`flat_grads.FlatGrads`), so a replay adds into them as the eager body would.
Outputs (the step's loss sums) are the graph's own tensors: read them before the next replay.

The graphs share one memory pool (the activations of one shape's forward are freed by its
backward, and replays never overlap), so a second shape costs no second pool. The first step
of a further shape runs eagerly beside that pool, though: when the memory a step could use is
below the largest pool so far (what a step of a similar shape needs), the graphs are dropped
first and come back at their shapes' next steps; at `MAX_EVICTIONS` such drops the run stops
capturing. Shapes past `limit` run the body eagerly (with the same room check). A failed
capture also stops capturing (`failure` says why): torch's allocator may keep a pool in use
after one.

What the body must not do: synchronise with the host, copy from pageable host memory, or read
anything that changes between steps other than its inputs (shares of the loss are part of the
key; Python numbers are baked into the graph). Autocast runs with its cast cache off inside (the
cache would hold capture-pool tensors past the capture). `Recorder` stands in for a CUDA graph on
the CPU: tests check the plumbing (static inputs, outputs, keys) against eager steps.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

Body = Callable[[list[torch.Tensor | None]], list[torch.Tensor]]
MAX_GRAPHS = 4  # input shapes with a graph: a run has one crop shape, plus a short last window
MAX_EVICTIONS = 4  # drops of every graph for room, after which a run stops capturing
ROOM_MARGIN = 1.25  # free memory wanted before a new shape's eager step, in pools' worth


class Recorder:
    """A CPU stand-in for `torch.cuda.CUDAGraph`. Making one records the body and, as a CUDA
    capture, computes nothing: `outputs` stays empty until the first `replay`, which runs the
    body on the static inputs; every replay copies the body's results into those outputs.

    A CUDA graph replays the work it captured, with every Python number baked in. A body that
    reads host state beyond its inputs would be re-read here and pass, so each replay logs its
    ops with their non-tensor arguments and must repeat the first replay's log exactly
    (`HostStateChanged` otherwise), and must not read a tensor's value on the host
    (`HostRead`: a sync, which a capture refuses)."""

    def __init__(self, body: Body, inputs: list[torch.Tensor | None]) -> None:
        self.body, self.inputs = body, inputs
        self.outputs: list[torch.Tensor] = []
        self.replays = 0
        self.ops: list[tuple[str, tuple[str, ...]]] | None = None  # the first replay's log

    def replay(self) -> None:
        self.replays += 1
        with _OpLog() as log:
            fresh = [out.detach() for out in self.body(self.inputs)]
        reads = [op for op, _ in log.ops if op in HOST_READS]
        if reads:
            raise HostRead(
                f"the body reads a tensor's value on the host ({reads[0]}, {len(reads)} times): "
                "a CUDA capture refuses the sync; keep the decision on the device"
            )
        if self.ops is None:
            self.ops = log.ops
        elif log.ops != self.ops:
            changed = next(
                (i for i, (a, b) in enumerate(zip(log.ops, self.ops, strict=False)) if a != b),
                min(len(log.ops), len(self.ops)),
            )
            raise HostStateChanged(
                f"replay {self.replays} ran other work than the first at op {changed} "
                f"({self.ops[changed] if changed < len(self.ops) else 'end'} -> "
                f"{log.ops[changed] if changed < len(log.ops) else 'end'}): a CUDA graph "
                "would have replayed the first; put what changed in the key or the inputs"
            )
        if not self.outputs:  # the first replay gives the outputs their storage
            self.outputs.extend(out.clone() for out in fresh)
            return
        for static, value in zip(self.outputs, fresh, strict=True):
            static.copy_(value)


class HostStateChanged(AssertionError):
    """A `Recorder` replay did other work than its first (see `Recorder`)."""


class HostRead(AssertionError):
    """A `Recorder` replay ran an op that copies a tensor's value to the host (`HOST_READS`)."""


# aten ops that wait for a tensor's value on the host (`.item()`, `bool(t)`, data-dependent
# shapes): on CUDA each is a sync, which stream capture refuses
HOST_READS = frozenset(
    {
        "aten._local_scalar_dense.default",
        "aten.nonzero.default",
        "aten.masked_select.default",
        "aten.unique_consecutive.default",
        "aten._unique2.default",
    }
)


class _OpLog(TorchDispatchMode):
    """Every aten op run inside, with its non-tensor arguments (as text)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, tuple[str, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        leaves = tree_leaves((args, kwargs))
        self.ops.append((str(func), tuple(repr(x) for x in leaves if not torch.is_tensor(x))))
        return func(*args, **kwargs)


class StepGraphs:
    """One captured body per key (`__call__`). `device`: where the static inputs live; a CUDA
    device captures real graphs, another device uses `Recorder` (tests). `free_bytes`: the
    device memory a step could still use (default: `_cuda_free_bytes`; tests inject one)."""

    def __init__(
        self,
        device: torch.device,
        limit: int = MAX_GRAPHS,
        free_bytes: Callable[[], int] | None = None,
        max_evictions: int = MAX_EVICTIONS,
    ) -> None:
        self.device = device
        self.limit = limit
        self.max_evictions = max_evictions
        self.graphs: dict[Hashable, tuple[Any, list[torch.Tensor | None], list[torch.Tensor]]] = {}
        self.pool: Any = None
        self.pool_bytes = 0  # what the shared pool reserves (CUDA; measured around captures)
        self.step_bytes = 0  # the largest pool so far: what an eager step beside one needs
        self.captures = 0
        self.replays = 0
        self.eager = 0
        self.evictions = 0  # times the graphs were dropped to make room for an eager step
        self.stopped = False  # no more captures (a capture failed, or too many evictions)
        self.failure = ""  # why capturing stopped
        self.reported = False  # the caller has logged `failure`
        self._free_bytes = free_bytes or self._cuda_free_bytes
        self._bound: Any = None
        self._stream: Any = None  # the side stream of the eager runs, one for all captures

    def __call__(
        self, key: Hashable, inputs: Sequence[torch.Tensor | None], body: Body
    ) -> list[torch.Tensor]:
        """The body's outputs for `inputs` (host or device tensors, None kept as None): a
        replay when `key` has a graph, else the eager body on fresh static inputs followed by
        the capture (up to `limit` keys; past it, or once stopped, the eager body alone)."""
        found = self.graphs.get(key)
        if found is not None:
            graph, static, outputs = found
            for target, value in zip(static, inputs, strict=True):
                if target is not None:
                    target.copy_(value, non_blocking=True)
            graph.replay()
            self.replays += 1
            return outputs
        # an eager step beside the pool: drop the graphs first if it would not fit
        if self._make_room() and self.evictions >= self.max_evictions:
            self._stop(
                f"dropped the graphs {self.evictions} times to fit eager steps of new shapes "
                "beside them; later steps run without graphs"
            )
        if self.stopped or len(self.graphs) >= self.limit:
            self.eager += 1
            return body([None if x is None else x.to(self.device) for x in inputs])
        static = [None if x is None else _device_copy(x, self.device) for x in inputs]
        # the eager run is this step (its loss and gradients are kept); the capture then only
        # records, it computes nothing, so a failed one leaves the step's results whole
        results = self._eager(body, static)
        try:
            graph, outputs = self._capture(body, static)
        except Exception as exc:  # noqa: BLE001 - any capture fault: no more graphs
            # After a failed capture torch's allocator may keep the shared pool in use, so
            # nothing is captured into it again (a later step of this shape would fail alike).
            cause = f"; during: {exc.__context__!r}" if exc.__context__ is not None else ""
            self._stop(
                f"a capture failed ({type(exc).__name__}: {exc}{cause}); later steps run "
                "without graphs"
            )
            return results
        self.graphs[key] = (graph, static, outputs)
        self.captures += 1
        return results

    def _stop(self, why: str) -> None:
        self.stopped, self.failure, self.reported = True, why, False
        self.clear()

    def _eager(self, body: Body, static: list[torch.Tensor | None]) -> list[torch.Tensor]:
        """The step's own run on the static inputs, before its capture."""
        if self.device.type != "cuda":
            return [out.detach().clone() for out in body(static)]
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        results = _on_side_stream(body, static, self._stream)
        # The eager run's activations are cached for the side stream, where nothing else can
        # reuse them: hand them back before the capture takes its pool, so the first step of a
        # shape does not hold both (a one-off wait per shape).
        torch.cuda.current_stream().synchronize()
        torch.cuda.empty_cache()
        return results

    def _capture(self, body: Body, static: list[torch.Tensor | None]) -> tuple[Any, list]:
        """(graph, its outputs): a CUDA graph of the body sharing the pool, or on another
        device a `Recorder` that records the body without running it."""
        if self.device.type != "cuda":
            recorder = Recorder(body, static)
            return recorder, recorder.outputs
        gc.collect()  # what torch.cuda.graph frees on entry, freed before the baseline
        torch.cuda.empty_cache()
        reserved = torch.cuda.memory_reserved(self.device)
        graph = torch.cuda.CUDAGraph()
        # thread_local: another thread of this process may queue its own work meanwhile (the
        # in-process main job trains the LM beside the DiT); only this thread's calls must not
        # touch the capture.
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            outputs = body(static)
        self.pool_bytes += max(0, torch.cuda.memory_reserved(self.device) - reserved)
        self.step_bytes = max(self.step_bytes, self.pool_bytes)
        if self.pool is None:
            self.pool = graph.pool()
        return graph, outputs

    def _make_room(self) -> bool:
        """Before an eager step of a shape without a graph: drop the graphs (and their pool)
        when the memory a step could use is below the largest pool so far, with a margin
        (`ROOM_MARGIN`). Whether it dropped them."""
        if not self.graphs or self._free_bytes() >= ROOM_MARGIN * self.step_bytes:
            return False
        self.evictions += 1
        self.clear()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return True

    def _cuda_free_bytes(self) -> int:
        """Free device memory plus what torch's allocator reserves unused outside the graphs'
        pool (the pool's blocks count as unallocated between replays, but only replays use
        them); 0 off CUDA."""
        if self.device.type != "cuda":
            return 0
        free, _ = torch.cuda.mem_get_info(self.device)
        held = torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
        return free + max(0, held - self.pool_bytes)

    def bind(self, owner: Any) -> None:
        """The graphs add into the gradient buffers `owner` holds (`flat_grads.FlatGrads`): a
        different owner (the buffers were rebuilt) forgets every graph."""
        if owner is not self._bound:
            self.clear()
            self._bound = owner

    def clear(self) -> None:
        """Forget every graph and the pool (the memory returns once nothing holds it)."""
        self.graphs.clear()
        self.pool = None
        self.pool_bytes = 0


def _device_copy(value: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A static input: a tensor of its own on `device` (never an alias of the caller's)."""
    static = torch.empty_like(value, device=device)
    static.copy_(value)
    return static


def _on_side_stream(
    body: Body, inputs: list[torch.Tensor | None], side: torch.cuda.Stream
) -> list[torch.Tensor]:
    """The body on a side stream, ordered after the current stream's work and before what the
    current stream does next (torch's recipe for the runs before a capture)."""
    current = torch.cuda.current_stream()
    side.wait_stream(current)
    with torch.cuda.stream(side):
        results = body(inputs)
    current.wait_stream(side)
    for out in results:  # their memory came from the side stream's allocations
        out.record_stream(current)
    return results
