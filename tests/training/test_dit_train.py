"""The recipe end to end on the tiny DiT and a synthetic 3-song cache (CPU, one thread)."""

from __future__ import annotations

import json

import pytest
import torch
from test_dit_support import (  # noqa: F401  (fixtures)
    SLUG,
    fast_options,
    read_log,
    single_thread_fixture,
    tiny_dit_dir_fixture,
    write_cache,
)

from hotstep_ray.core.errors import InputError
from hotstep_ray.core.events import EventLog, MetricEvent
from hotstep_ray.core.storage import Storage
from hotstep_ray.models.acestep_dit import load_acestep_dit
from hotstep_ray.training import adapters, compiling, dit, dit_data, dit_loss, dit_windows, export
from hotstep_ray.training.checkpoint import read_manifest
from hotstep_ray.training.flat_grads import FlatGrads
from hotstep_ray.training.speed import SpeedOptions


@pytest.fixture
def storage(tmp_path) -> Storage:
    store = Storage(tmp_path / "data")
    write_cache(store)
    write_cache(store, variant="base")
    return store


def settings(tiny_dit_dir, **overrides) -> dit.DitSettings:
    values = {
        "checkpoints_dir": str(tiny_dit_dir),
        "export_interval_s": 0.0,
        "checkpoint_interval_s": 0.0,
        "step_event_interval_s": 0.0,
    }
    values.update(overrides)
    return dit.DitSettings(**values)


def run_training(storage, tiny_dit_dir, options, events=None, max_steps=None, **overrides):
    run = dit.setup(options, storage, SLUG, settings(tiny_dit_dir, **overrides), events)
    return run, dit.train(run, max_steps=max_steps)


def test_loss_falls_on_a_memorisable_dataset(storage, tiny_dit_dir, single_thread) -> None:
    options = fast_options(epochs=30, learning_rate=1e-2)
    run, result = run_training(storage, tiny_dit_dir, options)
    losses = [epoch["loss"] for epoch in run.state.history]
    assert result.stop_reason == "epochs" and len(losses) == 30
    # a learning signal, not round-off: float32 reordering moves these means by ~1e-6 relative
    assert sum(losses[-5:]) / 5 < 0.6 * sum(losses[:5]) / 5
    assert result.saved_reason == "best"


