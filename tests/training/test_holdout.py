"""Held-out split rules and the per-epoch `eval` hook."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hotstep_ray.core.errors import InputError
from hotstep_ray.core.events import EventLog, MetricEvent
from hotstep_ray.training.holdout import (
    MIN_SONGS,
    HoldoutEval,
    lm_epoch_hook,
    partition_songs,
    split_holdout,
)
from hotstep_ray.training.lm_data import synthetic_songs


def test_holdout_refuses_fewer_than_six_songs():
    with pytest.raises(InputError, match="at least 6 songs"):
        split_holdout([f"s{i}" for i in range(MIN_SONGS - 1)], 0.2)
    split = split_holdout([f"s{i}" for i in range(MIN_SONGS)], 0.2)
    assert len(split.held_out) == 1 and len(split.train) == 5


def test_split_is_deterministic_order_free_and_bounded():
    ids = [f"song-{i:02d}" for i in range(20)]
    first = split_holdout(ids, 0.25, seed=7)
    assert first == split_holdout(list(reversed(ids)), 0.25, seed=7)
    assert len(first.held_out) == 5 and set(first.held_out).isdisjoint(first.train)
    assert split_holdout(ids, 0.25, seed=8).held_out != first.held_out
    assert len(split_holdout(ids, 0.01).held_out) == 1  # at least one song held out
    assert len(split_holdout(ids, 0.99).train) == 1  # at least one song trains
    for bad in (0.0, 1.0):
        with pytest.raises(InputError):
            split_holdout(ids, bad)
    with pytest.raises(InputError, match="unique"):
        split_holdout(ids + ids[:1], 0.2)


def test_partition_songs_follows_the_split():
    songs = synthetic_songs(8, 5)
    split = split_holdout([s.song_id for s in songs], 0.25)
    train, held = partition_songs(songs, split)
    assert [s.song_id for s in held] == list(split.held_out) and len(train) == 6


def test_eval_hook_emits_mean_held_out_loss_and_restores_training_mode():
    model = nn.Linear(2, 2).train()
    modes: list[bool] = []

    def song_losses(m: nn.Module) -> list[float]:
        modes.append(m.training)
        assert not torch.is_grad_enabled()
        return [1.0, 2.0, 4.5]

    events: list = []
    hook = HoldoutEval(song_losses, songs=3, events=EventLog(events.append), every=2)
    assert hook(1, model) is None and not events  # skipped epoch
    assert hook(2, model) == 2.5 and modes == [False] and model.training
    hook(4, model)
    first, second = events
    assert isinstance(first, MetricEvent) and first.metric == "eval" and first.epoch == 2
    assert first.loss == 2.5 and first.model_extra["split"] == "holdout"
    assert first.model_extra["songs"] == 3 and first.model_extra["best"]
    assert not second.model_extra["best"] and hook.history == [
        {"epoch": 2, "loss": 2.5},
        {"epoch": 4, "loss": 2.5},
    ]


def test_lm_epoch_hook_has_the_trainers_on_epoch_signature():
    seen = []
    hook = lm_epoch_hook(HoldoutEval(lambda m: seen.append(m) or [0.5], songs=1))

    class Setup:
        model = nn.Linear(1, 1)

    class State:
        epoch = 3

    hook(Setup(), State())
    assert seen == [Setup.model]
