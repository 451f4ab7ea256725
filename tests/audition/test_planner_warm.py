"""Warm start of the planner LM: `Stepper.prepare` compiles/captures a step ahead of any request
and leaves the stepper as a fresh one; `PlannerLM.warm` prepares the steppers that requests of
given durations then pick. On the CPU the static engines are "static" itself, "graph" through
`test_lm_graph`'s stand-in capture and "compiled" through Inductor's CPU backend (the test-only
switch); the compiled cases share `test_lm_compiled`'s graph (two rows, the 1024 bucket)."""

from __future__ import annotations

import pytest
import torch
from test_lm_compiled import compile_on_cpu  # noqa: F401  (fixtures)
from test_lm_graph import graph_on_cpu  # noqa: F401  (fixtures)

from hotstep_ray.audition.lm_decode import Stepper
from hotstep_ray.audition.planner import PlannerLM
from hotstep_ray.audition.schemas import LmRequest

ROWS = [list(range(100, 130)), list(range(200, 212))]  # CFG: two rows of unequal length
TOKENS = [torch.tensor(t) for t in range(5, 17)]  # 12 decode steps
METAS = {"bpm": 120, "keyscale": "C major", "timesignature": "4"}  # all set: no phase 1
# A long prompt for a 240 s request: a 60-word caption and a 4-minute song's lyrics (40 lines,
# ~600 prompt tokens), what `WARM_TEXT_TOKENS` budgets for.
LONG_CAPTION = " ".join(["dreamy synthwave with warm analog pads"] * 10)
LONG_LYRICS = "[verse]\n" + "\n".join(["walking through the neon light tonight we run"] * 40)


@pytest.fixture(params=["static", "graph", "compiled"])
def engine(request) -> str:
    """A static engine, kept on the CPU by its test switch ("graph": stand-in capture)."""
    if request.param == "graph":
        request.getfixturevalue("graph_on_cpu")
    elif request.param == "compiled":
        request.getfixturevalue("compile_on_cpu")
    return request.param


def _planner(planner: PlannerLM, mode: str) -> PlannerLM:
    """A planner of its own (no steppers yet) over the session's tiny LM and tokenizer."""
    return PlannerLM(planner.base.model, planner.tokenizer, lm_size="0.6B", decode_mode=mode)


def _count_prepares(monkeypatch) -> list[Stepper]:
    """The steppers that run the lazy preparation (`Stepper._prepare`) from now on."""
    calls: list[Stepper] = []
    original = Stepper._prepare

    def spy(self: Stepper) -> None:
        calls.append(self)
        original(self)

    monkeypatch.setattr(Stepper, "_prepare", spy)
    return calls


class _Picked(Exception):
    """Raised by `_stepper_of`'s `Stepper.start`: the request has picked its stepper."""


def _stepper_of(planner: PlannerLM, request: LmRequest, monkeypatch) -> Stepper:
    """The stepper `request`'s phase 2 starts on, found without decoding (a 240 s request takes
    ~10 s on the CPU)."""
    picked: list[Stepper] = []

    def start(self: Stepper, rows: list[list[int]], max_new: int) -> torch.Tensor:
        picked.append(self)
        raise _Picked

    with monkeypatch.context() as patch:
        patch.setattr(Stepper, "start", start)
        with pytest.raises(_Picked):
            planner.plan(request)
    return picked[0]


def _run(stepper: Stepper) -> list[torch.Tensor]:
    # a captured step returns its static output buffer (overwritten by the next replay): clone
    return [stepper.start(ROWS, len(TOKENS))] + [stepper.step(t).clone() for t in TOKENS]


