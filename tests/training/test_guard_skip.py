"""`dit.SKIP_SEEN_GUARDS`: a step whose input shapes an earlier step ran with every Dynamo guard
skips the guards that do not tell cached graphs apart; the training is the same."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch._dynamo as dynamo
from test_dit_support import (  # noqa: F401  (fixtures)
    SLUG,
    fast_options,
    single_thread_fixture,
    tiny_dit_dir_fixture,
    write_cache,
)

from hotstep_ray.core.storage import Storage
from hotstep_ray.training import adapters, dit


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    dynamo.reset()
    yield
    dynamo.reset()


@pytest.fixture
def storage(tmp_path) -> Storage:
    store = Storage(tmp_path / "data")
    write_cache(store)  # three songs; the 40-frame one is padded to the 48-frame crop
    return store


def compiled_run(storage: Storage, tiny_dit_dir, start: dict) -> dit.DitRun:
    """A tiny LoRA run whose blocks are compiled with Dynamo + AOTAutograd (no Inductor on the
    CPU), from the given adapter values."""
    options = fast_options(batch=1, grad_accum=1, epochs=3)
    settings = dit.DitSettings(checkpoints_dir=str(tiny_dit_dir), step_event_interval_s=0.0)
    run = dit.setup(options, storage, SLUG, settings)
    adapters.load_adapter_state(run.transformer, start)
    dit.compile_blocks(run.transformer, "default", backend="aot_eager")
    run.compile = "default"
    return run


@pytest.mark.slow
def test_seen_shapes_skip_guards_and_train_the_same(
    storage, tiny_dit_dir, single_thread, monkeypatch
) -> None:
    probe = dit.setup(
        fast_options(batch=1, grad_accum=1),
        storage,
        SLUG,
        dit.DitSettings(checkpoints_dir=str(tiny_dit_dir)),
    )
    generator = torch.Generator().manual_seed(5)
    start = {  # B != 0, so every step moves every factor
        key: 0.05 * torch.randn(value.shape, generator=generator)
        for key, value in adapters.adapter_state_dict(probe.transformer).items()
    }
    stances: list[bool] = []
    real_stance = torch.compiler.set_stance

    def recording_stance(*args, **kwargs):
        stances.append(kwargs.get("skip_guard_eval_unsafe", False))
        return real_stance(*args, **kwargs)

    monkeypatch.setattr(torch.compiler, "set_stance", recording_stance)
    results = {}
    for skip in (False, True):
        monkeypatch.setattr(dit, "SKIP_SEEN_GUARDS", skip)
        stances.clear()
        run = compiled_run(storage, tiny_dit_dir, start)
        losses, skipped = [], []
        for epoch in (1, 2):
            for window in dit.epoch_windows(run, epoch):
                seen = len(run.guarded_shapes)
                before = len(stances)
                losses.append(dit.optimizer_step(run, window).loss)
                skipped.append(len(stances) > before)
                # a step adds its shapes once: new shapes run with every guard
                assert len(run.guarded_shapes) - seen == (0 if skipped[-1] else int(skip))
        params = [p.detach().clone() for p in run.params]
        results[skip] = (losses, params, skipped, len(run.guarded_shapes))
        dynamo.reset()

    guarded_losses, guarded_params, never, none_seen = results[False]
    losses, params, skipped, shapes = results[True]
    assert not any(never) and none_seen == 0  # off: no stance, nothing recorded
    # on: three input shapes (each song's masks differ: frames and condition padded, nothing
    # padded, condition padded), each run once with every guard; the second epoch skips
    assert shapes == 3 and skipped == [False] * 3 + [True] * 3
    assert all(stances)  # the stance is only ever entered to skip
    assert losses == pytest.approx(guarded_losses, rel=1e-6, abs=0)
    for now, then in zip(params, guarded_params, strict=True):
        torch.testing.assert_close(now, then, rtol=1e-6, atol=0)


def test_input_shapes_tell_masks_batch_and_mode_apart(storage, tiny_dit_dir) -> None:
    run = dit.setup(
        fast_options(batch=2, grad_accum=1),
        storage,
        SLUG,
        dit.DitSettings(checkpoints_dir=str(tiny_dit_dir)),
    )
    windows = dit.epoch_windows(run, 1)
    two, one = (dit.prepare_window(run, w, 0) for w in windows[:2])
    assert dit.input_shapes(two, 1, True) == dit.input_shapes(two, 1, True)
    assert dit.input_shapes(two, 1, True) != dit.input_shapes(one, 1, True)  # batch 2 vs 1
    assert dit.input_shapes(two, 1, True) != dit.input_shapes(two, 1, False)  # train vs eval
    assert dit.input_shapes(two, 1, True) != dit.input_shapes(two, 2, True)  # fold
    masked = dit.input_shapes(two, 1, True)[0][0]
    two.host[0].latent_mask = None  # no padding in this batch: a different graph
    assert dit.input_shapes(two, 1, True)[0][0] != masked


def test_steps_skip_guards_only_for_seen_shapes_with_room_under_the_recompile_limit(
    storage, tiny_dit_dir, monkeypatch
) -> None:
    """Past Dynamo's recompile limit a block code runs eagerly and its differentiating guards
    stop updating: skipping there could pick another block's graph, so the policy stops first."""
    run = dit.setup(
        fast_options(batch=1, grad_accum=1),
        storage,
        SLUG,
        dit.DitSettings(checkpoints_dir=str(tiny_dit_dir)),
    )
    prepared = dit.prepare_window(run, dit.epoch_windows(run, 1)[0], 0)
    monkeypatch.setattr(dit, "SKIP_SEEN_GUARDS", True)
    assert dit.skips_guards(run, prepared) == (False, None)  # blocks not compiled
    run.compile = "default"
    skip, shapes = dit.skips_guards(run, prepared)
    assert not skip and shapes is not None  # a new shape
    run.guarded_shapes.add(shapes)
    assert dit.skips_guards(run, prepared) == (True, shapes)  # seen
    # (torch's config.patch: monkeypatch's undo deletes a config attribute instead of resetting it)
    with dynamo.config.patch(recompile_limit=2 * dit.GRAPHS_PER_SHAPE - 1):
        assert dit.skips_guards(run, prepared) == (False, shapes)  # one more could fill it
    assert dit.skips_guards(run, prepared) == (True, shapes)
    monkeypatch.setattr(dit, "SKIP_SEEN_GUARDS", False)
    assert dit.skips_guards(run, prepared) == (False, None)
