"""`hotstep-ray make SONGS_DIR`: the one command on the user's own folder of songs. Bad input exits
2 with one line saying what to do; a folder with and without Side-Step sidecars becomes a dataset
named after the folder, tagged with `--tag`, labeled only where the sidecars are silent, and
encoded into the tensor cache; a rerun reuses all of it. (The training and A/B half of the flow is
the same code as `demo`, which tests/test_main_job.py runs end to end.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hotstep_ray.audio.io import encode_audio
from hotstep_ray.audio.synth import SongSpec, render_song
from hotstep_ray.cli.main import app
from hotstep_ray.main_job import Placement, placement

RATE_HZ = 48_000


def _write_song(folder: Path, name: str, spec: SongSpec, sidecar: str | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(encode_audio(render_song(spec, RATE_HZ), RATE_HZ, "WAV"))
    if sidecar is not None:
        (folder / name).with_suffix(".txt").write_text(sidecar)


def _error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, output
    return lines[0]


@pytest.mark.parametrize(
    ("make_input", "expected"),
    [
        (lambda root: root / "nowhere", "songs folder not found"),
        (lambda root: (root / "empty").mkdir() or root / "empty", "no audio files"),
        (lambda root: (root / "a.txt").write_text("x") and root / "a.txt", "is a file"),
    ],
    ids=["missing", "empty", "a-file"],
)
def test_bad_songs_folders_exit_2_with_one_line(tmp_path, make_input, expected):
    songs = make_input(tmp_path)
    result = CliRunner().invoke(app, ["make", str(songs), "--data", str(tmp_path / "data")])
    assert result.exit_code == 2, result.output
    assert expected in _error_line(result.output)


def test_a_storage_root_inside_the_songs_folder_is_refused(tmp_path):
    _write_song(tmp_path / "songs", "a.wav", SongSpec("a", 100, "C", "major", 1.0, seed=1))
    data = tmp_path / "songs" / "data"
    result = CliRunner().invoke(app, ["make", str(tmp_path / "songs"), "--data", str(data)])
    assert result.exit_code == 2, result.output
    assert "inside the songs folder" in _error_line(result.output)


@pytest.mark.ray
def test_unreadable_files_only_exit_2(tmp_path, ray_session):
    songs = tmp_path / "songs"
    songs.mkdir()
    (songs / "broken.wav").write_bytes(b"RIFF not really a wave file")
    result = CliRunner().invoke(app, ["make", str(songs), "--data", str(tmp_path / "data")])
    assert result.exit_code == 2, result.output
    assert "none of the 1 audio files" in _error_line(result.output)


@pytest.mark.ray
@pytest.mark.slow
def test_make_turns_a_folder_into_adapters_and_reruns_only_what_changed(
    tmp_path, ray_session, monkeypatch
):
    songs = tmp_path / "My Band"
    # One song with a Side-Step sidecar (its caption and BPM must survive labeling), one without.
    _write_song(
        songs,
        "first.wav",
        SongSpec("first", 96, "A", "minor", 3.0, seed=3),
        "caption: Dusty lo-fi keys over a lazy beat\nbpm: 96\nkey: A minor\n",
    )
    _write_song(songs / "more", "second.wav", SongSpec("second", 120, "E", "major", 3.0, seed=4))
    data = tmp_path / "data"
    args = ["make", str(songs), "--data", str(data), "--tag", "mybnd", "--skip-train", "--json"]

    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    result = json.loads(first.stdout)
    assert result["dataset"]["slug"] == "my-band"  # the folder's name
    assert result["songs_url"] == str(songs)
    assert (result["preprocess"]["processed"], result["preprocess"]["cached"]) == (2, 0)
    built = json.loads((data / "datasets" / "my-band" / "dataset.json").read_text())
    assert built["metadata"]["custom_tag"] == "mybnd"
    by_file = {s["filename"]: s for s in built["samples"]}
    assert by_file["first.wav"]["caption"] == "Dusty lo-fi keys over a lazy beat"
    assert by_file["first.wav"]["bpm"] == 96
    # The song without a sidecar was labeled offline (a caption written for it).
    assert by_file["second.wav"]["caption"] and by_file["second.wav"]["labeled"] is True
    assert [s["name"] for s in result["stages"]][-1] == "report"

    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    rerun = json.loads(again.stdout)
    assert rerun["dataset"]["id"] == result["dataset"]["id"]  # the same dataset, not a second
    assert (rerun["preprocess"]["processed"], rerun["preprocess"]["cached"]) == (0, 2)
    assert sorted(p.name for p in (data / "datasets").iterdir()) == ["my-band"]

    # Training in this process; the LM run dies after its epoch-2 checkpoint (a crash, Ctrl-C).
    train = ["make", str(songs), "--data", str(data), "--tag", "mybnd", "--no-ray-train"]
    train += ["--skip-audition", "--json"]
    from hotstep_ray.training import lm

    keep_state = lm.save_state

    def save_then_die(setup, state, storage, key):
        keep_state(setup, state, storage, key)
        if state.epoch == 2 and not state.stop_reason:
            raise RuntimeError("killed after epoch 2")

    monkeypatch.setattr(lm, "save_state", save_then_die)
    crashed = CliRunner().invoke(app, train)
    assert crashed.exit_code == 1 and "killed after epoch 2" in str(crashed.exception)
    monkeypatch.undo()
    lm_runs = data / "adapters" / "lm-06b" / "my-band"
    (interrupted,) = lm_runs.iterdir()

    # The rerun keeps the finished DiT run and continues the LM run in its own folder.
    resumed = CliRunner().invoke(app, train)
    assert resumed.exit_code == 0, resumed.output
    second = json.loads(resumed.stdout)
    stages = {s["name"]: s["summary"] for s in second["stages"]}
    assert "unchanged, reused" in stages["train-dit"] and "continued" in stages["train-lm"]
    assert [p.name for p in lm_runs.iterdir()] == [interrupted.name]
    assert second["lm"]["run_key"].endswith(interrupted.name)
    assert len(second["lm"]["epoch_losses"]) == 4  # the recipe's 4 epochs: 2 before, 2 after
    # The timeline: stages in order from the job's start; the trainer that ran says how long its
    # epochs took (the rest of its stage is start-up, loading and export); no GPU here.
    timeline = {s["name"]: s for s in second["stages"]}
    starts = [s["start_s"] for s in second["stages"]]
    assert starts == sorted(starts) and starts[0] >= 0
    lm_row = timeline["train-lm"]
    assert 0 < lm_row["first_epoch_s"] <= lm_row["loop_s"] <= lm_row["seconds"]
    assert timeline["train-dit"]["loop_s"] is None  # reused: nothing ran
    assert all(s["gpu_busy"] is None for s in second["stages"])
    assert second["startup_s"] is None or second["startup_s"] > 0
    assert second["lm"]["epoch_losses"][-1] < second["lm"]["epoch_losses"][0]

    # Nothing changed since: both runs are reused as they are.
    third = json.loads(CliRunner().invoke(app, train).stdout)
    assert (third["dit"]["run_key"], third["lm"]["run_key"]) == (
        second["dit"]["run_key"],
        second["lm"]["run_key"],
    )
    assert all("unchanged, reused" in s["summary"] for s in third["stages"] if "train" in s["name"])
    # --retrain trains new runs anyway; here placed as on a Ray that is this machine with one GPU:
    # the DiT in this process, the LM on Ray Train beside it.
    from hotstep_ray import main_job

    mixed = Placement(preprocess=False, dit=False, lm=True)
    monkeypatch.setattr(main_job, "placement", lambda *_: mixed)
    placed = ["make", str(songs), "--data", str(data), "--tag", "mybnd", "--skip-audition"]
    retrained = CliRunner().invoke(app, [*placed, "--json", "--retrain"])
    assert retrained.exit_code == 0, retrained.output
    fourth = json.loads(retrained.stdout)
    assert fourth["lm"]["run_key"] != third["lm"]["run_key"]
    summaries = {s["name"]: s["summary"] for s in fourth["stages"]}
    assert "(in process)" in summaries["train-dit"] and "(Ray Train)" in summaries["train-lm"]
    assert fourth["lm"]["epoch_losses"][-1] < fourth["lm"]["epoch_losses"][0]


@pytest.mark.ray
def test_without_essentia_the_label_stage_warns_and_the_sidecars_stand(
    tmp_path, ray_session, monkeypatch
):
    """The offline labels need Essentia; without it `make` goes on with what the sidecars say
    (a warning, not a stop), since a described song needs nothing from the labeler."""
    from hotstep_ray import main_job
    from hotstep_ray.core.contracts import CreateDatasetInput
    from hotstep_ray.core.jobs import Job, read_job_events
    from hotstep_ray.core.storage import Storage
    from hotstep_ray.dataset.store import create_dataset
    from hotstep_ray.labeling.providers import ProviderUnavailableError

    songs = tmp_path / "songs"
    _write_song(songs, "a.wav", SongSpec("a", 100, "C", "major", 1.0, seed=1), "caption: Keys\n")
    storage = Storage(tmp_path / "data")
    detail = create_dataset(storage, CreateDatasetInput(source_dir=str(songs)))

    def no_essentia(*args, **kwargs):
        raise ProviderUnavailableError("the offline captioner needs Essentia analysis")

    monkeypatch.setattr(main_job, "label_dataset_on_ray", no_essentia)
    with Job(storage, "build") as job:
        report, after = main_job.label_stage(job, storage, detail)
    assert report.skipped == "the offline captioner needs Essentia analysis"
    assert main_job._label_summary(report).startswith("skipped: ")
    assert [s.caption for s in after.samples] == ["Keys"]
    warnings = [e.message for e in read_job_events(storage, job.id) if e.type == "log"]
    assert any("labels skipped" in message for message in warnings)


def test_placement_keeps_the_longest_path_in_this_process_on_one_gpu_machine():
    """Unset, a Ray that is this machine with one GPU encodes and trains the DiT here and the LM
    on Ray Train; a cluster, several GPUs or none put everything on Ray; a choice is kept."""
    assert placement(None, True, 1) == Placement(preprocess=False, dit=False, lm=True)
    everything = Placement(True, True, True)
    assert placement(None, False, 1) == placement(None, True, 2) == everything
    assert placement(None, True, 0) == placement(True, True, 1) == everything
    assert placement(False, False, 8) == Placement(False, False, False)
