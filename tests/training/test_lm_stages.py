"""LM trainer stages (extract / train / export alone and together), hold-out loss, and the
`calibrate` option composed above the trainer (`calibration.after_train`: plain, Ray and CLI), on
the tiny LM (CPU, one thread)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from safetensors.torch import save as save_safetensors_bytes
from typer.testing import CliRunner

from hotstep_ray.calibration import after_train, bake
from hotstep_ray.core.contracts import TrainLmOptions
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.events import EventLog, MetricEvent
from hotstep_ray.core.storage import Storage
from hotstep_ray.models.tiny_tree import write_tiny_lm
from hotstep_ray.training import lm, lm_save, lm_setup, lm_spec
from hotstep_ray.training import lm_data as D

CACHE = "tensors/band/v1"
CODES_KEY = f"{CACHE}/lm_codes.jsonl"
SIX = "tensors/six/v1/lm_codes.jsonl"


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def write_sample(storage: Storage, stem: str, codes: list[int], caption: str) -> None:
    """A tensor-cache file as preprocessing writes it: `audio_codes` + the prompt fields (all
    metas given: a calibration prompt missing one makes the planner write a CoT first, which the
    random tiny LM never ends)."""
    meta = {
        "caption": caption, "lyrics": "[Instrumental]", "bpm": 100, "language": "en",
        "keyscale": "C major", "timesignature": "4",
    }  # fmt: skip
    data = save_safetensors_bytes(
        {"audio_codes": torch.tensor(codes, dtype=torch.int64)}, metadata={"json": json.dumps(meta)}
    )
    storage.write_bytes(f"{CACHE}/{stem}.safetensors", data)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Storage]:
    """The tiny LM and a storage root with a 2-song tensor cache (no lm_codes.jsonl yet) and
    a 6-song codes file."""
    root = tmp_path_factory.mktemp("lm-stages")
    folder = write_tiny_lm(root / "ckpt" / "acestep-5Hz-lm-0.6B")
    storage = Storage(root / "data")
    samples = []
    for i in range(2):
        write_sample(storage, f"s{i}", [i * 7 + k for k in range(6)], f"song {i}")
        samples.append({"sample_id": f"s{i}", "file": f"s{i}.safetensors", "ok": True})
    samples.append({"sample_id": "bad", "file": "bad.safetensors", "ok": False})
    storage.write_json(
        f"{CACHE}/preprocess_meta.json", {"model_fingerprint": "fp-1", "samples": samples}
    )
    D.write_lm_codes(storage.local_path(SIX), D.synthetic_songs(6, 5, seed=3))
    return folder, storage


def make_spec(
    folder: Path, run_key: str = "", codes: str = CODES_KEY, **options
) -> lm_spec.LmTrainSpec:
    given = {
        "lm_size": "0.6B",
        "adapter_type": "lora",
        "rank": 4,
        "alpha": 8,
        "optimizer": "adamw",
        "learning_rate": 1e-2,
        "grad_accum": 1,
        "epochs": 2,
        "loss_on_cot": False,
        "init_adapter": "",
        "target_loss": 0,
        "milestone_step": 0,
        **options,
    }
    return lm_spec.LmTrainSpec(
        options=TrainLmOptions(**given),
        lm_dir=str(folder),
        codes_key=codes,
        artist="band",
        trigger="zq",
        run_key=run_key,
    )


def test_extract_alone_writes_then_reuses_unchanged_rows(tiny):
    folder, storage = tiny
    first = lm.run_lm_training(make_spec(folder, stages=["extract"]), storage)
    assert first.run_key == "" and first.files == [CODES_KEY]
    assert first.log["extract"]["written"] == 2 and first.log["extract"]["reused"] == 0
    rows = [json.loads(x) for x in storage.read_text(CODES_KEY).splitlines()]
    assert [r["sample_id"] for r in rows] == ["s0", "s1"]  # meta order; failed sample left out
    assert rows[1]["codes"] == [7, 8, 9, 10, 11, 12] and rows[1]["caption"] == "song 1"
    assert rows[0]["_tok"] == "fp-1" and rows[0]["_st_bytes"] > 0
    songs, bad = D.load_lm_codes(storage, CODES_KEY)
    assert len(songs) == 2 and not bad

    again = lm.run_lm_training(make_spec(folder, stages=["extract"]), storage)
    assert (again.log["extract"]["reused"], again.log["extract"]["written"]) == (2, 0)
    assert not again.log["extract"]["changed"]
    write_sample(storage, "s1", [5, 5, 5, 5, 5, 5, 5], "song 1 remastered")
    changed = D.extract_codes(storage, CACHE)
    assert (changed.reused, changed.written, changed.changed) == (1, 1, True)
    assert json.loads(storage.read_text(CODES_KEY).splitlines()[1])["codes"] == [5] * 7
    assert D.extract_codes(storage, CACHE, overwrite=True).written == 2


def test_extract_without_a_cache_uses_the_codes_file_or_says_what_is_missing(tiny, tmp_path):
    _, storage = tiny
    assert D.extract_codes(storage, "tensors/six/v1").source == "codes"
    with pytest.raises(InputError, match="run preprocess"):
        D.extract_codes(Storage(tmp_path), "tensors/none/v1")


def test_train_alone_then_export_alone_equals_train_and_export(tiny):
    folder, storage = tiny
    whole = lm.run_lm_training(make_spec(folder, "adapters/lm-06b/band/whole"), storage)
    split_key = "adapters/lm-06b/band/split"
    trained = lm.run_lm_training(make_spec(folder, split_key, stages=["train"]), storage)
    assert trained.finished and [k.rsplit("/", 1)[1] for k in trained.files] == [lm_save.LOG_FILE]
    assert storage.exists(f"{lm_save.checkpoint_key(split_key)}/checkpoint.json")  # kept for export
    assert not storage.exists(f"{split_key}/adapter_model.safetensors")
    # export alone: the options come from the checkpoint (these contradict it and are ignored)
    exported = lm.run_lm_training(make_spec(folder, split_key, stages=["export"], rank=8), storage)
    assert not storage.exists(lm_save.checkpoint_key(split_key))
    a = load_file(storage.local_path(f"{whole.run_key}/adapter_model.safetensors"))
    b = load_file(storage.local_path(f"{split_key}/adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [r["loss"] for r in exported.log["epochs"]] == [r["loss"] for r in whole.log["epochs"]]
    with pytest.raises(InputError, match="no training checkpoint"):
        lm.run_lm_training(make_spec(folder, split_key, stages=["export"]), storage)
    with pytest.raises(InputError, match="needs the run folder"):
        lm.run_lm_training(make_spec(folder, stages=["export"]), storage)


def test_calibrate_without_export_is_refused_before_training(tiny):
    folder, storage = tiny
    spec = make_spec(folder, "adapters/lm-06b/band/no-export", stages=["train"], calibrate=True)
    with pytest.raises(InputError, match="calibrate needs the export stage"):
        after_train.run_lm_then_calibrate(spec, storage)
    assert not storage.exists(spec.run_key)


def test_the_trainers_refuse_calibrate_and_name_the_composed_function(tiny):
    from hotstep_ray.training.ray_lm import run_lm_on_ray

    folder, storage = tiny
    spec = make_spec(folder, "adapters/lm-06b/band/refused", calibrate=True)
    with pytest.raises(InputError, match="after_train.run_lm_then_calibrate"):
        lm.run_lm_training(spec, storage)
    with pytest.raises(InputError, match="after_train.run_lm_on_ray_then_calibrate"):
        run_lm_on_ray(spec, storage)  # refused before Ray starts
    assert not storage.exists(spec.run_key)


def test_holdout_reports_eval_events_per_epoch_and_refuses_small_datasets(tiny):
    folder, storage = tiny
    events: list = []
    spec = make_spec(folder, "adapters/lm-06b/band/held", codes=SIX, holdout_fraction=0.34)
    result = lm.run_lm_training(spec, storage, events=EventLog(events.append))
    evals = [e for e in events if isinstance(e, MetricEvent) and e.metric == "eval"]
    assert [e.epoch for e in evals] == [1, 2]
    assert all(e.model_extra["split"] == "holdout" and e.model_extra["songs"] == 2 for e in evals)
    holdout = result.log["holdout"]
    assert len(holdout["held_out"]) == 2 and len(holdout["train"]) == 4
    assert result.log["config"]["samples"] == 4  # held-out songs are not trained on
    assert [r["loss"] for r in holdout["epochs"]] == [e.loss for e in evals]
    assert all(r["loss"] > 0 for r in holdout["epochs"])
    with pytest.raises(InputError, match="at least 6 songs"):
        lm.run_lm_training(make_spec(folder, holdout_fraction=0.3), storage)  # 2 songs


def test_cli_calibrates_after_training_and_latest_skips_the_calibrated_folder(tiny):
    from hotstep_ray.cli.train_lm_cmd import app

    folder, storage = tiny
    args = [
        "run", "band", "--data", storage.url, "--checkpoints", str(folder.parent),
        "--size", "0.6B", "--codes", CODES_KEY, "--epochs", "2", "--adapter-type", "lora",
        "--rank", "4", "--no-loss-on-cot", "--init-adapter", "", "--artist", "calib",
        "--stages", "extract,train,export", "--calibrate", "--calibrate-scales", "0.5,1.0",
        "--calibrate-seeds", "2", "--calibrate-duration", "2", "--json",
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    out = json.loads(result.output[result.output.index("{") :])
    run_key = storage.list("adapters/lm-06b/calib")[0]
    calibrated = f"{run_key}-calibrated"
    assert out["calibration"]["folder"] == calibrated
    report = storage.read_json(f"{calibrated}/{bake.EVAL_FILE}")
    assert report["kind"] == "lm" and report["run"] == run_key and report["repoint"] is True
    assert [row["scale"] for row in report["grid"]] == [0.5, 1.0]  # the run's own adapter
    assert len(report["seeds"]) == 2 and report["config"]["duration_s"] == 2
    if report["winner"] is not None:  # baked with the run's trigger
        assert storage.exists(f"{calibrated}/adapter_model.safetensors")
    else:  # no winner: only the report
        bake.bake_adapter(storage, run_key, calibrated, 3.0)  # make it a weights folder anyway
    # `latest` (the default) continues the run, never the newer `-calibrated` folder
    spec = make_spec(folder, init_adapter="latest")
    spec = spec.model_copy(update={"artist": "calib"})
    setup = lm_setup.setup_lm(spec, storage)
    assert setup.init_from["url"].endswith(run_key)


def test_muon_precision_option_reaches_the_optimizer(tiny, monkeypatch):
    folder, storage = tiny
    seen = {}
    real = lm_setup.build_optimizer

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(lm_setup, "build_optimizer", spy)
    spec = make_spec(folder, codes=SIX, optimizer="muon", muon_ns_precision="tf32")
    lm_setup.setup_lm(spec, storage)
    assert seen["kind"] == "muon" and seen["muon_ns_precision"] == "tf32"
    seen.clear()  # and from the command line
    from hotstep_ray.cli.train_lm_cmd import app

    args = [
        "run", "band", "--data", storage.url, "--checkpoints", str(folder.parent),
        "--size", "0.6B", "--codes", SIX, "--epochs", "1", "--adapter-type", "lora",
        "--rank", "4", "--no-loss-on-cot", "--init-adapter", "", "--artist", "ns",
        "--stages", "train", "--optimizer", "muon", "--muon-ns-precision", "bfloat16",
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert seen["kind"] == "muon" and seen["muon_ns_precision"] == "bfloat16"


@pytest.mark.slow
@pytest.mark.ray
def test_ray_job_holds_out_and_calibrates(ray_session, tiny):
    folder, storage = tiny
    spec = make_spec(folder, codes=SIX, holdout_fraction=0.34, calibrate=True)
    spec = spec.model_copy(
        update={"artist": "ray-calib", "events_key": "jobs/ray-calib/events.jsonl"}
    )
    result = after_train.run_lm_on_ray_then_calibrate(
        spec,
        storage,
        num_workers=1,
        use_gpu=False,
        max_failures=0,
        calibration={"scales": [1.0], "seeds": 2, "duration_s": 2},
    )
    assert result.finished and len(result.log["holdout"]["epochs"]) == 2
    calibrated = f"{result.run_key}-calibrated"
    assert result.calibration["folder"] == calibrated
    assert storage.read_json(f"{calibrated}/{bake.EVAL_FILE}")["kind"] == "lm"
    lines = storage.read_text("jobs/ray-calib/events.jsonl").splitlines()
    kinds = [(e.get("metric"), e.get("split")) for e in map(json.loads, lines)]
    assert kinds.count(("eval", "holdout")) == 2  # written by the Ray Train worker
    assert any(metric == "eval" and split is None for metric, split in kinds)  # calibration rows
