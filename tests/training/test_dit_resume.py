"""Interrupted DiT runs: how often checkpoints are written, what a rerun says about a killed run,
`--resume RUN` / `--resume latest`, the `adapters list` status, and Ray-only options refused
without Ray. In this process on the tiny DiT (the `--ray` path: test_dit_ray.py)."""

from __future__ import annotations

import json

import pytest
from test_dit_support import (  # noqa: F401  (fixtures)
    SLUG,
    fast_options,
    read_log,
    single_thread_fixture,
    tiny_dit_dir_fixture,
    write_cache,
)
from typer.testing import CliRunner

from hotstep_ray.cli.adapters_cmd import app as adapters_app
from hotstep_ray.cli.train_dit_cmd import app, build_options
from hotstep_ray.core.events import EventLog, MetricEvent
from hotstep_ray.core.storage import Storage
from hotstep_ray.training import dit, dit_setup

ARTIST = "resume"
# 3 songs, batch 1, GA 1: 3 steps an epoch (the first epoch's steps move the adapter: an export)
OPTIONS = {"epochs": 4, "batch": 1, "grad_accum": 1}


@pytest.fixture
def storage(tmp_path) -> Storage:
    store = Storage(tmp_path / "data")
    write_cache(store)
    return store


def _killed_at_epoch(storage: Storage, tiny_dit_dir, kill_epoch: int) -> str:
    """A run stopped as a kill would stop it, when epoch `kill_epoch` closes (before its export,
    checkpoint and log); the checkpoint interval is the contract's default. Its run key."""

    def kill(event) -> None:
        if isinstance(event, MetricEvent) and event.metric == "epoch" and event.epoch == kill_epoch:
            raise KeyboardInterrupt  # not an Exception: the event log passes it on

    settings = dit.DitSettings(
        checkpoints_dir=str(tiny_dit_dir), artist=ARTIST, export_interval_s=0
    )
    run = dit.setup(fast_options(**OPTIONS), storage, SLUG, settings, EventLog(kill))
    with pytest.raises(KeyboardInterrupt):
        dit.train(run)
    return run.run_key


def _cli_args(storage: Storage, tiny_dit_dir) -> list[str]:
    args = [SLUG, "--data", storage.url, "--checkpoints", str(tiny_dit_dir), "--no-ray"]
    args += ["--artist", ARTIST, "--adapter-type", "lora", "--rank", "4", "--alpha", "8"]
    args += ["--crop-frames", "48", "--crop-min-frames", "128", "--epochs", "4"]
    args += ["--batch", "1", "--grad-accum", "1", "--init-adapter", "", "--optimizer", "adamw"]
    return args + ["--learning-rate", "3e-3", "--target-loss", "0", "--milestone-step", "0"]


def _json(output: str) -> dict:
    return json.loads(output[output.index("{\n") :])


def test_checkpoints_follow_the_options_interval_and_epoch_count(
    storage, tiny_dit_dir, single_thread
) -> None:
    """After epoch 1, then every `checkpoint_every_epochs` (the time rule's default 300 s does
    not come due in a tiny run), and at the end; the CLI flag reaches the contract."""
    options = fast_options(epochs=5, checkpoint_every_epochs=2)  # 1 step an epoch
    run = dit.setup(options, storage, SLUG, dit.DitSettings(checkpoints_dir=str(tiny_dit_dir)))
    saved: list[int] = []
    run.checkpoint_hook = lambda run: saved.append(run.state.epoch - 1)  # the epoch just done
    dit.train(run)
    assert saved == [1, 2, 4, 5]
    # the time rule: the user's seconds, unless the caller fixes its own (the main job's recipe)
    assert dit_setup.checkpoint_interval_s(options, dit.DitSettings()) == 300
    fixed = dit.DitSettings(checkpoint_interval_s=0)
    assert dit_setup.checkpoint_interval_s(options, fixed) == 0
    assert build_options("turbo", {"checkpoint_every_s": "30"}).checkpoint_every_s == 30


def test_an_interrupted_run_is_named_listed_and_continued(
    storage, tiny_dit_dir, single_thread
) -> None:
    # killed as epoch 3 closes: its checkpoint holds epoch 1 (300 s had not passed), its log 2
    killed = _killed_at_epoch(storage, tiny_dit_dir, kill_epoch=3)
    listed = CliRunner().invoke(adapters_app, ["list", "--data", storage.url, "--json"])
    assert listed.exit_code == 0, listed.output
    (entry,) = [e for e in json.loads(listed.output) if e["id"] == killed.removeprefix("adapters/")]
    assert (entry["status"], entry["statusDetail"]) == ("interrupted", "interrupted at epoch 2")

    # a plain rerun names it and how to continue, and does not continue it by itself (this one
    # is refused before it trains: nothing to export)
    args = _cli_args(storage, tiny_dit_dir)
    rerun = CliRunner().invoke(app, [*args, "--stages", "export"])
    assert rerun.exit_code == 2 and "nothing was loaded" in rerun.output
    hint = " ".join(rerun.output.split())  # rich wraps long lines in the test terminal
    assert (
        f"an interrupted run {killed} stopped at epoch 1 (its log reached epoch 2): continue it "
        f"with --resume {killed} (or --resume latest); training a new run"
    ) in hint

    resumed = CliRunner().invoke(app, [*args, "--resume", "latest", "--json"])
    assert resumed.exit_code == 0, resumed.output
    summary = _json(resumed.output)
    assert summary["run_key"] == killed and summary["stop_reason"] == "epochs"
    log = read_log(storage, killed)
    assert log["resumes"] == [{"step": 3, "epoch": 2}] and log["steps"] == 12
    assert log["job"] == summary["job"]  # the job that trained it: `adapters list` asks it
    listed = CliRunner().invoke(adapters_app, ["list", "--data", storage.url, "--json"])
    assert [e["status"] for e in json.loads(listed.output)] == ["finished"]

    # nothing left to continue; a folder that holds no run
    again = CliRunner().invoke(app, [*args, "--resume", killed])
    assert again.exit_code == 2 and "nothing to continue" in " ".join(again.output.split())
    missing = CliRunner().invoke(app, [*args, "--resume", f"{killed}-nope"])
    assert missing.exit_code == 2 and "holds no DiT run" in " ".join(missing.output.split())


def test_ray_only_options_are_refused_without_ray(tmp_path) -> None:
    """--workers / --max-failures / --ray-address did nothing in this process, without a word."""
    base = [SLUG, "--data", str(tmp_path / "data"), "--no-ray"]
    for extra, flag in (
        (["--workers", "2"], "--workers"),
        (["--max-failures", "0"], "--max-failures"),
        (["--ray-address", "auto"], "--ray-address"),
    ):
        result = CliRunner().invoke(app, [*base, *extra])
        assert result.exit_code == 2, result.output
        assert f"{flag} only apply with --ray" in " ".join(result.output.split())
