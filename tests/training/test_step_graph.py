"""Compile "step-graph" (`training.step_graph`): a step's forwards and backwards replayed as one
graph per input shape. On the CPU `Recorder` stands in for the CUDA graph, so these tests check
the plumbing: static inputs, the key, outputs, gradient buffers and the fallbacks. The CUDA
capture itself runs in bench/dit_bench.py (`--compile step-graph`, docs/BENCHMARKS.md)."""

from __future__ import annotations

import pytest
import torch
from test_dit_support import (  # noqa: F401  (fixtures)
    SLUG,
    fast_options,
    random_adapter_start,
    single_thread_fixture,
    tiny_dit_dir_fixture,
    write_cache,
)

from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage
from hotstep_ray.training import adapters, dit, dit_windows, step_graph

CPU = torch.device("cpu")


def doubling_body(calls: list[int]):
    def body(static):
        calls.append(1)
        x, mask = static
        return [x * 2, x.sum() if mask is None else (x * mask).sum()]

    return body


def test_a_key_is_captured_once_then_replayed_on_the_new_inputs() -> None:
    graphs = step_graph.StepGraphs(CPU)
    calls: list[int] = []
    body = doubling_body(calls)
    first = torch.tensor([1.0, 2.0])
    out = graphs("a", [first, None], body)
    assert out[0].tolist() == [2.0, 4.0] and calls == [1]  # the step itself, run once
    first.fill_(100.0)  # the graph holds its own static copy, not the caller's tensor
    out = graphs("a", [torch.tensor([3.0, 4.0]), None], body)
    assert out[0].tolist() == [6.0, 8.0] and float(out[1]) == 7.0
    assert (graphs.captures, graphs.replays, graphs.eager) == (1, 1, 0)
    # another key, another graph; past the limit the body runs eagerly on the inputs
    graphs.limit = 2
    graphs("b", [torch.ones(3), torch.zeros(3)], body)
    out = graphs("c", [torch.ones(1), None], body)
    assert out[0].tolist() == [2.0] and (graphs.captures, graphs.eager) == (2, 1)
    # replaying "a" again still computes from the inputs it is given now
    assert graphs("a", [torch.tensor([0.5, 0.5]), None], body)[0].tolist() == [1.0, 1.0]


def test_a_failed_capture_keeps_its_step_and_stops_capturing(monkeypatch) -> None:
    graphs = step_graph.StepGraphs(CPU)
    body = doubling_body([])
    graphs("a", [torch.ones(2), None], body)

    def failing(body, static):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(graphs, "_capture", failing)
    out = graphs("b", [torch.full((2,), 3.0), None], body)
    assert out[0].tolist() == [6.0, 6.0]  # the step's own eager run is kept
    assert graphs.stopped and "not permitted" in graphs.failure and not graphs.reported
    assert graphs.graphs == {}  # the pool may be unusable: no graph is replayed from it
    assert graphs("a", [torch.ones(2), None], body)[0].tolist() == [2.0, 2.0]
    assert (graphs.captures, graphs.replays, graphs.eager) == (1, 0, 1)


def test_graphs_are_dropped_when_a_new_shapes_step_would_not_fit_beside_them() -> None:
    free = {"bytes": 1000}
    graphs = step_graph.StepGraphs(CPU, limit=2, free_bytes=lambda: free["bytes"], max_evictions=3)
    body = doubling_body([])
    graphs("a", [torch.ones(2), None], body)
    graphs.step_bytes = 100  # the largest pool, as CUDA captures measure it
    graphs("b", [torch.ones(3), None], body)  # 1000 >= 1.25 x 100: both kept
    assert set(graphs.graphs) == {"a", "b"} and graphs.evictions == 0
    free["bytes"] = 120  # < 125: the pool goes before the eager step
    out = graphs("c", [torch.ones(1), None], body)  # past the limit, and no room
    assert out[0].tolist() == [2.0] and set(graphs.graphs) == {"c"}
    assert graphs.evictions == 1 and graphs.pool_bytes == 0 and graphs.step_bytes == 100
    assert graphs("a", [torch.ones(2), None], body)[0].tolist() == [2.0, 2.0]  # evicts again
    assert set(graphs.graphs) == {"a"} and graphs.evictions == 2 and not graphs.stopped
    graphs("b", [torch.ones(3), None], body)  # the third drop stops capturing
    assert (
        graphs.stopped and graphs.graphs == {} and "dropped the graphs 3 times" in (graphs.failure)
    )
    assert graphs("a", [torch.ones(2), None], body)[0].tolist() == [2.0, 2.0]
    assert graphs.graphs == {} and graphs.eager == 2  # eager from now on
    free["bytes"] = 10**9
    graphs.stopped, graphs.evictions = False, 0
    graphs("a", [torch.ones(2), None], body)  # with room, nothing is dropped
    graphs("b", [torch.ones(3), None], body)
    assert set(graphs.graphs) == {"a", "b"} and graphs.evictions == 0


