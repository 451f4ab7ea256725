"""`POST /make`: a folder of songs → adapters as one studio job (what `hotstep-ray make` runs).
Refusals come before any job: a folder outside the allowed roots (403), a folder without audio or
not a folder (400), a field the request does not know (422). A folder inside the roots runs the
main job in the job's runner: its stage phases reach the SSE stream, the job ends `done` exactly
once, and its result holds the stage timeline and both adapters."""

from __future__ import annotations

import shutil
import time

import pytest
from live_server import API, LiveServer, http_json, read_sse

from hotstep_ray.core.contracts import JOB_PHASES
from hotstep_ray.studio.app import create_app
from hotstep_ray.studio.config import StudioConfig

# The stage timeline, in order (tests/test_main_job.py spells it out).
STAGE_ROWS = list(JOB_PHASES["make"][1:])
MAKE_SONGS = ("01_morning_drive", "05_untitled")  # a sidecar with a caption, and none at all


@pytest.fixture
def band(rendered_songs, tmp_path):
    """Two of the example songs in a folder of their own, inside the allowed roots."""
    folder = tmp_path / "library" / "band"
    folder.mkdir(parents=True)
    for path in rendered_songs.iterdir():
        if path.name.split(".")[0] in MAKE_SONGS:
            shutil.copy(path, folder / path.name)
    return folder


def test_folders_outside_the_roots_or_without_audio_are_refused(client, songs, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.copy(next(songs.glob("*.wav")), outside / "a.wav")
    refused = client.post(f"{API}/make", json={"songsDir": str(outside)})
    assert refused.status_code == 403 and "outside the allowed roots" in refused.json()["error"]

    empty = songs.parent / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("no songs here")
    for folder, words in (
        (empty, "no audio files"),
        (songs.parent / "missing", "songs folder not found"),
        (songs / "01_morning_drive.txt", "is a file"),
    ):
        answer = client.post(f"{API}/make", json={"songsDir": str(folder)})
        assert answer.status_code == 400, answer.text
        assert words in answer.json()["error"]
    unknown = client.post(f"{API}/make", json={"songsDir": str(songs), "checkpoints": "/"})
    assert unknown.status_code == 422 and "checkpoints" in unknown.json()["error"]
    assert client.get(f"{API}/datasets").json()["datasets"] == []  # nothing was registered
    assert client.get(f"{API}/jobs").json()["jobs"] == []


@pytest.mark.ray
@pytest.mark.slow
def test_make_runs_the_main_job_with_its_events_and_result(band, tmp_path, ray_session):
    config = StudioConfig(data=str(tmp_path / "data"), roots=(str(band.parent),), token="t0k")
    with LiveServer(create_app(config)) as server:
        base = f"{server.url}{API}"
        body = {"songsDir": str(band), "tag": "bnd", "trainOnRay": False, "audition": False}
        status, accepted = http_json("POST", f"{base}/make", {**body, "epochs": 1}, "t0k")
        assert status == 202, accepted
        job_id, dataset = accepted["jobId"], accepted["dataset"]
        assert accepted["job"]["kind"] == "make" and dataset["slug"] == "band"

        # A second start while it runs: one job per dataset.
        status, again = http_json("POST", f"{base}/make", body, "t0k")
        assert status == 409, again
        # The dataset is there from the start: its songs can be listed while the job runs.
        status, listed = http_json("GET", f"{base}/datasets/band/songs", token="t0k")
        assert status == 200 and len(listed["songs"]) == len(MAKE_SONGS)

        started = time.monotonic()
        while True:
            status, job = http_json("GET", f"{base}/jobs/{job_id}", token="t0k")
            if job["status"] in ("done", "failed", "cancelled"):
                break
            assert time.monotonic() - started < 420, job
            time.sleep(0.5)
        frames = read_sse(f"{base}/jobs/{job_id}/events", "t0k")
        assert job["status"] == "done", (job["error"], frames[-5:])
        assert job["datasetId"] == dataset["id"]

        statuses = [f for f in frames if f["type"] == "status"]
        assert [f["status"] for f in statuses] == ["done"]  # the main job's own status folded
        assert {f["job"]["id"] for f in frames if f["type"] == "job"} == {job_id}
        seen = [f["stage"] for f in frames if f["type"] == "progress" and f.get("stage")]
        assert [s for s in STAGE_ROWS if s in seen] == seen and "preprocess" in seen

        status, result = http_json("GET", f"{base}/jobs/{job_id}/result", token="t0k")
        assert status == 200, result
        assert [row["name"] for row in result["stages"]] == STAGE_ROWS
        rows = {row["name"]: row for row in result["stages"]}
        assert "skipped" in rows["audition"]["summary"] and result["ab"] is None
        assert result["dataset"]["id"] == dataset["id"] and result["tiny"] is True
        for kind in ("dit", "lm"):
            adapter = result[kind]
            assert adapter["kind"] == kind and adapter["adapter_id"] and adapter["epoch_losses"]
        # The main job's own record is a child of the studio job: listed once, as `make`.
        status, jobs = http_json("GET", f"{base}/jobs", token="t0k")
        assert [j["kind"] for j in jobs["jobs"]] == ["make"]
