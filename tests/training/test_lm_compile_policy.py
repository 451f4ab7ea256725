"""`compile auto` trains a short LM run eagerly: its compiles would cost more than they save."""

from __future__ import annotations

from test_lm_train import make_spec, one_thread, tiny  # noqa: F401  (fixtures)

from hotstep_ray.core.events import EventLog
from hotstep_ray.training import lm_data as data
from hotstep_ray.training import lm_setup


def test_compiling_pays_only_for_enough_tokens_per_shape() -> None:
    # one song of 1000 tokens in one micro-batch: one shape (its padded width, 1024)
    examples = [data.LmExample("a", tuple(range(1000)), 1, 1000, 999)]
    groups = [((0,),)]
    cost = data.COMPILE_COST_TOKENS
    # (slowdown - 1) x epochs x 1024 tokens against one compile: the break-even epoch count
    even = cost / ((data.EAGER_SLOWDOWN - 1) * 1024)
    assert not data.compile_pays(examples, groups, int(even), 64)
    assert data.compile_pays(examples, groups, int(even) + 1, 64)


def test_a_short_auto_run_is_set_up_eagerly_and_says_so(tiny, monkeypatch) -> None:  # noqa: F811
    folder, storage = tiny
    # The CPU never compiles; stand in for CUDA's answer ("default") to reach the decision.
    monkeypatch.setattr(lm_setup, "compile_mode", lambda requested, device: "default")
    messages: list[str] = []
    events = EventLog(lambda event: messages.append(getattr(event, "message", "")))
    spec = make_spec(folder, "adapters/lm-06b/band/eager", epochs=2, engine={"compile": "auto"})
    setup = lm_setup.setup_lm(spec, storage, events=events)
    assert setup.compile == "off" and setup.pad_multiple == 1
    assert any("training eagerly" in message for message in messages)
