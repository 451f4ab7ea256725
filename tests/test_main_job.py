"""The main job (`make demo`) end to end on the embedded default, through the real CLI."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hotstep_ray.cli.main import app
from hotstep_ray.core.jobs import load_job, read_job_events
from hotstep_ray.core.storage import Storage

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_demo_builds_the_example_dataset_and_reruns_idempotently(tmp_path, ray_session):
    runner = CliRunner()
    first = runner.invoke(app, ["demo", "--data", str(tmp_path)])
    assert first.exit_code == 0, first.output
    dataset_json = tmp_path / "datasets" / "examples" / "dataset.json"
    assert f"dataset.json: {dataset_json}" in first.output

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

    storage = Storage(tmp_path)
    jobs = [load_job(storage, key.rsplit("/", 1)[-1]) for key in storage.list("jobs")]
    assert sorted(job.kind for job in jobs) == ["build", "label"]
    assert all(job.status == "done" for job in jobs)
    main = next(job for job in jobs if job.kind == "build")
    events = read_job_events(storage, main.id)
    # exactly one terminal status in the main stream: the label sub-job's own is not forwarded
    assert [e.type for e in events].count("status") == 1
    assert events[-1].type == "status" and events[-1].status == "done"
    assert any(e.type == "progress" and e.phase == "probe" and e.done == 12 for e in events)

    # A rerun reuses the dataset (no "-2" slug) and never restamps created_at.
    second = runner.invoke(app, ["demo", "--data", str(tmp_path)])
    assert second.exit_code == 0, second.output
    assert not (tmp_path / "datasets" / "examples-2").exists()
    rebuilt = json.loads(dataset_json.read_text())
    assert rebuilt["metadata"]["created_at"] == built["metadata"]["created_at"]
    assert rebuilt["samples"] == built["samples"]
