"""DiT trainer options of issue 12 on the tiny DiT: hold-out loss as `eval` events, `latest`
never resuming from a `-calibrated` folder, `--calibrate` from the CLI, and the Ray job's
calibration composed above the trainer (`calibration.after_train`)."""

from __future__ import annotations

import json

import pytest
import torch
from test_dit_support import (  # noqa: F401  (fixtures)
    SLUG,
    fast_options,
    read_log,
    single_thread_fixture,
    tiny_dit_dir_fixture,
    write_cache,
)
from typer.testing import CliRunner

from hotstep_ray.calibration import after_train, bake
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.events import EventLog, MetricEvent
from hotstep_ray.core.storage import Storage
from hotstep_ray.training import adapters, dit, lm_data, ray_dit

SIX = (40, 48, 56, 64, 72, 80)


def settings(tiny_dit_dir) -> dit.DitSettings:
    return dit.DitSettings(
        checkpoints_dir=str(tiny_dit_dir), export_interval_s=0.0, step_event_interval_s=0.0
    )


def test_holdout_loss_per_epoch_as_eval_events(tmp_path, tiny_dit_dir, single_thread) -> None:
    storage = Storage(tmp_path)
    write_cache(storage, frames=SIX, condition_lengths=(8,) * 6)
    events: list = []
    options = fast_options(epochs=2, holdout_fraction=0.34)
    run = dit.setup(options, storage, SLUG, settings(tiny_dit_dir), EventLog(events.append))
    assert len(run.cache.songs) == 4  # two songs never reach the training batches
    dit.train(run)
    evals = [e for e in events if isinstance(e, MetricEvent) and e.metric == "eval"]
    assert [e.epoch for e in evals] == [1, 2]
    assert all(e.model_extra["split"] == "holdout" and e.model_extra["songs"] == 2 for e in evals)
    log = read_log(storage, run.run_key)
    assert len(log["holdout"]["held_out"]) == 2 and len(log["holdout"]["train"]) == 4
    assert [r["loss"] for r in log["holdout"]["epochs"]] == [e.loss for e in evals]
    assert all(r["loss"] > 0 for r in log["holdout"]["epochs"])
    three = Storage(tmp_path / "three")
    write_cache(three)
    with pytest.raises(InputError, match="at least 6 songs"):
        dit.setup(fast_options(holdout_fraction=0.3), three, SLUG, settings(tiny_dit_dir))


def test_latest_never_resumes_from_a_calibrated_folder(
    tmp_path, tiny_dit_dir, single_thread
) -> None:
    storage = Storage(tmp_path)
    write_cache(storage)
    first = dit.setup(
        fast_options(epochs=1, learning_rate=0.1), storage, SLUG, settings(tiny_dit_dir)
    )
    dit.train(first)
    trained = adapters.adapter_state_dict(first.transformer)
    # a calibrated folder with weights sorts after the run: what the artist now resolves to
    bake.bake_adapter(storage, first.run_key, f"{first.run_key}-calibrated", 3.0)
    second = dit.setup(fast_options(init_adapter="latest"), storage, SLUG, settings(tiny_dit_dir))
    for key, value in adapters.adapter_state_dict(second.transformer).items():
        assert torch.equal(value, trained[key].bfloat16().float()), key  # the run, not x3


@pytest.fixture(scope="module")
def full_tree(tmp_path_factory):
    """A checkpoints folder the DiT audition can load: the tiny turbo DiT, VAE, text encoder."""
    from hotstep_ray.models import tiny_tree
    from hotstep_ray.models.tiny_dit import write_tiny_dit

    root = tmp_path_factory.mktemp("dit-calib-tree")
    write_tiny_dit(root / tiny_tree.DIT_DIR, variant="turbo", seed=0)
    tiny_tree.write_tiny_vae(root / tiny_tree.VAE_DIR, 1)
    tiny_tree.write_tiny_text_encoder(root / tiny_tree.TEXT_ENCODER_DIR, 2)
    return root


