"""The capture gate: a trainer's first runs of each step shape hold the process's lock (where
compiling and capturing happen), later runs and CPU runs do not."""

from __future__ import annotations

import threading
import time

import torch

from hotstep_ray.training import capture_gate


def _held(warmup: capture_gate.Warmup, shape: object) -> bool:
    with warmup.step(shape):
        return capture_gate._LOCK.locked()


def test_each_shape_first_runs_hold_the_lock_then_run_free() -> None:
    warmup = capture_gate.Warmup(torch.device("cuda"))  # no GPU needed: only its type is read
    runs = capture_gate.WARM_RUNS
    assert [_held(warmup, (1, 64)) for _ in range(runs + 2)] == [True] * runs + [False] * 2
    assert _held(warmup, (2, 128)), "a new shape compiles and captures again"


def test_cpu_runs_never_take_the_lock() -> None:
    warmup = capture_gate.Warmup(torch.device("cpu"))
    assert not any(_held(warmup, "shape") for _ in range(capture_gate.WARM_RUNS))


def test_a_second_trainer_waits_for_the_first_ones_warm_up() -> None:
    first, second = (capture_gate.Warmup(torch.device("cuda")) for _ in range(2))
    order: list[str] = []
    inside = threading.Event()
    release = threading.Event()

    def warm_first() -> None:
        with first.step("dit"):
            inside.set()
            release.wait(timeout=10)
            order.append("first done")

    def warm_second() -> None:
        inside.wait(timeout=10)
        with second.step("lm"):
            order.append("second in")

    threads = [threading.Thread(target=warm_first), threading.Thread(target=warm_second)]
    for thread in threads:
        thread.start()
    inside.wait(timeout=10)
    # Ungated, the second thread would be in within microseconds; 0.2 s leaves it every chance.
    time.sleep(0.2)
    assert order == [], "the second trainer warmed up beside the first"
    release.set()
    for thread in threads:
        thread.join(timeout=10)
    assert order == ["first done", "second in"]
