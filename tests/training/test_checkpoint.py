"""Checkpoint: resume equals uninterrupted training bit for bit; wrong base model refused."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from hotstep_ray.core.storage import Storage
from hotstep_ray.training import adapters, checkpoint, optim
from hotstep_ray.training.adapters import AdapterSpec
from hotstep_ray.training.schedule import LrSchedule, StopRule

SPECS = {
    "lora": AdapterSpec(kind="lora", rank=16, alpha=32, dropout=0.1),  # dropout draws torch RNG
    "lokr": AdapterSpec(kind="lokr", rank=8, alpha=4, factor=4),  # Muon and AdamW both in use
}
STEPS = 6


def _setup(make_toy, spec):
    model = adapters.inject(make_toy(0), spec)
    model.train()
    opt = optim.build_optimizer(adapters.trainable_parameters(model), "muon", lr=1e-3)
    return model, opt, LrSchedule(total_steps=STEPS, warmup_steps=2), StopRule(max_epochs=10)


def _train(model, opt, schedule, rule, start: int, stop: int) -> None:
    for step in range(start, stop):
        # Every RNG the data path may use: python (crop), numpy (order), torch (noise, dropout).
        length = random.randint(3, 6)
        shift = float(np.random.rand())
        x = torch.randn(2, length, 16) + shift
        context = torch.randn(2, 5, 64)
        loss = (model(x, context) - x).square().mean()
        loss.backward()
        schedule.apply(opt, step)
        opt.step()
        opt.zero_grad()
        rule.end_epoch(step + 1, loss.item())


def _seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@pytest.mark.parametrize("kind", sorted(SPECS))
def test_resume_equals_uninterrupted_bit_for_bit(tmp_path, make_toy, kind):
    spec = SPECS[kind]
    _seed(42)
    model, opt, schedule, rule = _setup(make_toy, spec)
    _seed(43)
    _train(model, opt, schedule, rule, 0, STEPS)
    uninterrupted = adapters.adapter_state_dict(model)

    _seed(42)
    model, opt, schedule, rule = _setup(make_toy, spec)
    _seed(43)
    _train(model, opt, schedule, rule, 0, STEPS // 2)
    storage = Storage(tmp_path)
    checkpoint.save_checkpoint(
        storage,
        "ckpt",
        model=model,
        optimizer=opt,
        step=STEPS // 2,
        epoch=1,
        config={"spec": spec.model_dump(mode="json")},
        extra={"stop_rule": rule.state_dict(), "schedule": schedule.to_dict()},
    )
    assert opt.split_summary() == ("44 Muon / 0 AdamW" if kind == "lora" else "16 Muon / 34 AdamW")

    _seed(999)  # a fresh process: other RNG state, freshly initialised adapter
    model, opt, schedule, rule = _setup(make_toy, spec)
    state = checkpoint.load_checkpoint(storage, "ckpt", model=model, optimizer=opt)
    rule.load_state_dict(state.extra["stop_rule"])
    assert (state.step, state.epoch, state.config["spec"]["kind"]) == (STEPS // 2, 1, kind)
    assert state.extra["schedule"] == schedule.to_dict()
    _train(model, opt, schedule, rule, state.step, STEPS)
    resumed = adapters.adapter_state_dict(model)
    for key, value in uninterrupted.items():
        assert torch.equal(value, resumed[key]), key


def test_fingerprint_mismatch_is_refused(tmp_path, make_toy):
    storage = Storage(tmp_path)
    model = adapters.inject(make_toy(0), SPECS["lokr"])
    assert checkpoint.model_fingerprint(model) == checkpoint.model_fingerprint(make_toy(0))
    checkpoint.save_checkpoint(storage, "c", model=model, optimizer=None, step=1, epoch=0)
    other = adapters.inject(make_toy(1), SPECS["lokr"])  # same shapes, other weights
    with pytest.raises(checkpoint.CheckpointMismatchError, match="same base weights"):
        checkpoint.load_checkpoint(storage, "c", model=other)
    checkpoint.load_checkpoint(storage, "c", model=adapters.inject(make_toy(0), SPECS["lokr"]))


def test_checkpoint_files_are_pickle_free_atomic_and_checked(tmp_path, make_toy):
    storage = Storage(tmp_path)
    model = adapters.inject(make_toy(0), SPECS["lora"])
    opt = optim.build_optimizer(adapters.trainable_parameters(model), "muon", lr=1e-3)
    for step in (1, 2):
        checkpoint.save_checkpoint(storage, "c", model=model, optimizer=opt, step=step, epoch=0)
    names = sorted(p.name for p in (tmp_path / "c").iterdir())
    assert "checkpoint.json" in names and len(names) == 3  # superseded payloads removed
    assert all(n.endswith((".json", ".safetensors")) for n in names)
    manifest = checkpoint.read_manifest(storage, "c")
    assert manifest["step"] == 2 and set(manifest["files"].values()) <= set(names)
    damaged = tmp_path / "c" / manifest["files"]["state"]
    data = damaged.read_bytes()
    damaged.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    with pytest.raises(checkpoint.CheckpointMismatchError, match="damaged"):
        checkpoint.load_checkpoint(storage, "c", model=model, optimizer=opt)


def test_tree_round_trip_keeps_types():
    tree = {
        "state": {0: {"step": torch.tensor(3.0), "m": torch.ones(2, 2)}},
        "betas": (0.9, 0.999),
        "rng": np.random.get_state(),
        "none": None,
        "flag": True,
    }
    tensors: dict[str, torch.Tensor] = {}
    encoded = checkpoint.encode_tree(tree, tensors)
    decoded = checkpoint.decode_tree(encoded, tensors)
    assert list(decoded["state"]) == [0] and decoded["betas"] == (0.9, 0.999)
    assert torch.equal(decoded["state"][0]["m"], torch.ones(2, 2))
    assert np.array_equal(decoded["rng"][1], tree["rng"][1]) and decoded["rng"][0] == "MT19937"
    with pytest.raises(TypeError, match="no pickle"):
        checkpoint.encode_tree({"f": object()}, {})


def test_the_lm_checkpoints_on_the_cadence_not_every_epoch():
    """`contracts.CheckpointCadence`: the first epoch, then each `checkpoint_every_epochs`, then
    the finished one; the 300 s clock cannot run out inside this test's few microseconds."""
    from hotstep_ray.core.contracts import TrainLmOptions
    from hotstep_ray.training import lm

    due = lm.checkpoint_cadence(TrainLmOptions(checkpoint_every_s=300, checkpoint_every_epochs=3))
    state = lm.LmTrainState()
    asked = []
    for epoch in range(1, 8):
        state.epoch, state.stop_reason = epoch, "epochs" if epoch == 7 else ""
        asked.append(due(state))
    assert asked == [True, False, True, False, False, True, True]
    state.stop_reason = ""  # not finished: only the clock can make these due
    every = lm.checkpoint_cadence(TrainLmOptions(checkpoint_every_s=0))
    assert all(every(state) for _ in range(3))  # 0 s: every epoch
    hourly = lm.checkpoint_cadence(TrainLmOptions(checkpoint_every_s=3600))
    assert [hourly(state) for _ in range(3)] == [True, False, False]  # the first, then the clock


def test_checkpoint_due_counts_seconds_from_the_last_one():
    assert checkpoint.due(5, last_saved=100.0, every_s=60, every_epochs=0, now=160.0)
    assert not checkpoint.due(5, last_saved=100.0, every_s=60, every_epochs=0, now=159.9)
    assert checkpoint.due(1, last_saved=0.0, every_s=86400, every_epochs=0, now=1.7e9)  # first