def test_cli_calibrates_the_trained_run(tmp_path, full_tree, single_thread) -> None:
    from hotstep_ray.cli.train_dit_cmd import app
    from hotstep_ray.models import tiny_tree

    storage = Storage(tmp_path / "data")
    cache = write_cache(storage)
    lm_data.write_lm_codes(
        storage.local_path(f"{cache}/lm_codes.jsonl"), lm_data.synthetic_songs(3, 4)
    )
    args = ["run", SLUG, "--data", storage.url, "--checkpoints", str(full_tree), "--no-ray"]
    args += ["--dit", str(full_tree / tiny_tree.DIT_DIR), "--variant", "turbo", "--json"]
    args += ["--adapter-type", "lora", "--rank", "4", "--alpha", "8", "--epochs", "2"]
    args += ["--crop-frames", "48", "--init-adapter", "", "--optimizer", "adamw"]
    args += ["--milestone-step", "0", "--artist", "cal", "--calibrate", "--no-calibrate-repoint"]
    args += ["--calibrate-scales", "0.5,1", "--calibrate-seeds", "1", "--calibrate-duration", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output[result.output.index("{") :])
    run_key = storage.key_of(summary["run"])
    calibrated = f"{run_key}-calibrated"
    assert summary["calibration"]["folder"] == calibrated
    report = storage.read_json(f"{calibrated}/{bake.EVAL_FILE}")
    assert report["kind"] == "dit" and report["repoint"] is False
    assert [row["scale"] for row in report["grid"]] == [0.5, 1.0]
    assert report["dataset"]["tensors"] == cache and report["dataset"]["frames"] == 194
    assert report["winner"] is not None and storage.exists(f"{calibrated}/baked")
    assert not storage.exists(f"{calibrated}/adapter_model.safetensors")  # no repoint
    refused = CliRunner().invoke(app, [*args, "--stages", "train"])
    assert refused.exit_code == 2 and "export stage" in refused.output
    # a run paused at max_steps is not calibrated (its milestones are not all there yet)
    paused = CliRunner().invoke(app, [*args, "--artist", "cal-paused", "--max-steps", "1"])
    assert paused.exit_code == 0, paused.output
    summary = json.loads(paused.output[paused.output.index("{") :])
    assert summary["stop_reason"] == "max_steps" and summary["calibration"] is None
    assert not storage.exists(f"{storage.key_of(summary['run'])}-calibrated")


def test_the_ray_job_is_trained_then_calibrated_above_the_trainer(tmp_path, monkeypatch) -> None:
    storage = Storage(tmp_path)
    with pytest.raises(InputError, match="after_train.train_dit_on_ray_then_calibrate"):
        ray_dit.train_dit_on_ray(fast_options(calibrate=True), storage, SLUG)
    trained, calibrated = [], []

    def train(options, storage, dataset, settings, **kwargs):
        # only what the caller gave is passed on: the trainer's own defaults stand
        trained.append((options.calibrate, kwargs.get("num_workers"), kwargs.get("job_id")))
        stop = "max_steps" if kwargs.get("max_steps") else "max_epochs"
        return ray_dit.RayDitResult(
            run_key="adapters/dit-turbo/band/run", run_name="train-dit-run", vram_gb=1.0,
            metrics={}, checkpoint_path=None, log={"stop_reason": stop}, dit_folder="/ckpt/dit",
        )  # fmt: skip

    def calibrate(options, storage, run_key, folder, events, calibration, actors):
        calibrated.append((run_key, folder, calibration, actors, events is not None))
        return {"folder": f"{run_key}-calibrated"}

    monkeypatch.setattr(ray_dit, "train_dit_on_ray", train)
    monkeypatch.setattr(after_train, "calibrate_dit_run", calibrate)
    options = fast_options(calibrate=True)
    done = after_train.train_dit_on_ray_then_calibrate(
        options, storage, SLUG, num_workers=2, job_id="j1", calibration={"seeds": 1}
    )
    assert trained == [(False, 2, "j1")]  # the trainer only trains
    assert calibrated == [("adapters/dit-turbo/band/run", "/ckpt/dit", {"seeds": 1}, 2, True)]
    assert done.calibration == {"folder": "adapters/dit-turbo/band/run-calibrated"}
    paused = after_train.train_dit_on_ray_then_calibrate(options, storage, SLUG, max_steps=1)
    assert paused.calibration is None and len(calibrated) == 1  # its milestones are not all there
    plain = after_train.train_dit_on_ray_then_calibrate(fast_options(), storage, SLUG)
    assert plain.calibration is None and len(calibrated) == 1
    with pytest.raises(ValueError, match="seeds"):  # bad overrides fail before any training
        after_train.train_dit_on_ray_then_calibrate(
            options, storage, SLUG, calibration={"seeds": 0}
        )
    assert len(trained) == 3
    with pytest.raises(InputError, match="export stage"):
        after_train.train_dit_on_ray_then_calibrate(
            fast_options(calibrate=True, stages=["train"]), storage, SLUG
        )
