"""The DiT's warm start (`init_adapter`): "latest" is the newest FINISHED run of the artist with
this adapter type (a killed run's best-so-far export never counts), none means a fresh start
said in one line, and an adapter that cannot fit is refused (exit 2), never silently dropped."""

from __future__ import annotations

import pytest
import torch
from test_dit_support import (  # noqa: F401  (fixtures)
    SLUG,
    fast_options,
    single_thread_fixture,
    tiny_dit_dir_fixture,
    write_cache,
)
from typer.testing import CliRunner

from hotstep_ray.cli.train_dit_cmd import app
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.events import EventLog, LogEvent, MetricEvent
from hotstep_ray.core.storage import Storage
from hotstep_ray.training import adapters, dit, dit_setup

BASE = "adapters/dit-turbo"


@pytest.fixture
def storage(tmp_path) -> Storage:
    store = Storage(tmp_path / "data")
    write_cache(store)
    return store


def _settings(tiny_dit_dir, artist: str) -> dit.DitSettings:
    return dit.DitSettings(checkpoints_dir=str(tiny_dit_dir), artist=artist, export_interval_s=0)


def _finished(storage: Storage, tiny_dit_dir, artist: str) -> dit.DitRun:
    run = dit.setup(
        fast_options(epochs=1, learning_rate=0.1), storage, SLUG, _settings(tiny_dit_dir, artist)
    )
    dit.train(run)
    return run


def _killed(storage: Storage, tiny_dit_dir, artist: str) -> str:
    """A newer run killed as its third epoch closes: its folder holds the best export so far."""

    def kill(event) -> None:
        if isinstance(event, MetricEvent) and event.metric == "epoch" and event.epoch == 3:
            raise KeyboardInterrupt

    options = fast_options(epochs=4, batch=1, grad_accum=1)
    run = dit.setup(options, storage, SLUG, _settings(tiny_dit_dir, artist), EventLog(kill))
    with pytest.raises(KeyboardInterrupt):
        dit.train(run)
    assert storage.exists(f"{run.run_key}/adapter_model.safetensors")
    return run.run_key


def _messages() -> tuple[list[str], EventLog]:
    seen: list[str] = []
    return seen, EventLog(lambda e: seen.append(e.message) if isinstance(e, LogEvent) else None)


def test_latest_skips_a_killed_runs_export_and_names_its_start(
    storage, tiny_dit_dir, single_thread
) -> None:
    first = _finished(storage, tiny_dit_dir, "warm")
    trained = adapters.adapter_state_dict(first.transformer)
    killed = _killed(storage, tiny_dit_dir, "warm")
    assert killed > first.run_key  # the newest folder, and it holds weights
    seen, events = _messages()
    options = fast_options(init_adapter="latest")
    second = dit.setup(options, storage, SLUG, _settings(tiny_dit_dir, "warm"), events)
    for key, value in adapters.adapter_state_dict(second.transformer).items():
        assert torch.equal(value, trained[key].bfloat16().float()), key  # the finished run's
    starts = [m for m in seen if "warm start" in m or "starting fresh" in m]
    assert len(starts) == 1 and starts[0].startswith(
        f"warm start from {storage.url_of(first.run_key)}: epoch 1, ma5 "
    )


def test_latest_of_another_type_starts_fresh_and_says_so(
    storage, tiny_dit_dir, single_thread
) -> None:
    lora = _finished(storage, tiny_dit_dir, "mixed").run_key
    seen, events = _messages()
    lokr = fast_options(init_adapter="latest", adapter_type="lokr", lokr_dim=8, lokr_factor=4)
    run = dit.setup(lokr, storage, SLUG, _settings(tiny_dit_dir, "mixed"), events)
    assert run.spec.kind == "lokr"
    assert f"no earlier finished lokr run of mixed under {BASE}/: starting fresh" in seen[0]
    assert not any("warm start" in m or "does not fit" in m for m in seen)
    # a run named explicitly must be of this type
    named = lokr.model_copy(update={"init_adapter": lora})
    with pytest.raises(InputError, match="is a lora adapter and this run trains lokr"):
        dit_setup.warm_start(named, storage, BASE, "mixed")


def test_the_cli_refuses_a_latest_of_other_shape_before_loading_and_names_a_fit(
    storage, tiny_dit_dir, single_thread
) -> None:
    first = _finished(storage, tiny_dit_dir, "shape")  # LoRA r4
    args = [SLUG, "--data", storage.url, "--checkpoints", str(tiny_dit_dir), "--no-ray"]
    args += ["--artist", "shape", "--adapter-type", "lora", "--alpha", "8", "--epochs", "1"]
    args += ["--crop-frames", "48", "--optimizer", "adamw", "--batch", "2", "--grad-accum", "2"]
    refused = CliRunner().invoke(app, [*args, "--rank", "8"])  # --init-adapter latest: default
    text = " ".join(refused.output.split())
    assert refused.exit_code == 2, refused.output
    assert f"cannot continue from {storage.url_of(first.run_key)} (rank 4 vs 8)" in text
    assert "--init-adapter '' to start from scratch" in text
    assert storage.list(f"{BASE}/shape") == [first.run_key] and not storage.exists("jobs")
    fits = CliRunner().invoke(app, [*args, "--rank", "4"])
    assert fits.exit_code == 0, fits.output
    assert f"warm start from {storage.url_of(first.run_key)}: epoch 1" in " ".join(
        fits.output.split()
    )