@pytest.mark.parametrize("engine", ["static", "graph"], indirect=True)
@pytest.mark.parametrize("cfg", [True, False])
def test_warm_builds_the_steppers_requests_pick(planner, engine, cfg, monkeypatch):
    warmed = _planner(planner, engine)
    report = warmed.warm(cfg=cfg)
    rows = 2 if cfg else 1
    assert set(report) == {(rows, 1024), (rows, 2048)}
    assert all(seconds >= 0 for seconds in report.values())
    steppers = dict(warmed.base.steppers)
    assert set(steppers) == set(report)
    for (count, bucket), stepper in steppers.items():
        assert stepper.mode == engine
        assert (stepper.static_rows, stepper.static_len) == (count, bucket)
        assert stepper.mode != "graph" or stepper._graph is not None  # captured already
    cfg_scale = 2.0 if cfg else 1.0
    short = LmRequest(caption="dark synthwave", duration=30, cfg_scale=cfg_scale, **METAS)
    long = LmRequest(
        caption=LONG_CAPTION, lyrics=LONG_LYRICS, duration=240, cfg_scale=cfg_scale, **METAS
    )
    assert _stepper_of(warmed, short, monkeypatch) is steppers[(rows, 1024)]
    assert _stepper_of(warmed, long, monkeypatch) is steppers[(rows, 2048)]
    assert warmed.base.steppers == steppers  # the requests built no stepper


def test_warmed_planner_gives_the_fresh_codes(planner, engine, monkeypatch):
    """A warmed planner's first requests replay the prepared step (no lazy preparation) and
    sample exactly the codes of a fresh planner's, which prepares lazily in its first step."""
    warmed = _planner(planner, engine)
    assert list(warmed.warm(seconds=(30.0,))) == [(2, 1024)]
    prepared = warmed.base.steppers[(2, 1024)]
    prepares = _count_prepares(monkeypatch)
    fresh = _planner(planner, engine)
    for duration in (3, 30):
        request = LmRequest(
            caption="dark synthwave", lyrics="[verse]\nneon", duration=duration, lm_seed=11, **METAS
        )
        want = fresh.plan(request).result
        got = warmed.plan(request).result
        assert got.codes == want.codes and len(got.codes) == duration * 5
        assert got.codes_sha1 == want.codes_sha1
    assert list(warmed.base.steppers) == [(2, 1024)] and warmed.base.steppers[(2, 1024)] is prepared
    assert prepared.mode == engine
    # only the fresh planner's first step prepared (the static engine has nothing to prepare)
    assert prepares == ([] if engine == "static" else [fresh.base.steppers[(2, 1024)]])


@pytest.mark.parametrize("mode", ["eager", "auto"])  # auto is eager on the CPU
def test_eager_warm_does_nothing(planner, mode):
    eager = _planner(planner, mode)
    assert eager.decode_mode == "eager"
    assert eager.warm() == {}
    assert eager.base.steppers == {}
    stepper = Stepper(planner.base.model, "eager")
    stepper.prepare(2)
    assert not hasattr(stepper, "cache")


def test_prepare_needs_the_cache_length(planner):
    with pytest.raises(ValueError, match="max_len"):
        Stepper(planner.base.model, "static").prepare(2)


def test_prepare_leaves_a_fresh_stepper(planner, engine, monkeypatch):
    """After `prepare` the cache, its counters and the step inputs are zeros (a fresh stepper's
    lazily allocated state); a second `prepare` redoes nothing; the steps, and everything they
    leave in the cache, equal an unprepared stepper's exactly."""
    model = planner.base.model
    prepared = Stepper(model, engine, max_len=1024)
    prepared.prepare(2)
    assert prepared.mode == engine and (prepared.static_rows, prepared.static_len) == (2, 1024)
    for layer in prepared.cache.layers:
        assert layer.is_initialized and int(layer.cumulative_length) == 0
        assert not layer.keys.any() and not layer.values.any()
    for buffer in (prepared.step_ids, prepared.step_pos, prepared.step_mask):
        assert not buffer.any()
    graph, compiled = prepared._graph, prepared._compiled
    assert (graph is not None) == (engine == "graph")
    assert (compiled is not None) == (engine == "compiled")

    prepares = _count_prepares(monkeypatch)
    prepared.prepare(2)
    assert prepared._graph is graph and prepared._compiled is compiled
    fresh = Stepper(model, engine, max_len=1024)
    got, want = _run(prepared), _run(fresh)
    assert prepares == ([] if engine == "static" else [fresh])  # prepared: no lazy preparation
    assert prepared._graph is graph and prepared._compiled is compiled
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    for mine, theirs in zip(prepared.cache.layers, fresh.cache.layers, strict=True):
        assert torch.equal(mine.keys, theirs.keys) and torch.equal(mine.values, theirs.values)
        assert torch.equal(mine.cumulative_length, theirs.cumulative_length)
    assert torch.equal(prepared.step_mask, fresh.step_mask) and prepared.slot == fresh.slot
