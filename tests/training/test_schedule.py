"""LR values at known steps, the moving average, the stop rule and the milestone ladder."""

from __future__ import annotations

import math

import pytest

from hotstep_ray.training.schedule import (
    LrSchedule,
    Milestone,
    MilestoneTracker,
    MovingAverage,
    StopRule,
    lr_factor,
)


def test_lr_schedule_values_at_known_steps():
    # 14 songs, 250 epochs, batch 1, GA 4 -> 4 steps/epoch, 1000 steps, warmup max(50, 5%) = 50.
    schedule = LrSchedule.from_counts(14, 250, 1, 4, 0.05)
    assert (schedule.steps_per_epoch, schedule.total_steps, schedule.warmup_steps) == (4, 1000, 50)
    assert schedule.factor(0) == 0.0
    assert schedule.factor(25) == 0.5
    assert schedule.factor(50) == 1.0  # end of warmup: peak
    # last step: the 10% floor. Python float64 cosine (libm, ~1 ulp): 1e-15 is a few ulp of 0.1
    assert schedule.factor(999) == pytest.approx(0.1, abs=1e-15)
    odd = LrSchedule(total_steps=1001, warmup_steps=50)  # cosine span 950, midpoint at 525
    # float64 cosines (cos(pi/2) ~ 6e-17, not 0): ulp-level, inside 1e-12 and the default 1e-6
    assert odd.factor(525) == pytest.approx(0.55, abs=1e-12)
    assert odd.factor(525 - 95) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(0.4 * math.pi)))
    values = [schedule.factor(s) for s in range(1000)]
    assert all(a <= b for a, b in zip(values[:50], values[1:51], strict=True))
    assert all(a >= b for a, b in zip(values[50:-1], values[51:], strict=True))
    assert lr_factor(5000, 1000, 50) == pytest.approx(0.1)  # past the end: the floor (float64)


def test_warmup_is_five_percent_with_a_50_step_floor_and_a_half_run_cap():
    """The seed's preview arithmetic (reference/hotstep.md): warmup = max(50, total · ratio),
    at most half the run; the 5% alone governs only runs past 1000 steps."""
    long_run = LrSchedule.from_counts(14, 1000, 1, 4, 0.05)  # 4000 steps
    assert (long_run.total_steps, long_run.warmup_steps) == (4000, 200)
    short_run = LrSchedule.from_counts(3, 500, 1, 4, 0.05)  # 1 step per epoch: 500 steps
    assert (short_run.total_steps, short_run.warmup_steps) == (500, 50)
    tiny_run = LrSchedule.from_counts(3, 60, 1, 4, 0.05)  # 60 steps: the cap, 30
    assert tiny_run.warmup_steps == 30 and tiny_run.factor(15) == 0.5
    assert LrSchedule.from_counts(14, 1000, 1, 4, 0.1).warmup_steps == 400


def test_moving_average_and_state():
    average = MovingAverage(5)
    assert math.isnan(average.value)
    for value in (5, 4, 3, 2):
        average.update(value)
    assert average.value == 3.5 and not average.full
    assert average.update(1) == 3.0 and average.full
    assert average.update(0) == 2.0  # 5 drops out
    copy = MovingAverage()
    copy.load_state_dict(average.state_dict())
    assert copy.update(10) == average.update(10)


def test_stop_rule_target_on_full_window_epochs_and_non_finite():
    rule = StopRule(max_epochs=10, target_loss=0.6, window=5)
    losses = [0.125, 1.0, 1.0, 1.0, 0.25, 0.0]
    decisions = [rule.end_epoch(e, loss) for e, loss in enumerate(losses, 1)]
    assert not any(d.stop for d in decisions)  # 0.125 alone is no 5-epoch average
    assert [d.moving_average for d in decisions[4:]] == [0.675, 0.65]
    stop = rule.end_epoch(7, 0.0)  # (1 + 1 + 0.25 + 0 + 0) / 5
    assert stop.stop and stop.reason == "target" and stop.moving_average == 0.45

    capped = StopRule(max_epochs=2)
    assert capped.end_epoch(1, 5.0).stop is False
    assert capped.end_epoch(2, 5.0).reason == "epochs"

    nan = StopRule(max_epochs=100, target_loss=0.5)
    nan.end_epoch(1, 1.0)
    nan.end_epoch(2, 0.9)
    assert nan.check_step(float("inf")).reason == "non_finite"
    bad = nan.end_epoch(3, float("nan"))
    assert bad.stop and bad.reason == "non_finite" and bad.last_good_epoch == 2
    resumed = StopRule(max_epochs=100, target_loss=0.5)
    resumed.load_state_dict(nan.state_dict())
    # the mean of 1.0 and 0.9 in float64: an ulp or so (approx's default rel 1e-6)
    assert resumed.last_good_epoch == 2 and resumed.average.value == pytest.approx(0.95)


def test_stop_rule_target_is_ma5_not_raw_loss():
    rule = StopRule(max_epochs=100, target_loss=0.6)
    for epoch, loss in enumerate([1.0, 1.0, 1.0, 1.0, 0.5], 1):
        decision = rule.end_epoch(epoch, loss)
    assert not decision.stop and decision.moving_average == pytest.approx(0.9)  # float64 mean


def test_milestone_ladder_keeps_the_lowest():
    tracker = MilestoneTracker(step=0.1, keep=2)
    saved, evicted = [], []
    for epoch, loss in enumerate([0.95, 0.93, 0.87, 0.74, 0.76, 0.61, 0.58, 0.52], 1):
        decision = tracker.observe(epoch, loss)
        if decision.save:
            saved.append((decision.save.name, epoch))
        evicted += [m.name for m in decision.evict]
    # First epoch only sets the rung (1.0); each new lower rung saves once.
    assert saved == [("loss_0.9", 3), ("loss_0.8", 4), ("loss_0.7", 6), ("loss_0.6", 7)]
    assert evicted == ["loss_0.9", "loss_0.8"]
    assert [m.name for m in tracker.kept] == ["loss_0.6", "loss_0.7"]
    resumed = MilestoneTracker(step=0.1, keep=2)
    resumed.load_state_dict(tracker.state_dict())
    assert resumed.observe(9, 0.55).save is None  # still rung 0.6
    assert resumed.observe(10, 0.49).save == Milestone("loss_0.5", 10, 0.49)


def test_milestone_edges():
    exact = MilestoneTracker(step=0.1, keep=0)
    exact.observe(1, 0.45)
    assert exact.observe(2, 0.3).save.name == "loss_0.3"  # 0.3/0.1 = 2.9999999999999996
    assert exact.observe(3, 0.05).save.name == "loss_0.1"  # a multi-rung fall saves one
    lm = MilestoneTracker(step=1.0)
    lm.observe(1, 7.2)
    assert lm.observe(2, 5.5).save.name == "loss_6"
    assert MilestoneTracker(step=0.0).observe(1, 0.1).save is None  # off
    assert MilestoneTracker(step=0.1).observe(1, float("nan")).save is None
    periodic = MilestoneTracker(every_epochs=2, keep=1)
    assert periodic.observe(1, 1.0).save is None
    assert periodic.observe(2, 1.0).save.name == "epoch_2"
    worse = periodic.observe(4, 2.0)
    assert worse.save is None and worse.evict == ()  # not among the best 1: not written
    better = periodic.observe(6, 0.5)
    assert better.save.name == "epoch_6" and [m.name for m in better.evict] == ["epoch_2"]
