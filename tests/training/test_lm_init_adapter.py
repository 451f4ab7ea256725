"""The LM's warm start (`init_adapter`), by the DiT trainer's rule: "latest" is the newest
FINISHED run of the artist on this LM size with the adapter type asked for (any type when none
is: its identity is adopted); none means a fresh start said in one line; an adapter that cannot
fit is refused before the weights load."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_lm_train import CODES_KEY, make_spec, one_thread  # noqa: F401  (one_thread: autouse)

from hotstep_ray.core.errors import InputError
from hotstep_ray.core.events import EventLog, LogEvent
from hotstep_ray.core.storage import Storage
from hotstep_ray.models.tiny_tree import write_tiny_lm
from hotstep_ray.training import lm, lm_setup, lm_spec
from hotstep_ray.training import lm_data as D

LOKR = {"adapter_type": "lokr", "lokr_dim": 4, "lokr_alpha": 4, "lokr_factor": 4}


@pytest.fixture(scope="module", name="tiny")
def tiny_fixture(tmp_path_factory) -> tuple[Path, Storage]:
    """test_lm_train's `tiny` (the tiny LM, two songs' codes) for this module's own storage;
    registered under `name=` so the other test_lm_* files import it without shadowing."""
    root = tmp_path_factory.mktemp("lm")
    folder = write_tiny_lm(root / "ckpt" / "acestep-5Hz-lm-0.6B", embedding_scale=25)
    storage = Storage(root / "data")
    D.write_lm_codes(storage.local_path(CODES_KEY), D.synthetic_songs(2, 6, seed=5))
    return folder, storage


def _spec(folder, artist: str, **options) -> lm_spec.LmTrainSpec:
    return make_spec(folder, **options).model_copy(update={"artist": artist})


def _starts(seen: list[str]) -> list[str]:
    return [m for m in seen if "warm start" in m or "starting fresh" in m]


def _events() -> tuple[list[str], EventLog]:
    seen: list[str] = []
    return seen, EventLog(lambda e: seen.append(e.message) if isinstance(e, LogEvent) else None)


def test_latest_is_the_newest_finished_run_of_the_type_asked_for(tiny):
    folder, storage = tiny
    lora = lm.run_lm_training(_spec(folder, "kinds", epochs=2), storage)
    lokr = lm.run_lm_training(_spec(folder, "kinds", epochs=2, **LOKR), storage)
    assert lokr.run_key > lora.run_key  # the newer run is another type
    seen, events = _events()
    asked = _spec(folder, "kinds", init_adapter="latest")  # lora r8 given
    setup = lm_setup.setup_lm(asked, storage, events=events)
    url = storage.url_of(lora.run_key)
    assert setup.init_from["url"] == url and setup.identity.kind == "lora"
    (line,) = _starts(seen)
    assert line.startswith(f"warm start from {url}: epoch {lora.log['saved_epoch']}, loss ")
    # no type given: the newest run of any type, its identity adopted
    untyped = _spec(folder, "kinds", init_adapter="latest", adapter_type=None, rank=None)
    adopted = lm_setup.setup_lm(untyped.model_copy(update={"options": untyped.options}), storage)
    assert adopted.init_from["url"] == storage.url_of(lokr.run_key)
    assert adopted.identity.kind == "lokr" and adopted.identity.rank == 4


def test_no_finished_run_of_the_type_starts_fresh_and_says_so(tiny):
    folder, storage = tiny
    lm.run_lm_training(_spec(folder, "fresh", epochs=1), storage)  # a LoRA run
    seen, events = _events()
    setup = lm_setup.setup_lm(
        _spec(folder, "fresh", init_adapter="latest", **LOKR), storage, events=events
    )
    assert not setup.init_from and setup.identity.kind == "lokr"
    assert _starts(seen) == [
        "no earlier finished lokr run of fresh under adapters/lm-06b/: starting fresh "
        "(init adapter latest)"
    ]
    seen.clear()
    lm_setup.setup_lm(_spec(folder, "fresh"), storage, events=events)  # init_adapter ""
    assert _starts(seen) == ["no warm start (init adapter ''): starting fresh"]


def test_a_start_that_cannot_fit_is_refused_before_the_weights_load(tiny, monkeypatch):
    folder, storage = tiny
    source = lm.run_lm_training(_spec(folder, "fit", epochs=1), storage).run_key  # lora r8

    def no_load(*args, **kwargs):
        raise AssertionError("the LM weights were loaded before the refusal")

    monkeypatch.setattr("hotstep_ray.models.text_models.load_lm", no_load)
    for init in (source, "latest"):
        with pytest.raises(InputError, match="rank 8 vs 16"):
            lm_setup.setup_lm(_spec(folder, "fit", init_adapter=init, rank=16), storage)
