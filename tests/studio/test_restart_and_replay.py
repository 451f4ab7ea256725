"""Job records across a server restart (no Ray needed): studio jobs left running are marked
failed "server restarted", jobs started elsewhere are left alone, stored events replay over SSE
through the capped buffer, and the `jobs` CLI reads the same records."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from hotstep_ray.cli.studio_cmd import jobs_app, studio_app
from hotstep_ray.core import layout
from hotstep_ray.core.contracts import JobSummary
from hotstep_ray.core.events import JobEvent, LogEvent, SampleEvent, StatusEvent, to_line
from hotstep_ray.core.jobs import read_job_events
from hotstep_ray.core.storage import Storage
from hotstep_ray.studio.records import StudioJobMeta, meta_key

API = "/api/training"


def _write_job(storage: Storage, job_id: str, status: str, studio: bool, children=()) -> None:
    summary = JobSummary(id=job_id, kind="label", dataset_id="d1", status=status, created_at=1)
    storage.write_json(layout.job_record(job_id), summary.to_json_dict())
    storage.append_line(layout.job_events(job_id), to_line(JobEvent(job=summary)))
    if studio:
        meta = StudioJobMeta(**summary.model_dump(), slug="s", child_job_ids=list(children))
        storage.write_json(meta_key(job_id), meta.to_json_dict())


@pytest.fixture
def stale_storage(tmp_path) -> Storage:
    storage = Storage(tmp_path / "data")
    _write_job(storage, "studiojob", "running", studio=True, children=["stagejob"])
    _write_job(storage, "stagejob", "running", studio=False)  # the stage's own record
    _write_job(storage, "queuedjob", "queued", studio=True)
    _write_job(storage, "clijob", "running", studio=False)  # e.g. `ray job submit -- hotstep-ray`
    _write_job(storage, "donejob", "done", studio=True)
    return storage


def test_restart_marks_running_studio_jobs_failed(stale_storage, make_client, read_sse):
    client = make_client(data=stale_storage.url)
    for job_id in ("studiojob", "queuedjob"):
        job = client.get(f"{API}/jobs/{job_id}").json()
        assert (job["status"], job["error"]) == ("failed", "server restarted")
        assert job["finishedAt"] > 0
        events = read_job_events(stale_storage, job_id)
        assert events[-1].type == "status" and events[-1].status == "failed"
        frames = read_sse(client, f"{API}/jobs/{job_id}/events")
        assert frames[-1] == {"type": "status", "status": "failed", "error": "server restarted"}
    # The stage's own record ends with its parent and is not listed separately.
    assert read_job_events(stale_storage, "stagejob")[-1].status == "failed"
    listed = {j["id"]: j["status"] for j in client.get(f"{API}/jobs").json()["jobs"]}
    assert listed == {
        "studiojob": "failed",
        "queuedjob": "failed",
        "clijob": "running",  # not ours: never touched
        "donejob": "done",
    }
    assert client.delete(f"{API}/jobs/clijob").status_code == 409
    assert client.delete(f"{API}/jobs/donejob").json()["job"]["status"] == "done"


def test_stored_events_replay_through_the_capped_buffer(tmp_path, make_client, read_sse):
    storage = Storage(tmp_path / "data")
    summary = JobSummary(id="longjob", kind="label", status="done", created_at=1)
    storage.write_json(layout.job_record("longjob"), summary.to_json_dict())
    lines = [to_line(LogEvent(message=f"log {i}")) for i in range(2500)]
    lines += [to_line(SampleEvent(sample_id=f"s{i}", status="labeled")) for i in range(5)]
    lines.append(to_line(StatusEvent(status="done")))
    storage.write_text(layout.job_events("longjob"), "\n".join(lines) + "\n")
    client = make_client(data=storage.url)
    frames = read_sse(client, f"{API}/jobs/longjob/events")
    assert frames[0] == {"type": "job", "job": summary.to_json_dict()}  # synthesised first frame
    assert len(frames) == 1 + 2000
    logs = [f["message"] for f in frames if f["type"] == "log"]
    assert logs[0] == "log 506" and logs[-1] == "log 2499"  # the oldest logs were dropped
    assert sum(f["type"] == "sample" for f in frames) == 5 and frames[-1]["type"] == "status"


def test_jobs_cli_reads_the_same_records(stale_storage):
    runner = CliRunner()
    listed = runner.invoke(jobs_app, ["list", "--data", stale_storage.url, "--json"])
    assert listed.exit_code == 0, listed.output
    assert "clijob" in listed.output and "stagejob" not in listed.output
    shown = runner.invoke(jobs_app, ["show", "donejob", "--data", stale_storage.url, "--events"])
    assert shown.exit_code == 0 and '"status": "done"' in shown.output
    assert '"type":"job"' in shown.output
    cancel = runner.invoke(jobs_app, ["cancel", "donejob", "--data", stale_storage.url])
    assert cancel.exit_code == 0 and "already done" in cancel.output
    missing = runner.invoke(jobs_app, ["show", "nojob", "--data", stale_storage.url])
    assert missing.exit_code == 2


def test_studio_serve_refuses_a_public_bind_without_a_token(tmp_path, monkeypatch):
    monkeypatch.delenv("HOTSTEP_TOKEN", raising=False)
    result = CliRunner().invoke(studio_app, ["serve", "--data", str(tmp_path), "--host", "0.0.0.0"])
    assert result.exit_code == 2 and "HOTSTEP_TOKEN" in result.output
