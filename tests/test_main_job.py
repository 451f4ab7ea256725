"""The main job (`make demo`) end to end on the embedded default, through the real CLI: songs →
dataset → labels → tensor cache → DiT and LM adapters → A/B over HTTP → loss plot, then a rerun."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import pytest
from safetensors import safe_open
from typer.testing import CliRunner

from hotstep_ray.audition.ab import PreviewStore
from hotstep_ray.cli.main import app
from hotstep_ray.core.events import MetricEvent
from hotstep_ray.core.jobs import load_job, read_job_events
from hotstep_ray.core.storage import Storage
from hotstep_ray.main_job import EXAMPLE_TRIGGER
from hotstep_ray.report_plot import HEIGHT, WIDTH

pytestmark = [pytest.mark.ray, pytest.mark.slow]
VARIANT = "acestep-v15-turbo"  # the tiny tree's DiT folder: the tensor-cache variant key


def _jobs(storage: Storage) -> list:
    return [load_job(storage, key.rsplit("/", 1)[-1]) for key in storage.list("jobs")]


def _runs(root: Path, base: str) -> list[Path]:
    return sorted(p for p in (root / "adapters" / base / "examples").iterdir() if p.is_dir())


def _png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from the IHDR chunk, after checking the signature and the chunk's CRC."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert (length, kind) == (13, b"IHDR")
    body = data[16:29]
    assert struct.unpack(">I", data[29:33])[0] == zlib.crc32(kind + body)
    width, height, depth, color = struct.unpack(">IIBB", body[:10])
    assert (depth, color) == (8, 2)  # 8-bit RGB
    assert data[-12:] == b"\x00\x00\x00\x00IEND\xaeB`\x82"
    return width, height


def _trigger(weights: Path) -> str | None:
    with safe_open(str(weights), "pt") as handle:
        return (handle.metadata() or {}).get("hot_step_trigger")


def _check_dataset(dataset_json: Path) -> dict:
    built = json.loads(dataset_json.read_text())
    assert built["metadata"]["num_samples"] == 12 and built["metadata"]["custom_tag"] == "hsdemo"
    by_file = {s["filename"]: s for s in built["samples"]}
    # CRLF + BOM + aliases (tempo/keyscale/time_signature) read as Side-Step reads them
    assert (by_file["02_night_walk.wav"]["bpm"], by_file["02_night_walk.wav"]["keyscale"]) == (
        90,
        "D minor",
    )
    # the caption/lyrics pair, and a lyrics-only sidecar (no caption ⇒ the whole text is lyrics)
    assert by_file["04_city_lights.ogg"]["caption"] == "Driving house beat with a minor chord stab"
    assert by_file["06_rain_song.flac"]["lyrics"].startswith("[Verse 1]\nRain on the glass")
    assert by_file["03_sunrise.flac"]["duration"] == 5
    # The song without a sidecar was labeled offline: Essentia hears its tempo and key (rendered
    # at 110 BPM in G major) and the offline captioner writes a caption.
    untitled = by_file["05_untitled.flac"]
    assert abs(untitled["bpm"] - 110) <= 2 and untitled["keyscale"] == "G major"
    assert untitled["caption"] and untitled["labeled"] is True
    # fill_missing never replaces what the user wrote
    assert by_file["01_morning_drive.flac"]["caption"].startswith("Bright synth-pop")
    return built


TRAINERS = ("train-dit", "train-lm")


def test_demo_runs_the_whole_product_and_reruns_idempotently(tmp_path, ray_session):
    runner = CliRunner()
    first = runner.invoke(app, ["demo", "--data", str(tmp_path)])
    assert first.exit_code == 0, first.output
    dataset_json = tmp_path / "datasets" / "examples" / "dataset.json"
    assert f"dataset.json: {dataset_json}" in first.output
    built = _check_dataset(dataset_json)

    # Every stage left its own job record; the main one ("build") holds the result.
    storage = Storage(tmp_path)
    jobs = _jobs(storage)
    assert sorted(job.kind for job in jobs) == [
        "build",
        "label",
        "preprocess",
        "train-dit",
        "train-lm",
    ]
    assert all(job.status == "done" for job in jobs)
    main = next(job for job in jobs if job.kind == "build")
    result = json.loads((tmp_path / "jobs" / main.id / "result.json").read_text())
    assert [s["name"] for s in result["stages"]] == [
        "dataset",
        "label",
        "build",
        "checkpoints",
        "preprocess",
        "train-dit",
        "train-lm",
        "audition",
        "report",
    ]
    # On Ray the two trainers ran side by side: each started before the other ended.
    dit_row, lm_row = (next(s for s in result["stages"] if s["name"] == n) for n in TRAINERS)
    assert lm_row["start_s"] < dit_row["start_s"] + dit_row["seconds"]
    assert dit_row["start_s"] < lm_row["start_s"] + lm_row["seconds"]

    # Preprocess: one safetensors per song, plus the variant's codes and stats.
    tensor_dir = tmp_path / "tensors" / "examples" / VARIANT
    tensors = sorted(tensor_dir.glob("*.safetensors"))
    assert len(tensors) == 12 and result["preprocess"]["processed"] == 12
    assert (tensor_dir / "lm_codes.jsonl").read_text().count("\n") == 12
    assert (tensor_dir / "channel_stats.json").is_file()
    mtimes = {path.name: path.stat().st_mtime_ns for path in tensors}

    # Both adapters: weights with the dataset's trigger, and a loss that fell epoch over epoch.
    (dit_run,) = _runs(tmp_path, "dit-turbo")
    (lm_run,) = _runs(tmp_path, "lm-06b")
    assert _trigger(dit_run / "lokr_weights.safetensors") == EXAMPLE_TRIGGER
    assert _trigger(lm_run / "adapter_model.safetensors") == EXAMPLE_TRIGGER
    assert (lm_run / "adapter_config.json").is_file()
    for run, log_name, epochs in (
        (dit_run, "dit_train_log.json", 8),
        (lm_run, "lm_train_log.json", 4),
    ):
        losses = [row["loss"] for row in json.loads((run / log_name).read_text())["epochs"]]
        assert len(losses) == epochs and losses[-1] < losses[0], (run, losses)
    assert result["dit"]["run_key"] == f"adapters/dit-turbo/examples/{dit_run.name}"
    assert result["lm"]["adapter_id"] == f"lm-06b/examples/{lm_run.name}"
    # an event per step (the plot's points): 12 songs in batches of 4 for 8 epochs; 13 rows
    # (one sidecar repeats its song twice) one per step for 4 epochs
    assert result["dit"]["steps"] == len(result["dit"]["step_losses"]) == 32
    assert result["lm"]["steps"] == len(result["lm"]["step_losses"]) == 52

    # The A/B over HTTP: the base side is exactly an adapterless run with the same seed; the
    # trained adapter changes the codes. Both sides were decoded and kept as a preview.
    ab = result["ab"]
    assert ab["base_sha1"] == ab["adapterless_sha1"] and ab["base_reproducible"]
    assert ab["adapter_sha1"] != ab["base_sha1"] and ab["adapter_differs"]
    assert ab["adapter_id"] == result["lm"]["adapter_id"] and ab["codes_count"] == 10
    preview = tmp_path / "previews" / ab["preview_id"]
    assert {p.name for p in preview.iterdir()} == {"base.wav", "adapter.wav", "preview.json"}
    listed = [
        p for p in PreviewStore(storage).list() if p.get("datasetId") == result["dataset"]["id"]
    ]
    assert [p["previewId"] for p in listed] == [ab["preview_id"]]  # the studio's list finds it

    # The loss plot: a valid PNG of the expected size.
    plot = tmp_path / "jobs" / main.id / "loss.png"
    assert _png_size(plot.read_bytes()) == (WIDTH, HEIGHT)

    # One event stream: the sub-jobs' events (the Ray Train workers' included) were folded in,
    # and only the main job's own terminal status is there, at the end.
    events = read_job_events(storage, main.id)
    assert [e.type for e in events].count("status") == 1
    assert events[-1].type == "status" and events[-1].status == "done"
    assert any(e.type == "progress" and e.phase == "probe" and e.done == 12 for e in events)
    epochs = [e for e in events if isinstance(e, MetricEvent) and e.metric == "epoch"]
    assert len(epochs) == 8 + 4
    # interleaved, each says whose it is: the DiT's 8 epochs and the LM's 4
    sources = [(e.model_extra or {}).get("source") for e in epochs]
    assert (sources.count("train-dit"), sources.count("train-lm")) == (8, 4)

    # A rerun reuses the dataset, the labels, every cached tensor and both finished adapter runs
    # (nothing they depend on changed; tests/test_make.py covers continuing an interrupted run).
    second = runner.invoke(
        app, ["demo", "--data", str(tmp_path), "--no-ray-train", "--skip-audition"]
    )
    assert second.exit_code == 0, second.output
    assert not (tmp_path / "datasets" / "examples-2").exists()
    rebuilt = json.loads(dataset_json.read_text())
    assert rebuilt["metadata"]["created_at"] == built["metadata"]["created_at"]
    assert rebuilt["samples"] == built["samples"]
    assert {p.name: p.stat().st_mtime_ns for p in tensor_dir.glob("*.safetensors")} == mtimes
    assert _runs(tmp_path, "dit-turbo") == [dit_run] and _runs(tmp_path, "lm-06b") == [lm_run]
    rerun = next(j for j in _jobs(storage) if j.kind == "build" and j.id != main.id)
    again = json.loads((tmp_path / "jobs" / rerun.id / "result.json").read_text())
    assert again["preprocess"]["processed"] == 0 and again["preprocess"]["cached"] == 12
    assert (again["dit"]["run_key"], again["lm"]["run_key"]) == (
        result["dit"]["run_key"],
        result["lm"]["run_key"],
    )
    trained = [s["summary"] for s in again["stages"] if s["name"].startswith("train-")]
    assert len(trained) == 2 and all("unchanged, reused" in summary for summary in trained)
    assert again["ab"] is None and again["plot_url"].endswith("loss.png")