def test_a_body_reading_host_state_fails_on_the_cpu_as_it_would_misreplay_on_cuda() -> None:
    scale = {"value": 2.0}

    def body(static):  # reads a Python number that is neither an input nor in the key
        return [static[0] * scale["value"]]

    graphs = step_graph.StepGraphs(CPU)
    graphs("a", [torch.ones(2)], body)
    assert graphs("a", [torch.ones(2)], body)[0].tolist() == [2.0, 2.0]  # first replay
    assert graphs("a", [torch.full((2,), 3.0)], body)[0].tolist() == [6.0, 6.0]  # same work
    scale["value"] = 5.0  # a CUDA graph would still multiply by 2
    with pytest.raises(step_graph.HostStateChanged, match="put what changed in the key"):
        graphs("a", [torch.ones(2)], body)


def test_a_body_reading_a_tensor_on_the_host_fails_on_the_cpu_as_its_capture_would() -> None:
    def body(static):  # a data-dependent branch: a sync on CUDA
        x = static[0]
        return [x * 2 if bool(x.sum() > 0) else x]

    graphs = step_graph.StepGraphs(CPU)
    graphs("a", [torch.ones(2)], body)  # the eager step itself may read
    with pytest.raises(step_graph.HostRead, match="_local_scalar_dense"):
        graphs("a", [torch.ones(2)], body)


def test_new_gradient_buffers_forget_the_graphs() -> None:
    graphs = step_graph.StepGraphs(CPU)
    body = doubling_body([])
    owner = object()
    graphs.bind(owner)
    graphs("a", [torch.ones(2), None], body)
    graphs.bind(owner)  # the same buffers: the graph stays
    assert len(graphs.graphs) == 1
    graphs.bind(object())  # rebuilt buffers: a graph would add into the old ones
    assert graphs.graphs == {} and graphs.pool is None


@pytest.fixture
def storage(tmp_path) -> Storage:
    store = Storage(tmp_path / "data")
    write_cache(store)  # three songs; the 40-frame one is padded to the 48-frame crop
    return store


def graph_run(
    storage: Storage, tiny_dit_dir, start: dict | None, graphs: bool, **overrides
) -> dit.DitRun:
    """A tiny LoRA run (two micro-batches a step, so two groups share a graph) from the given
    adapter values; with `graphs`, the step-graph path on `Recorder`s."""
    options = fast_options(**{"batch": 1, "grad_accum": 2, "epochs": 6, **overrides})
    settings = dit.DitSettings(checkpoints_dir=str(tiny_dit_dir), step_event_interval_s=0.0)
    run = dit.setup(options, storage, SLUG, settings)
    if start is not None:
        adapters.load_adapter_state(run.transformer, start)
    if graphs:  # what prepare sets on CUDA for compile "step-graph"
        run.engine.mode = "step-graph"
        run.engine.step_graphs = step_graph.StepGraphs(CPU)
    return run


def test_graph_steps_train_as_the_plain_steps(storage, tiny_dit_dir, single_thread) -> None:
    start = random_adapter_start(storage, tiny_dit_dir, 3, batch=1, grad_accum=2)
    results = {}
    for graphs in (False, True):
        run = graph_run(storage, tiny_dit_dir, start, graphs)
        losses = []
        for epoch in range(1, 7):  # enough steps that a shape replays more than once
            for window in dit_windows.epoch_windows(run.sampling, epoch):
                result = dit.optimizer_step(run, window)
                losses.append((result.loss, result.raw_loss, result.grad_norm, result.frames))
        results[graphs] = (losses, [p.detach().clone() for p in run.params], run.engine.step_graphs)
    plain, plain_params, _ = results[False]
    losses, params, graphs = results[True]
    # each window shape is captured once (its first step), later steps replay; shapes past
    # the limit (song order and masks make five here) run eagerly
    assert graphs.captures == graphs.limit and graphs.eager >= 1
    assert graphs.replays + graphs.captures + graphs.eager == len(losses)
    # the Recorder compared a replay's work with an earlier one's (`HostStateChanged`)
    assert max(recorder.replays for recorder, _, _ in graphs.graphs.values()) >= 2
    # The graph step runs the step's math in another arrangement (static buffers, flat gradient
    # clip, device-side optimizer gate): float32 sums in other orders, a few ulp per step, carried
    # over ~12 AdamW steps: ~1e-6 relative; a stale or replayed-wrong input is O(1) off.
    for got, want in zip(losses, plain, strict=True):
        assert got == pytest.approx(want, rel=1e-5, abs=1e-7)
    for now, then in zip(params, plain_params, strict=True):
        torch.testing.assert_close(now, then, rtol=1e-5, atol=1e-7)  # as the losses


def test_step_graph_is_refused_off_cuda() -> None:
    with pytest.raises(InputError, match="needs a CUDA device"):
        dit.compile_mode("step-graph", CPU)
    assert dit.compile_mode("off", CPU) == "off"


