"""`compile auto` runs a short DiT run eagerly: compiling costs more than it saves there."""

from __future__ import annotations

import pytest
from test_dit_support import (  # noqa: F401  (fixtures)
    SLUG,
    fast_options,
    single_thread_fixture,
    tiny_dit_dir_fixture,
    write_cache,
)

from hotstep_ray.core.events import EventLog
from hotstep_ray.core.storage import Storage
from hotstep_ray.training import dit, engine


def test_auto_keeps_a_long_run_compiled_and_an_explicit_mode_always() -> None:
    short, long = engine.COMPILE_MIN_STEPS - 1, engine.COMPILE_MIN_STEPS
    assert engine.eager_for_short_run("auto", "default", short)
    assert not engine.eager_for_short_run("auto", "default", long)
    assert not engine.eager_for_short_run("default", "default", short)  # the user asked for it
    assert not engine.eager_for_short_run("auto", "off", short)  # already eager (the CPU)


@pytest.mark.usefixtures("single_thread")
def test_a_short_auto_run_is_set_up_eagerly_and_says_so(tmp_path, tiny_dit_dir, monkeypatch):
    # The CPU never compiles; stand in for CUDA's answer ("default") to reach the decision.
    monkeypatch.setattr(dit, "compile_mode", lambda requested, device: "default")
    storage = Storage(tmp_path / "data")
    write_cache(storage)
    messages: list[str] = []
    events = EventLog(lambda event: messages.append(getattr(event, "message", "")))
    settings = dit.DitSettings(checkpoints_dir=str(tiny_dit_dir))
    run = dit.setup(fast_options(epochs=4, compile="auto"), storage, SLUG, settings, events)
    assert run.schedule.total_steps < engine.COMPILE_MIN_STEPS
    assert run.engine.mode == "off"
    assert any("training eagerly" in message for message in messages)
