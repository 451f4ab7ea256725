"""Grid planning, the winner rule, and the two runners (in-process and Ray actors)."""

from __future__ import annotations

import pytest

from hotstep_ray.calibration.grid import (
    BASE,
    WorkItem,
    WorkResult,
    parse_scales,
    pick_winner,
    plan_items,
)
from hotstep_ray.calibration.ray_calibrate import run_local, run_on_ray
from hotstep_ray.calibration.runs import Candidate
from hotstep_ray.core.errors import InputError


def test_scales_parse_dedupe_and_stay_in_range():
    assert parse_scales("0.5, 0.75,1.0,1.0") == (0.5, 0.75, 1.0)
    for bad in ("0", "2.5", "x", ""):
        with pytest.raises(InputError):
            parse_scales(bad)


def test_items_are_base_then_candidate_major_with_identical_requests():
    candidates = [Candidate("final", "run"), Candidate("loss_2", "run/milestones/loss_2")]
    items = plan_items(candidates, (0.5, 1.0), [{"lm_seed": 1}, {"lm_seed": 2}])
    assert [(i.candidate, i.scale) for i in items] == [
        (BASE, 0.0), ("final", 0.5), ("final", 1.0), ("loss_2", 0.5), ("loss_2", 1.0)
    ]  # fmt: skip
    assert items[0].is_base and all(i.requests == items[0].requests for i in items)
    with pytest.raises(InputError):
        plan_items(candidates, (1.0,), [])


def test_winner_is_the_lowest_eligible_score_with_deterministic_ties():
    rows = [
        {"candidate": BASE, "scale": 0.0, "score": 0.0, "eligible": True},
        {"candidate": "a", "scale": 0.5, "score": 0.1, "eligible": False},  # guard tripped
        {"candidate": "a", "scale": 1.25, "score": 0.3, "eligible": True},
        {"candidate": "b", "scale": 0.9, "score": 0.3, "eligible": True},
        {"candidate": "b", "scale": 1.0, "score": float("nan"), "eligible": True},
    ]
    winner = pick_winner(rows, ["a", "b"])
    assert (winner["candidate"], winner["scale"]) == ("b", 0.9)  # tie: scale nearer 1
    rows[3]["scale"] = 0.75  # as near to 1 as a's 1.25: the earlier candidate wins
    assert pick_winner(rows, ["a", "b"])["candidate"] == "a"
    assert pick_winner([r for r in rows if r["candidate"] == BASE]) is None


def _make_factory():
    """A local function (Ray pickles it by value: test modules are not importable in workers)
    that builds the worker inside each actor."""

    def factory():
        return Worker()

    class Worker:
        def __init__(self) -> None:
            import os

            self.pid = os.getpid()
            self.loads: list[str] = []

        def __call__(self, item: WorkItem) -> WorkResult:
            if item.key and (not self.loads or self.loads[-1] != item.key):
                self.loads.append(item.key)
            return WorkResult(item.index, [item.candidate, item.scale], [str(self.pid)])

    return factory


def _items() -> list[WorkItem]:
    candidates = [Candidate(n, f"m/{n}") for n in ("a", "b", "c")]
    return plan_items(candidates, (0.5, 1.0), [{"seed": 1}])


def test_local_runner_keeps_order_and_reports_progress():
    seen = []
    results = run_local(_items(), _make_factory(), lambda d, t, item, r: seen.append((d, t)))
    assert [r.outputs for r in results][:3] == [[BASE, 0.0], ["a", 0.5], ["a", 1.0]]
    assert seen[-1] == (7, 7)


@pytest.mark.ray
def test_ray_runner_matches_the_local_one_over_two_actors(ray_session):
    seen = []
    items = _items()
    results = run_on_ray(
        items, _make_factory(), lambda d, t, item, r: seen.append(d), actors=2, num_cpus=0.5
    )
    assert [r.outputs for r in results] == [r.outputs for r in run_local(items, _make_factory())]
    assert [r.index for r in results] == list(range(7)) and sorted(seen) == list(range(1, 8))
    assert len({r.receipts[0] for r in results}) == 2  # both actors worked
