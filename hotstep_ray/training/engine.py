"""How one optimizer step runs fast, whatever it computes: the DiT recipe's step engine.

The recipe hands over what is its own: `prepare(window, step)` (the host side of a step: its
random draws and assembled inputs, with `.step` and `.window`; made for the next step while the
GPU runs this step's backward), `work(prepared)` (the step's forwards as flat input lists, one per fold group, made at
the step) and `loss(inputs, shared, cast_cache)` (one forward's loss). The engine runs them:

    eager / compiled   each fold group's forward and backward in turn
    step-graph         all of them as one CUDA graph per input shape (`training.step_graph`)
    gradients          views of one flat buffer under CUDA graphs (`flat_grads`,
                       `SpeedOptions.flat_grads`), all-reduced over the workers, clipped
    update             queued before the host reads the loss under step-graph, the non-finite
                       stop gating the optimizer on the device (`_update_unread`)
    fallback           a CUDA-graph fault in the first `GRAPH_TRIAL_STEPS` steps recompiles the
                       blocks without graphs and redoes the step (`guarded`)

`compile_mode` and `graph_mode` pick the mode; `StepEngine.mode` is the one in effect.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from hotstep_ray.core.errors import InputError
from hotstep_ray.training import capture_gate, compiling, flat_grads, step_graph
from hotstep_ray.training.speed import SpeedOptions

GRAPH_TRIAL_STEPS = capture_gate.WARM_RUNS  # by then every graph is captured: a fault has shown
GRAPH_MODES = ("reduce-overhead", "step-graph")  # steps that replay CUDA graphs

Inputs = list[torch.Tensor | None]
# (one fold group's inputs, the shared inputs, cast_cache) -> its loss output (`.loss`,
# `.raw_loss`); cast_cache False inside a CUDA-graph capture
GroupLoss = Callable[[Inputs, Inputs, bool], Any]
Result = TypeVar("Result")


def compile_mode(requested: str, device: torch.device) -> str:
    """`auto` is `default` on CUDA (compiled blocks are much faster than eager ones; a short run
    stays eager, `eager_for_short_run`;
    `compiling.with_graphs` then adds CUDA graphs when nothing is checkpointed) and `off`
    elsewhere; compiling is refused off CUDA (`training.compiling`). Compiled CUDA code matches
    eager to float32 rounding (bench/dit_compile_check.py; docs/BENCHMARKS.md, the compile-check
    note under the DiT tables). `step-graph` (DiT only): blocks compiled as `default`, each
    step's forwards and backwards captured whole (`training.step_graph`)."""
    if requested == "step-graph":
        if device.type != "cuda":
            raise InputError(
                f"compile 'step-graph' needs a CUDA device, this run is on {device}: it "
                "captures CUDA graphs; use compile off or auto on the CPU"
            )
        return requested
    return compiling.resolve_mode(requested, device, "the DiT blocks")


# "auto" compiles only runs of at least this many optimizer steps. Compiling the blocks and
# capturing the step graph costs tens of seconds before the first step; it pays back after
# (compile seconds - eager first step) / (eager step - compiled step) steps. Rows
# `dit-2b-recipe-eager` (warm-up and step without compiling) against `dit-2b-recipe` and the
# compile cache's cold/warm rows (docs/BENCHMARKS.md) put that near 100 steps with an empty
# compile cache and a few dozen with a warm one: a run shorter than that, such as a first try on
# a few songs, finishes sooner eagerly; the cold figure is used, since the first run is cold.
COMPILE_MIN_STEPS = 100


def eager_for_short_run(requested: str, mode: str, planned_steps: int) -> bool:
    """Whether `auto` should run eagerly a run of `planned_steps` optimizer steps that it would
    otherwise compile (`mode`); an explicit compile mode is always kept."""
    return requested == "auto" and mode != "off" and planned_steps < COMPILE_MIN_STEPS