def test_resume_from_half_way_equals_uninterrupted(storage, tiny_dit_dir, single_thread) -> None:
    options = fast_options(epochs=6, optimizer="muon", batch=1, grad_accum=2)
    full, full_result = run_training(storage, tiny_dit_dir, options)
    steps = full_result.steps
    assert steps == 12  # 3 songs, batch 1, GA 2: 2 windows per epoch, the second one short

    first, first_result = run_training(storage, tiny_dit_dir, options, max_steps=steps // 2 + 1)
    assert first_result.stop_reason == "max_steps"  # stopped in the middle of an epoch
    # crop auto-fit would pick 90 frames here: the resume adopts the checkpoint's 48
    auto_crop = options.model_copy(update={"crop_frames": 0})
    resumed, resumed_result = run_training(
        storage,
        tiny_dit_dir,
        auto_crop,
        run_key=first.run_key,
        resume=first.checkpoint_key,
    )
    assert resumed.fit.crop_frames == 48 and resumed.frames == 48
    assert resumed_result.steps == steps
    # exact: the same kernels in this process, the checkpoint restores every float32 bit
    assert [e["loss"] for e in resumed.state.history] == [e["loss"] for e in full.state.history]
    full_state = adapters.adapter_state_dict(full.transformer)
    for key, value in adapters.adapter_state_dict(resumed.transformer).items():
        assert torch.equal(value, full_state[key]), key
    log = read_log(storage, first.run_key)
    assert log["resumes"] == [{"step": steps // 2 + 1, "epoch": 4}]


def test_folded_micro_batches_train_as_the_accumulated_ones(
    storage, tiny_dit_dir, single_thread
) -> None:
    """grad_accum 2 over 3 songs (one window of 2 planned micro-batches, one of 1): run folded
    (the 2 as one forward over a padded batch of 2) the run takes the same draws, noise and
    element-share weights, so its losses and adapter equal the accumulated run's."""
    options = fast_options(epochs=4, optimizer="adamw", batch=1, grad_accum=2)
    plain, _ = run_training(storage, tiny_dit_dir, options, fold_accum="off")
    folded, _ = run_training(storage, tiny_dit_dir, options, fold_accum="on")
    assert (plain.engine.fold, folded.engine.fold) == (1, 2)  # the CPU has no memory budget
    losses = [e["loss"] for e in plain.state.history]
    # float32: the padded batch of 2 runs other GEMM shapes than two batches of 1, so every
    # reduction rounds differently (a few ulp per layer, 4 layers, 8 steps): ~1e-6 relative
    assert [e["loss"] for e in folded.state.history] == pytest.approx(losses, rel=1e-5)
    assert losses[-1] < losses[0]  # it trained: equal losses are not two idle runs
    trained = adapters.adapter_state_dict(plain.transformer)
    for key, value in adapters.adapter_state_dict(folded.transformer).items():
        # those ulp differences in the gradients, through 8 AdamW steps (lr 3e-3): rtol 1e-4,
        # atol for the small LoRA B entries
        assert torch.allclose(value, trained[key], rtol=1e-4, atol=1e-6), key
    assert read_log(storage, folded.run_key)["runtime"]["fold_accum"] == 2
    shapes = []
    original = dit_data.assemble
    with pytest.MonkeyPatch.context() as patch:  # one more step: one forward of 2
        patch.setattr(
            dit_data,
            "assemble",
            lambda cache, crops, frames, **kwargs: (
                shapes.append(len(crops)) or original(cache, crops, frames, **kwargs)
            ),
        )
        dit.optimizer_step(folded, dit_windows.epoch_windows(folded.sampling, 5)[0])
    assert shapes == [2]
    with pytest.raises(InputError, match="fold_accum"):
        run_training(storage, tiny_dit_dir, options, fold_accum="sometimes")


def _fixed_loss(run: dit.DitRun, transformer_models) -> float:
    """Loss of one fixed micro-batch with fixed draws through `transformer_models`."""
    crops = [dit_data.Crop(0, 0, 40, False), dit_data.Crop(2, 20, 48, False)]
    batch = dit_data.assemble(run.cache, crops, run.frames)
    noise = torch.randn(batch.target_latents.shape, generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        return dit_loss.flow_matching_loss(
            transformer_models,
            batch,
            torch.tensor([0.3, 0.8]),
            noise,
            torch.tensor([False, True]),
            channel_weights=run.loss.channel_weights,
        ).loss.item()


LOKR_OPTIONS = {"adapter_type": "lokr", "lokr_dim": 8, "lokr_alpha": 4, "lokr_factor": 4}


@pytest.mark.parametrize(
    ("overrides", "merged"),
    [({"adapter_type": "lora"}, False), (LOKR_OPTIONS, False), (LOKR_OPTIONS, True)],
    ids=["lora", "lokr", "lokr-merged"],
)
def test_export_reload_reproduces_the_trainers_loss(
    storage, tiny_dit_dir, single_thread, monkeypatch, merged_calls, overrides, merged
) -> None:
    # The tiny DiT's inputs hold fewer rows than `kron_merged_min_tokens`, so "lokr" trains on
    # the factored path; "lokr-merged" lowers the threshold so training and the reload run LoKR's
    # merged Linear, the GPU's path.
    speed = SpeedOptions(kron_merged_min_tokens=1) if merged else SpeedOptions()
    options = fast_options(epochs=4, **overrides)
    run, result = run_training(storage, tiny_dit_dir, options, speed=speed)
    assert bool(merged_calls) == merged
    assert result.saved_reason == "best"  # the best ma5 epoch's adapter, exported as it came
    dit.save(run, "final")  # now the model's current adapter, to compare with the live model
    # The export is BF16: the trainer's own model with its adapter rounded to BF16 must give the
    # very same loss as a fresh base model loading the exported files.
    state = adapters.adapter_state_dict(run.transformer)
    trained = _fixed_loss(run, run.models)
    adapters.load_adapter_state(run.transformer, {k: v.bfloat16() for k, v in state.items()})
    rounded = _fixed_loss(run, run.models)

    fresh = load_acestep_dit(tiny_dit_dir / "turbo", device="cpu", dtype=torch.float32)
    export.load_exported(
        fresh.transformer, storage, result.run_key, rename=export.ACESTEP_OFFICIAL_NAMES
    )
    adapters.set_speed(fresh.transformer, speed)  # the reload runs the trainer's forward
    reloaded = _fixed_loss(run, fresh)
    # the same layers, kernels and BF16 values in this process: equal but for ulp-level slack
    assert reloaded == pytest.approx(rounded, rel=1e-6, abs=1e-7)
    # BF16 rounding (2^-9 relative) of the adapter moves the loss by ~2^-9 of the adapter's own
    # effect on it
    assert reloaded == pytest.approx(trained, rel=1e-2)

    kind, _tensors, meta = export.read_adapter_file(storage, result.run_key)
    assert kind == overrides["adapter_type"]
    assert meta["hot_step_trigger"] == "zqx" and meta["modelspec.trigger_phrase"] == "zqx"
    assert meta["hot_step_trigger_position"] == "prepend"
    assert result.run_key.startswith("adapters/dit-turbo/band/")


def test_checkpointed_layers_give_the_same_gradients(storage, tiny_dit_dir, single_thread) -> None:
    run = dit.setup(fast_options(), storage, SLUG, settings(tiny_dit_dir))
    window = dit_windows.epoch_windows(run.sampling, 1)[0]
    grads = []
    for ckpt_layers in (0, 4):
        compiling.install_checkpointing(run.transformer, ckpt_layers, 4)
        draws = dit_windows.draw_window(run.sampling, window, step=0)
        run.optimizer.zero_grad(set_to_none=True)
        out = dit.micro_batch_loss(
            run,
            draws.crops[0],
            draws.t[0],
            draws.cfg_drop[0],
            draws.weights[0],
            [(("n", 0), len(window[0]))],
        )
        out.loss.backward()
        grads.append({k: p.grad.clone() for k, p in adapters.trainable_parameters(run.transformer)})
    for key, grad in grads[0].items():
        # the checkpoint recomputes the same forward with the same kernels: equal up to slack
        assert torch.allclose(grad, grads[1][key], rtol=1e-5, atol=1e-7), key


def test_base_lokr_muon_run_logs_events_milestones_and_target_stop(
    storage, tiny_dit_dir, single_thread
) -> None:
    events: list = []
    options = fast_options(
        variant_key="base",
        adapter_type="lokr",
        lokr_dim=8,
        lokr_alpha=4,
        lokr_factor=4,
        optimizer="muon",
        muon_min_dim=8,
        muon_ns_precision="tf32",  # the CPU's TF32 is float32: only the option's path is new
        learning_rate=5e-3,
        loss_weighting="flow_snr",
        checkpoint_segments=2,
        epochs=40,
        target_loss=3.3,
        milestone_step=0.25,
        milestone_keep=2,
    )
    run, result = run_training(storage, tiny_dit_dir, options, events=EventLog(events.append))
    assert run.loss.cfg_ratio == 0.15 and run.fit.ckpt_layers == 2
    assert "Muon" in run.optimizer.split_summary() and run.optimizer.muon.ns_precision == "tf32"
    assert result.stop_reason == "target" and result.saved_reason == "target"
    log = read_log(storage, result.run_key)
    # ma5 <= 3.3 is the stop rule's own condition (exact), not a tolerance
    assert log["target_loss_stop"]["ma5"] <= 3.3 and log["epochs_run"] >= 5
    assert log["config"]["variant"] == "base" and log["runtime"]["backend"] == "cpu"
    assert log["runtime"]["lokr_w1_kernel"] == {}  # CPU float32: the batched GEMM everywhere
    assert log["vram"]["ckpt_layers"] == 2 and log["delta_report"]
    kinds = {e.metric for e in events if isinstance(e, MetricEvent)}
    assert kinds >= {"vram", "data", "step", "epoch", "milestone"}
    kept = [m["name"] for m in log["milestones"]]
    assert 1 <= len(kept) <= 2
    for name in kept:
        assert storage.exists(f"{result.run_key}/milestones/{name}/lokr_weights.safetensors")
    folders = storage.list(f"{result.run_key}/milestones")
    assert sorted(f.rsplit("/", 1)[-1] for f in folders) == sorted(kept)


def test_non_finite_loss_stops_and_keeps_the_last_good_state(
    storage, tiny_dit_dir, single_thread, monkeypatch
) -> None:
    calls = {"n": 0}
    original = dit_loss.flow_matching_loss

    def poisoned(*args, **kwargs):
        out = original(*args, **kwargs)
        calls["n"] += 1
        if calls["n"] > 6:  # step 4 (two micro-batches per step)
            out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(dit_loss, "flow_matching_loss", poisoned)
    run, result = run_training(storage, tiny_dit_dir, fast_options(epochs=10))
    assert result.stop_reason == "non_finite" and result.steps == 3
    assert read_manifest(storage, run.checkpoint_key)["step"] == 3
    state = adapters.adapter_state_dict(run.transformer)
    assert all(torch.isfinite(v).all() for v in state.values())
    kind, tensors, _ = export.read_adapter_file(storage, result.run_key)
    assert all(torch.isfinite(t.float()).all() for t in tensors.values())
    log = json.loads(storage.read_text(f"{result.run_key}/dit_train_log.json"))
    assert log["stop_reason"] == "non_finite" and log["epochs_run"] == 3


def test_latest_adapter_of_the_artist_warm_starts_the_next_run(
    storage, tiny_dit_dir, single_thread
) -> None:
    first, _ = run_training(storage, tiny_dit_dir, fast_options(epochs=1, learning_rate=0.1))
    trained = adapters.adapter_state_dict(first.transformer)
    second = dit.setup(fast_options(init_adapter="latest"), storage, SLUG, settings(tiny_dit_dir))
    assert second.run_key != first.run_key
    for key, value in adapters.adapter_state_dict(second.transformer).items():
        # the BF16 export: round-to-nearest-even casts, the same bits on every CPU
        assert torch.equal(value, trained[key].bfloat16().float()), key


def test_compile_mode_resolution() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert dit.compile_mode("auto", cpu) == "off"
    assert dit.compile_mode("auto", cuda) == "default"
    assert dit.compile_mode("reduce-overhead", cuda) == "reduce-overhead"
    assert dit.compile_mode("off", cpu) == "off"
    # auto adds CUDA graphs only when nothing is checkpointed; an explicit mode is kept as asked
    assert compiling.with_graphs("auto", "default", ckpt_layers=0) == "reduce-overhead"
    assert compiling.with_graphs("auto", "default", ckpt_layers=3) == "default"
    assert compiling.with_graphs("default", "default", ckpt_layers=0) == "default"
    assert compiling.with_graphs("auto", "off", ckpt_layers=0) == "off"
    with pytest.raises(InputError, match="needs a CUDA device"):
        dit.compile_mode("default", cpu)
    with pytest.raises(InputError, match="max-autotune"):
        dit.compile_mode("max-autotune", cuda)


@pytest.mark.parametrize("flat", [True, False])
def test_graph_mode_accumulates_into_stable_gradient_buffers(
    storage, tiny_dit_dir, single_thread, flat, monkeypatch
) -> None:
    """With CUDA graphs a parameter's first gradient of a step would be the graph pool's memory,
    which the next micro-batch's replay overwrites: in that mode the step keeps one zeroed
    buffer per parameter across micro-batches and steps, each a view of one flat buffer, and
    clips and zeroes the flat buffer. The math is the eager step's (the mode is forced here on
    the CPU, where no graph is captured). `flat_grads` off: one buffer per parameter."""
    options = fast_options(grad_accum=2, batch=1)
    speed = SpeedOptions(flat_grads=flat)
    eager = dit.setup(options, storage, SLUG, settings(tiny_dit_dir, speed=speed))
    graphs = dit.setup(options, storage, SLUG, settings(tiny_dit_dir, speed=speed))
    graphs.engine.mode = "reduce-overhead"
    window = dit_windows.epoch_windows(eager.sampling, 1)[0]
    assert len(window) == 2  # two micro-batches accumulate into one step
    first = dit.optimizer_step(graphs, window)
    buffers = {id(p): p.grad for p in graphs.params}
    assert all(g is not None and not g.any() for g in buffers.values())  # zeroed, not dropped
    flats = graphs.engine.grad_flats  # every gradient a view of one flat buffer (`FlatGrads`)
    if flat:
        assert flats is not None and len(flats.buffers) == 1 and flats.backs()
        assert flats.buffers[0].numel() == sum(p.numel() for p in graphs.params)
    else:
        assert flats is None and all(g._base is None for g in buffers.values())
    second = dit.optimizer_step(graphs, window)
    assert all(p.grad is buffers[id(p)] for p in graphs.params)  # the same buffers again
    assert graphs.engine.grad_flats is flats
    graphs.optimizer.zero_grad(set_to_none=True)  # e.g. a bench's phase timing dropped them
    third = dit.optimizer_step(graphs, window)
    assert all(p.grad is not None for p in graphs.params)  # buffers again, before the backward
    if flat:
        assert graphs.engine.grad_flats is not flats and graphs.engine.grad_flats.backs()
    want = [dit.optimizer_step(eager, window) for _ in range(3)]
    got = [first, second, third]
    # One flat norm against torch's norm of per-tensor norms: float32 sums in other orders, a few
    # ulp apart; those ulp of the clip scale then carry through two AdamW steps into step 3's
    # parameters (float32 defaults), gradients and norm (rel 1e-5) and loss (rel 1e-6).
    assert [g.loss for g in got] == pytest.approx([w.loss for w in want], rel=1e-6)
    assert [g.grad_norm for g in got] == pytest.approx([w.grad_norm for w in want], rel=1e-5)
    for key, value in adapters.adapter_state_dict(graphs.transformer).items():
        torch.testing.assert_close(value, adapters.adapter_state_dict(eager.transformer)[key])


def test_inputs_prepared_during_the_previous_backward_give_the_same_steps(
    storage, tiny_dit_dir, single_thread
) -> None:
    """`optimizer_step(next_window=...)` assembles the next step's inputs early; the steps that use
    them equal steps that assemble their own, and a prepared window for another step is not used."""
    options = fast_options(grad_accum=2, batch=2)
    plain = dit.setup(options, storage, SLUG, settings(tiny_dit_dir))
    ahead = dit.setup(options, storage, SLUG, settings(tiny_dit_dir))
    windows = [dit_windows.epoch_windows(plain.sampling, epoch)[0] for epoch in range(3)]
    want = [dit.optimizer_step(plain, w) for w in windows]
    # another step's: ignored
    ahead.engine.prefetched = dit_windows.prepare_window(ahead.sampling, windows[1], 7)
    got = [dit.optimizer_step(ahead, windows[0], windows[1])]
    assert ahead.engine.prefetched is not None and ahead.engine.prefetched.step == 1
    assert ahead.engine.prefetched.window == list(windows[1])
    got += [
        dit.optimizer_step(ahead, windows[1], windows[2]),
        dit.optimizer_step(ahead, windows[2]),
    ]
    assert ahead.engine.prefetched is None
    # exact: the same inputs through the same kernels in this process, only assembled earlier
    assert [g.loss for g in got] == [w.loss for w in want]
    assert [g.grad_norm for g in got] == [w.grad_norm for w in want]
    for key, value in adapters.adapter_state_dict(ahead.transformer).items():
        assert torch.equal(value, adapters.adapter_state_dict(plain.transformer)[key]), key


def test_a_graph_fault_in_the_first_steps_falls_back_to_plain_compiled_blocks(
    storage, tiny_dit_dir, single_thread, monkeypatch
) -> None:
    """A CUDA-graph capture/replay error in one of the first steps recompiles the blocks without
    graphs and redoes the same step; out-of-memory is not treated as a graph fault."""
    options = fast_options(grad_accum=1, batch=1)
    eager = dit.setup(options, storage, SLUG, settings(tiny_dit_dir))
    window = dit_windows.epoch_windows(eager.sampling, 1)[0]
    want = dit.optimizer_step(eager, window)

    events: list = []
    run = dit.setup(options, storage, SLUG, settings(tiny_dit_dir), EventLog(events.append))
    run.engine.mode = "reduce-overhead"  # forced: the CPU captures nothing
    recompiled: list[str] = []
    monkeypatch.setattr(dit, "compile_blocks", lambda transformer, mode: recompiled.append(mode))
    real_step, calls = dit.optimizer_step, []

    def faulty(run_, window_, next_window=None):
        calls.append(run_.engine.mode)
        if len(calls) == 1:  # as a real graph step, it had attached its flat gradient buffer
            run_.engine.grad_flats = FlatGrads(run_.params)
            raise RuntimeError("CUDA graph replay overwrote a live tensor")
        return real_step(run_, window_, next_window)

    monkeypatch.setattr(dit, "optimizer_step", faulty)
    got = dit.guarded_step(run, window)
    assert calls == ["reduce-overhead", "default"] and recompiled == ["default"]
    # the redone step is the eager one (compile_blocks patched away): ulp-level slack only
    assert run.engine.mode == "default" and got.loss == pytest.approx(want.loss, rel=1e-6)
    assert (
        run.engine.grad_flats is None
    )  # the graph step's buffer is not kept alive after the fallback
    logs = [e for e in events if getattr(e, "level", None) == "warn"]
    assert any("CUDA graphs failed at step 1" in e.message for e in logs)

    oom = dit.setup(options, storage, SLUG, settings(tiny_dit_dir))
    oom.engine.mode = "reduce-overhead"

    def out_of_memory(run_, window_, next_window=None):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(dit, "optimizer_step", out_of_memory)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        dit.guarded_step(oom, window)


@pytest.mark.slow
def test_compiled_blocks_give_the_eager_gradients(storage, tiny_dit_dir, single_thread) -> None:
    """The compiled-block path of the GPU default, through Inductor on the CPU: with the key-mask
    processor, LoRA layers and the recompiles per layer kind, the loss and every adapter gradient
    equal the eager blocks'. Inductor's vectorised C++ kernels get these gradients wrong (torch
    2.13; see `dit.compile_mode`), so this runs them scalar (`cpp.simdlen` 1): the graph capture,
    decompositions, fusion and recompute choices are the ones the GPU's Triton code is built from."""
    import torch._dynamo as dynamo
    import torch._inductor.config as inductor_config

    options = fast_options(epochs=2, batch=2, grad_accum=1)
    runs = [dit.setup(options, storage, SLUG, settings(tiny_dit_dir)) for _ in range(2)]
    dit.compile_blocks(runs[1].transformer, "default")
    dynamo.utils.counters.clear()
    assert all(block._compiled_call_impl is not None for block in runs[1].transformer.layers)
    # one starting adapter for both, with B != 0 so every LoRA factor gets a gradient
    generator = torch.Generator().manual_seed(7)
    start = {
        key: 0.05 * torch.randn(value.shape, generator=generator)
        for key, value in adapters.adapter_state_dict(runs[0].transformer).items()
    }
    losses, grads = [], []
    for run in runs:
        adapters.load_adapter_state(run.transformer, start)
        window = dit_windows.epoch_windows(run.sampling, 1)[0]
        draws = dit_windows.draw_window(run.sampling, window, 0)
        with inductor_config.patch({"cpp.simdlen": 1}):  # compiled on the first call
            out = dit.micro_batch_loss(
                run,
                draws.crops[0],
                draws.t[0],
                draws.cfg_drop[0],
                draws.weights[0],
                [((1, 0), len(window[0]))],
            )
            out.loss.backward()
        losses.append(out.loss.item())
        grads.append([p.grad.clone() for p in run.params])
        run.optimizer.zero_grad(set_to_none=True)
    # each block one graph, through the trainer's own call (a break there split every 2B block
    # into ~7 graphs on the device's torch 2.11: docs/BENCHMARKS.md, tenth device run)
    assert not dynamo.utils.counters["graph_break"], dict(dynamo.utils.counters["graph_break"])
    # Inductor fuses and reorders float32 ops: a few ulp per op through 4 layers (~1e-6
    # relative); wrong compiled gradients are O(1) off
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    for eager, compiled in zip(*grads, strict=True):
        assert ((compiled - eager).norm() / eager.norm()).item() < 1e-4  # fused fp32 rounding


def test_no_epoch_is_best_before_a_step_has_changed_the_weights(
    storage, tiny_dit_dir, single_thread
) -> None:
    """lr(0) = 0: the first step leaves LoRA's B at zero, so its epoch's loss is the base model's
    and must not be exported as the "best" adapter. A run stopped before any step with a non-zero
    learning rate exports what it has as "final" and says the adapter never changed."""
    options = fast_options(epochs=4, learning_rate=1e-2)
    run, result = run_training(storage, tiny_dit_dir, options)
    assert run.schedule.factor(0) == 0 and run.state.step == 4  # one step per epoch here
    assert result.saved_reason == "best" and run.state.best_epoch >= 2

    messages: list[str] = []
    events = EventLog(lambda event: messages.append(getattr(event, "message", "")))
    run, result = run_training(storage, tiny_dit_dir, options, events=events, max_steps=1)
    assert run.state.step == 1 and result.saved_reason == "final"
    assert any("the adapter never changed" in message for message in messages)
