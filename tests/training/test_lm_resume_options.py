"""`train-lm --resume`: the run continues with the options and trigger it was started with (a
resumed run equals an uninterrupted one), and every other value given now is named, one line
each, as ignored, rather than replaced without a word."""

from __future__ import annotations

from test_lm_init_adapter import tiny_fixture  # noqa: F401  (fixture)
from test_lm_train import CODES_KEY, make_spec, one_thread  # noqa: F401  (one_thread: autouse)
from typer.testing import CliRunner

from hotstep_ray.core.events import EventLog, LogEvent
from hotstep_ray.training import lm


def test_resume_keeps_the_checkpoints_options_and_names_each_one_ignored(tiny):
    folder, storage = tiny
    run = "adapters/lm-06b/band/resumed"
    first = lm.run_lm_training(make_spec(folder, run, epochs=3), storage, stop_after_epoch=1)
    assert not first.finished
    seen: list[str] = []
    events = EventLog(lambda e: seen.append(e.message) if isinstance(e, LogEvent) else None)
    # the checkpoint cadence is not the run's to keep: the one given now applies, unnamed
    again = make_spec(
        folder, run, epochs=10, learning_rate=0.5, loss_on_cot=True, checkpoint_every_s=0
    )
    again = again.model_copy(update={"trigger": "other"})
    result = lm.run_lm_training(again, storage, events=events, resume=True)
    assert result.finished and result.log["epochs_run"] == 3
    config = result.log["config"]
    assert (config["epochs"], config["learning_rate"], config["trigger"]) == (3, 0.01, "zq")
    assert config["checkpoint_every_s"] == 0
    assert [m for m in seen if "ignored" in m] == [
        "--epochs 10 ignored: the run continues with its own 3",
        "--lr 0.5 ignored: the run continues with its own 0.01",
        "--loss-on-cot ignored: the run continues with its own --no-loss-on-cot",
        "--trigger 'other' ignored: the run continues with its own 'zq'",
    ]
    assert not any("warm start" in m or "starting fresh" in m for m in seen)  # resumed instead


def test_the_cli_prints_what_a_resume_ignores(tiny):
    from hotstep_ray.cli.train_lm_cmd import app

    folder, storage = tiny
    run = "adapters/lm-06b/band/cli-resumed"
    spec = make_spec(folder, run, epochs=2).model_copy(update={"artist": "band"})
    assert not lm.run_lm_training(spec, storage, stop_after_epoch=1).finished
    args = ["run", "band", "--data", storage.url, "--checkpoints", str(folder.parent)]
    args += ["--size", "0.6B", "--codes", CODES_KEY, "--resume", run, "--epochs", "7"]
    args += ["--device", "cpu"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "--epochs 7 ignored: the run continues with its own 2" in text
    assert text.count("ignored:") == 1  # nothing the user did not type
