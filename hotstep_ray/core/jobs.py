"""Job records: `jobs/<id>/job.json` (the summary) and `jobs/<id>/events.jsonl` (every event).

A `Job` is a context manager around one stage run. It writes the record when it starts, streams
events to the JSONL log (and any extra sink, e.g. the CLI), keeps the summary's counters and phase in
step with progress events, and always ends with a terminal `status` event — `failed` with the
error when the body raises, so a crashed run is never left looking "running".
"""

from __future__ import annotations

import uuid
from types import TracebackType

from hotstep_ray.core import layout
from hotstep_ray.core.contracts import JobKind, JobStatus, JobSummary
from hotstep_ray.core.events import (
    EventLog,
    EventSink,
    JobEvent,
    ProgressEvent,
    StatusEvent,
    jsonl_sink,
    now_ms,
    read_lines,
)
from hotstep_ray.core.storage import Storage


class Job:
    def __init__(
        self,
        storage: Storage,
        kind: JobKind,
        dataset_id: str = "",
        job_id: str | None = None,
        sinks: tuple[EventSink, ...] = (),
    ) -> None:
        self.storage = storage
        self.summary = JobSummary(
            id=job_id or uuid.uuid4().hex[:16],
            kind=kind,
            dataset_id=dataset_id,
            created_at=now_ms(),
        )
        self.events = EventLog(jsonl_sink(storage, layout.job_events(self.summary.id)), *sinks)
        self.events.add(self._track)

    @property
    def id(self) -> str:
        return self.summary.id

    def _track(self, event) -> None:
        # Progress events update the persisted summary so `job.json` answers "how far along?".
        if isinstance(event, ProgressEvent):
            self.summary.done, self.summary.total = event.done, event.total
            self.summary.failed = event.failed
            self.summary.phase = event.phase or self.summary.phase
            self.summary.current_sample_id = event.current_sample_id

    def save(self) -> None:
        self.storage.write_json(layout.job_record(self.id), self.summary.to_json_dict())

    def set_status(self, status: JobStatus, error: str = "") -> None:
        self.summary.status = status
        self.summary.error = error
        if status == "running" and not self.summary.started_at:
            self.summary.started_at = now_ms()
        if status in ("done", "failed", "cancelled"):
            self.summary.finished_at = now_ms()
        self.save()
        self.events.emit(JobEvent(job=self.summary.model_copy()))

    def phase(self, name: str) -> None:
        self.summary.phase = name
        self.events.emit(
            ProgressEvent(
                done=self.summary.done,
                total=self.summary.total,
                failed=self.summary.failed,
                phase=name,
            )
        )

    def __enter__(self) -> Job:
        self.set_status("running")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.set_status("done")
            self.events.emit(StatusEvent(status="done"))
        elif isinstance(exc, KeyboardInterrupt):
            self.set_status("cancelled", "interrupted")
            self.events.emit(StatusEvent(status="cancelled", error="interrupted"))
        else:
            message = f"{type(exc).__name__}: {exc}"
            self.set_status("failed", message)
            self.events.emit(StatusEvent(status="failed", error=message))


def load_job(storage: Storage, job_id: str) -> JobSummary:
    return JobSummary.model_validate(storage.read_json(layout.job_record(job_id)))


def read_job_events(storage: Storage, job_id: str):
    text = storage.read_text(layout.job_events(job_id))
    return list(read_lines(text.splitlines()))