def optimizer_tensors(run: dit.DitRun) -> list[torch.Tensor]:
    """Every tensor of the optimizer's state (moments, momenta, step counts), copied."""
    state = run.optimizer.state_dict()
    return [
        value.clone()
        for part in state.values()
        for per_param in part["state"].values()
        for value in per_param.values()
        if isinstance(value, torch.Tensor)
    ]


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_a_non_finite_graph_step_changes_nothing(
    storage, tiny_dit_dir, single_thread, monkeypatch, optimizer
) -> None:
    """The step-graph update is queued before the host reads the loss (`StepEngine._update_unread`):
    a NaN step still leaves the adapter and the optimizer as they were, and is not counted.
    The NaN comes in with the step's noise, an input of the graph, as bad data would (a patched
    loss would be host state the graph bakes in). Muon: the tiny LoRA's factors (short side 4)
    take Muon's device gate; AdamW on the CPU is torch's unfused one, which the host's read
    gates."""
    run = graph_run(storage, tiny_dit_dir, None, graphs=True, optimizer=optimizer, muon_min_dim=2)
    assert bool(run.optimizer.muon) is (optimizer == "muon")
    window = dit_windows.epoch_windows(run.sampling, 1)[0]
    assert dit.optimizer_step(run, window).finite  # captured (and counted)
    original = dit_windows.draw_noise
    poison = {"on": True}

    def poisoned(*args, **kwargs):
        noise = original(*args, **kwargs)
        if poison["on"]:
            noise[0, 0, 0] = float("nan")
        return noise

    monkeypatch.setattr(dit_windows, "draw_noise", poisoned)
    before = [p.detach().clone() for p in run.params]
    state = optimizer_tensors(run)
    assert state  # the first step made moments
    result = dit.optimizer_step(run, window)  # a replay of the captured body
    assert not result.finite and run.state.step == 1 and run.engine.step_graphs.replays == 1
    # exact: the gated step writes nothing (not a tolerance)
    assert all(torch.equal(p, b) for p, b in zip(run.params, before, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(optimizer_tensors(run), state, strict=True))
    poison["on"] = False
    assert dit.optimizer_step(run, window).finite and run.state.step == 2
    assert run.engine.step_graphs.replays == 2  # the same graph, finite again
    assert not all(torch.equal(p, b) for p, b in zip(run.params, before, strict=True))


def test_auto_takes_step_graph_when_nothing_keeps_it_out() -> None:
    assert dit.graph_mode("auto", "default", ckpt_layers=0, lora_dropout=0.0) == "step-graph"
    # dropout draws inside the step: per-block graphs; checkpointed layers: no graphs
    assert dit.graph_mode("auto", "default", 0, lora_dropout=0.1) == "reduce-overhead"
    assert dit.graph_mode("auto", "default", ckpt_layers=4, lora_dropout=0.0) == "default"
    assert dit.graph_mode("step-graph", "step-graph", 4, 0.0) == "default"
    assert dit.graph_mode("step-graph", "step-graph", 0, 0.1) == "default"
    assert dit.graph_mode("step-graph", "step-graph", 0, 0.0) == "step-graph"
    assert dit.graph_mode("reduce-overhead", "reduce-overhead", 0, 0.0) == "reduce-overhead"
    assert dit.graph_mode("auto", "off", 0, 0.0) == "off"  # the CPU


def test_resuming_a_fit_with_checkpointed_layers_leaves_step_graph(storage, tiny_dit_dir) -> None:
    """A checkpoint's fit may checkpoint layers (`dit._adopt_fit`), whose recompute inside the
    backward a capture cannot hold: the run continues on compiled blocks without step graphs."""
    run = graph_run(storage, tiny_dit_dir, None, graphs=True)
    saved = {
        "crop_frames": run.fit.crop_frames,
        "batch": run.fit.batch,
        "ckpt_layers": 1,
        "trained_layers": run.fit.trained_layers,
    }
    dit._adopt_fit(run, saved)
    assert run.fit.ckpt_layers == 1
    assert run.engine.mode == "default" and run.engine.step_graphs is None


def test_input_shapes_tell_masks_batch_and_mode_apart(storage, tiny_dit_dir) -> None:
    """The step graph's key (with the shares): what changes the captured work changes it."""
    run = dit.setup(
        fast_options(batch=2, grad_accum=1),
        storage,
        SLUG,
        dit.DitSettings(checkpoints_dir=str(tiny_dit_dir)),
    )
    windows = dit_windows.epoch_windows(run.sampling, 1)
    two, one = (dit_windows.prepare_window(run.sampling, w, 0) for w in windows[:2])
    shapes = dit_windows.input_shapes
    assert shapes(two, 1, True) == shapes(two, 1, True)
    assert shapes(two, 1, True) != shapes(one, 1, True)  # batch 2 vs 1
    assert shapes(two, 1, True) != shapes(two, 1, False)  # train vs eval
    assert shapes(two, 1, True) != shapes(two, 2, True)  # fold
    masked = shapes(two, 1, True)[0][0]
    two.host[0].latent_mask = None  # no padding in this batch: a different graph
    assert shapes(two, 1, True)[0][0] != masked
