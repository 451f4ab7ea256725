"""GPU lease: two overlapping jobs never restore early or twice."""

from __future__ import annotations

import threading

from hotstep_ray.audition.lifecycle import EngineLifecycle


class Engine:
    """Records calls; `start` can be held open to simulate a slow restore."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.gate = threading.Event()
        self.gate.set()
        self.starting = threading.Event()

    def stop(self) -> None:
        self.calls.append("stop")

    def start(self) -> None:
        self.starting.set()
        self.gate.wait(5)
        self.calls.append("start")


def test_two_overlapping_jobs_restore_once_after_the_last():
    engine = Engine()
    life = EngineLifecycle(engine.stop, engine.start)
    a = life.acquire("job-a")
    b = life.acquire("job-b")
    assert engine.calls == ["stop"] and life.suspended and not life.running
    assert life.release(a) is False  # job-b still trains: no early restore
    assert engine.calls == ["stop"] and life.suspended
    assert life.release(b) is True
    assert engine.calls == ["stop", "start"] and life.running and not life.suspended
    assert life.release(b) is False  # a second release never restores twice
    assert (life.stops, life.restores) == (1, 1)


def test_acquire_during_an_in_flight_restore_stops_again():
    engine = Engine()
    life = EngineLifecycle(engine.stop, engine.start)
    a = life.acquire("job-a")
    engine.gate.clear()
    restorer = threading.Thread(target=life.release, args=(a,))
    restorer.start()
    assert engine.starting.wait(5)  # job-a's restore is inside start()
    acquired = threading.Event()
    holder: dict = {}

    def take() -> None:
        holder["b"] = life.acquire("job-b")
        holder["running_when_b_starts"] = life.running
        acquired.set()

    taker = threading.Thread(target=take)
    taker.start()
    assert not acquired.wait(0.2)  # job-b waits for the restore to finish, then stops it
    engine.gate.set()
    restorer.join(5)
    taker.join(5)
    assert holder["running_when_b_starts"] is False and life.suspended
    assert engine.calls == ["stop", "start", "stop"]
    life.release(holder["b"])
    assert engine.calls[-1] == "start" and life.restores == 2 and life.running


def test_stale_restore_is_cancelled_by_a_newer_acquire():
    engine = Engine()
    life = EngineLifecycle(engine.stop, engine.start)
    a = life.acquire("job-a")
    life.holders.discard("job-a")  # job-a released its hold...
    stale_epoch = life.epoch + 1
    life.epoch = stale_epoch  # ...and scheduled a restore at this epoch
    b = life.acquire("job-b")  # before the restore ran
    assert life._restore(stale_epoch) is False and engine.calls == ["stop"]
    life.release(b)
    assert engine.calls == ["stop", "start"]
    assert a.stopped_engine


def test_stop_engine_false_touches_nothing():
    engine = Engine()
    life = EngineLifecycle(engine.stop, engine.start)
    with life.lease("job-c", stop_engine=False) as token:
        assert not token.stopped_engine and life.running and not life.suspended
    with life.lease("job-d"):
        assert not life.running
    assert engine.calls == ["stop", "start"]