def graph_mode(requested: str, mode: str, ckpt_layers: int, lora_dropout: float) -> str:
    """The blocks' mode once the fit is known. `auto` on CUDA: "step-graph" when no layer is
    checkpointed and no adapter dropout draws inside the step, else `compiling.with_graphs`'s
    choice. The step graph beats per-block graphs at every 2B shape benched, by most where the
    host bounds the step (short crops, LoKR's extra tensors): docs/BENCHMARKS.md, rows
    `dit-2b-6000x1` (both modes) and `dit-2b-750x1-guards`, and the notes under the DiT table.
    Checkpointed layers and dropout also make an explicit "step-graph" "default"."""
    mode = compiling.with_graphs(requested, mode, ckpt_layers)
    capturable = ckpt_layers == 0 and lora_dropout == 0
    if requested == "auto" and mode == "reduce-overhead" and capturable:
        return "step-graph"
    if mode == "step-graph" and not capturable:
        return "default"
    return mode


@dataclass
class StepWork:
    """One step's forwards as the recipe hands them over: per fold group its inputs (host or
    device tensors, None for an absent one) and its loss's share of the step; the inputs every
    forward reads; and what picks the step graph besides the shares (shapes, module mode)."""

    groups: list[Inputs]
    shares: list[float]
    shared: Inputs
    key: Hashable


@dataclass
class StepOutcome:
    loss: float
    raw_loss: float
    grad_norm: float
    finite: bool


