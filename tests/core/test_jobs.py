"""Jobs: the record follows progress, and a crash always ends in a `failed` status event."""

from __future__ import annotations

import pytest

from hotstep_ray.core.jobs import Job, load_job, read_job_events
from hotstep_ray.core.storage import Storage


def test_job_success_records_progress_and_terminal_status(tmp_path):
    storage = Storage(tmp_path)
    with Job(storage, "build", dataset_id="d1") as job:
        job.events.progress(2, 5, phase="probe")
    summary = load_job(storage, job.id)
    assert (summary.status, summary.done, summary.total, summary.phase) == ("done", 2, 5, "probe")
    assert summary.finished_at >= summary.started_at > 0
    events = read_job_events(storage, job.id)
    assert events[-1].type == "status" and events[-1].status == "done"
    assert [e.type for e in events][:2] == ["job", "progress"]


def test_job_crash_is_recorded_as_failed(tmp_path):
    storage = Storage(tmp_path)
    with pytest.raises(RuntimeError):
        with Job(storage, "scan") as job:
            raise RuntimeError("disk on fire")
    summary = load_job(storage, job.id)
    assert summary.status == "failed" and "disk on fire" in summary.error
    assert read_job_events(storage, job.id)[-1].error == "RuntimeError: disk on fire"