@dataclass
class StepEngine:
    """The step's speed state and the recipe's pieces it runs (see the module docstring).
    `set_lr(step)` sets the optimizer's learning rate for a step (the recipe's schedule, which a
    resume may replace); `recompile(mode)` compiles the model's blocks again (the CUDA-graph
    fallback); `log(message, level)` reports it."""

    params: list[torch.nn.Parameter]
    optimizer: Any  # HybridOptimizer: `step(found_inf=)` skips a non-finite update on the device
    set_lr: Callable[[int], None]
    prepare: Callable[[list, int], Any]
    work: Callable[[Any], StepWork]
    loss: GroupLoss
    device: torch.device
    mode: str = "off"  # the blocks' compile mode in effect
    speed: SpeedOptions = field(default_factory=SpeedOptions)
    world_size: int = 1
    grad_clip: float = 0.0  # 0 = no clip
    fold: int = 1  # planned micro-batches of a window run as one forward
    recompile: Callable[[str], None] = lambda mode: None
    log: Callable[[str, str], None] = lambda message, level: None
    graph_steps: int = 0  # steps run with CUDA graphs so far in this process (`guarded`)
    grad_flats: flat_grads.FlatGrads | None = None  # the CUDA-graph step's gradient buffers
    step_graphs: step_graph.StepGraphs | None = None  # compile "step-graph": one per input shape
    prefetched: Any = None  # the next step's `prepare` output, made during this backward
    warmup: capture_gate.Warmup | None = None  # a shape's first steps hold the capture lock

    def __post_init__(self) -> None:
        if self.mode == "step-graph" and self.step_graphs is None:
            self.step_graphs = step_graph.StepGraphs(self.device)
        if self.warmup is None:
            self.warmup = capture_gate.Warmup(self.device)

    @property
    def graphs(self) -> bool:
        return self.mode in GRAPH_MODES

    def drop_graphs(self, recompile: bool) -> None:
        """Run compiled blocks without CUDA graphs from now on (`recompile`: the blocks were
        compiled with graph trees, or may hold a faulty graph: compile them afresh)."""
        if recompile:
            import torch._dynamo as dynamo

            dynamo.reset()
            self.recompile("default")
        self.mode, self.step_graphs, self.grad_flats = "default", None, None

    def take(self, window: list, step: int) -> Any:
        """The step's prepared inputs: the prefetched ones when they are this step's."""
        ready, self.prefetched = self.prefetched, None
        if ready is not None and ready.step == step and ready.window == list(window):
            return ready
        return self.prepare(window, step)

    def guarded(self, step: int, run_step: Callable[[], Result]) -> Result:
        """`run_step()` (the recipe's step, around `run_step`); when one of the first steps fails
        with CUDA graphs on, the blocks are recompiled without graphs and the step is redone
        (the recipe's draws are a function of the seed and the step, so the redo is the same
        step). A speed option never ends a run; running out of memory is not a graph fault and
        still raises."""
        if not self.graphs or self.graph_steps >= GRAPH_TRIAL_STEPS:
            return run_step()
        try:
            result = run_step()
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as exc:  # noqa: BLE001 - any capture/replay fault: fall back
            self.log(
                f"CUDA graphs failed at step {step + 1} ({type(exc).__name__}: {exc}); "
                "continuing with compiled blocks without graphs",
                "warn",
            )
            self.optimizer.zero_grad(set_to_none=True)
            self.drop_graphs(recompile=True)  # plain compiled steps allocate gradients per step
            return run_step()
        self.graph_steps += 1
        return result

    def keep_grads(self) -> None:
        """A CUDA-graph step's gradient buffers, outside the graph pool and kept across
        micro-batches and steps: views of one flat buffer (`FlatGrads`, attached again if
        something dropped them), or with `speed.flat_grads` off one buffer per parameter
        (`compiling.stable_grads`)."""
        if not self.speed.flat_grads:
            compiling.stable_grads(self.params)
        elif self.grad_flats is None or not self.grad_flats.backs():
            self.grad_flats = flat_grads.FlatGrads(self.params)

    def live_flats(self) -> flat_grads.FlatGrads | None:
        """The flat gradient buffer while every gradient is its view (`flat_grads.live`)."""
        return flat_grads.live(self.grad_flats if self.speed.flat_grads else None)

    def run_step(self, step: int, prepared: Any, next_window: list | None) -> StepOutcome:
        """One optimizer step over a prepared window (`take`). `next_window`: the next step's,
        whose inputs are prepared while this step's backward runs on the GPU; the recipe's draws
        are a function of (seed, step), so they are the ones that step would make itself."""
        # CUDA graphs: a new step (the last step's graph outputs are dead), and gradients that
        # live in buffers of their own across the micro-batches (`keep_grads`).
        graphs = self.graphs
        if self.mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()
        if graphs:  # buffers zeroed by the previous step's end, or new zeros
            self.keep_grads()
        else:
            self.optimizer.zero_grad(set_to_none=True)
        work = self.work(prepared)
        with self.warmup.step((work.key, tuple(work.shares))):
            return self._step(step, work, next_window, graphs)

    def _step(
        self, step: int, work: StepWork, next_window: list | None, graphs: bool
    ) -> StepOutcome:
        """`run_step` once the step's work is made."""
        # the graphs add into the flat buffers they were captured with (`StepGraphs.bind`); with
        # flat grads off, the data-parallel all-reduce would swap every .grad under them
        if self.step_graphs is not None and graphs and self.speed.flat_grads:
            loss_sum, raw_sum = self._captured(work)
        else:
            loss_sum, raw_sum = self._eager(work)
        if next_window is not None:  # host work in the shadow of the queued backward
            self.prefetched = self.prepare(next_window, step + 1)
        flats = self.live_flats() if graphs else None
        if self.world_size > 1:
            if flats is not None:
                flats.all_reduce_(self.world_size)
            else:
                all_reduce_grads(self.params, self.world_size)
        clip = self.grad_clip if self.grad_clip > 0 else math.inf
        norm = flat_grads.clip_grads(self.params, clip, flats)
        if self.mode == "step-graph" and flats is not None:
            loss, raw, grad_norm = self._update_unread(step, loss_sum, raw_sum, norm, flats)
            finite = all(math.isfinite(v) for v in (loss, raw, grad_norm))  # the device's test
        else:
            grad_norm = float(norm)
            loss, raw = float(loss_sum), float(raw_sum)
            finite = all(math.isfinite(v) for v in (loss, raw, grad_norm))
            if finite:
                self.set_lr(step)
                self.optimizer.step()
        flat_grads.zero_grads(self.optimizer, flats, set_to_none=not graphs)
        return StepOutcome(loss, raw, grad_norm, finite)

    def _eager(self, work: StepWork) -> tuple[torch.Tensor, torch.Tensor]:
        """The fold groups' forwards and backwards, run as they come: the weighted loss and the
        plain loss summed over the groups (device scalars)."""
        device = self.device
        shared = [None if x is None else x.to(device) for x in work.shared]
        loss_sum = torch.zeros((), device=device)
        raw_sum = torch.zeros((), device=device)
        for inputs, share in zip(work.groups, work.shares, strict=True):
            moved = [None if x is None else x.to(device, non_blocking=True) for x in inputs]
            out = self.loss(moved, shared, True)
            (out.loss * share).backward()
            loss_sum += out.loss.detach() * share
            raw_sum += out.raw_loss * share
        return loss_sum, raw_sum

    def _captured(self, work: StepWork) -> tuple[torch.Tensor, torch.Tensor]:
        """`_eager` as one CUDA graph per input shape (compile "step-graph"): the graph takes
        the inputs as static inputs. The shares are baked into the graph, so they key it."""
        width = len(work.groups[0])
        inputs = [x for group in work.groups for x in group] + list(work.shared)

        def body(static: Inputs) -> list[torch.Tensor]:
            shared = static[len(work.groups) * width :]
            loss_sum = torch.zeros((), device=self.device)
            raw_sum = torch.zeros((), device=self.device)
            for index, share in enumerate(work.shares):
                out = self.loss(static[index * width : (index + 1) * width], shared, False)
                (out.loss * share).backward()
                loss_sum = loss_sum + out.loss.detach() * share
                raw_sum = raw_sum + out.raw_loss * share
            return [loss_sum, raw_sum]

        graphs = self.step_graphs
        assert graphs is not None
        graphs.bind(self.grad_flats)  # a graph adds into the gradient buffers it was captured with
        loss_sum, raw_sum = graphs((work.key, tuple(work.shares)), inputs, body)
        if graphs.failure and not graphs.reported:
            graphs.reported = True
            self.log(f"compile step-graph: {graphs.failure}", "warn")
        return loss_sum, raw_sum

    def _update_unread(
        self,
        step: int,
        loss_sum: torch.Tensor,
        raw_sum: torch.Tensor,
        norm: torch.Tensor,
        flats: flat_grads.FlatGrads,
    ) -> tuple[float, float, float]:
        """The update issued before the host reads the step's loss and gradient norm (compile
        step-graph): the non-finite stop's test runs on the device (`HybridOptimizer.step(
        found_inf)`: a non-finite step changes nothing), so the host queues the optimizer while
        the GPU still runs the replayed backward instead of waiting for it and then launching
        the optimizer onto an idle GPU. The three numbers are copied out before the update's
        kernels and read after they are queued. Returns (loss, raw loss, gradient norm)."""
        readout = torch.stack([loss_sum.float(), raw_sum.float(), norm.float()])
        found = (~torch.isfinite(readout).all()).float()
        flats.finite_()  # a skipped step's gradients may hold NaN: 0 x NaN would reach the gate
        if self.device.type == "cuda":
            host = torch.empty(3, dtype=torch.float32, pin_memory=True)
            host.copy_(readout, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record()
        self.set_lr(step)
        self.optimizer.step(found_inf=found)
        if self.device.type == "cuda":
            copied.synchronize()
            readout = host
        loss, raw, grad_norm = readout.tolist()
        return loss, raw, grad_norm


def all_reduce_grads(params: list[torch.nn.Parameter], world_size: int) -> None:
    """Average gradients over the workers in one flat all-reduce (data parallelism)."""
    import torch.distributed as dist

    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world_size
    offset = 0
    for param, grad in zip(params, grads, strict=True):
        count = grad.numel()
        param.grad = flat[offset : offset + count].view_as(grad)
        offset += count
