"""Job records: `jobs/<id>/job.json` (the summary) and `jobs/<id>/events.jsonl` (every event).

A `Job` is a context manager around one stage run. It writes the record when it starts, streams
events to the JSONL log (and any extra sink, e.g. the CLI), keeps the summary's counters and phase in
step with progress events, and always ends with a terminal `status` event — `failed` with the
error when the body raises, so a crashed run is never left looking "running".

While it runs, `job.json` follows the run: rewritten at each new phase and at most every
`PROGRESS_SAVE_S` for the counters, so a run that is killed (a studio job cancelled with
`ray.kill`, a lost node) leaves a record of how far it got. A record another process ended (the
studio's or `jobs cancel`'s `cancelled`) is not overwritten by a runner that is still dying.
"""

from __future__ import annotations

import logging
import time
import uuid
from types import TracebackType

from hotstep_ray.core import layout
from hotstep_ray.core.contracts import TERMINAL_JOB_STATUSES, JobKind, JobStatus, JobSummary
from hotstep_ray.core.errors import HotstepError
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

log = logging.getLogger(__name__)

PROGRESS_SAVE_S = 5.0  # a running job's counters reach job.json at most this often


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
        self._saved_at = 0.0  # time.monotonic() of the last progress save
        self._ended_elsewhere = False

    @property
    def id(self) -> str:
        return self.summary.id

    def _track(self, event) -> None:
        # Progress events update the persisted summary so `job.json` answers "how far along?".
        if isinstance(event, ProgressEvent):
            new_phase = bool(event.phase) and event.phase != self.summary.phase
            self.summary.done, self.summary.total = event.done, event.total
            self.summary.failed = event.failed
            self.summary.phase = event.phase or self.summary.phase
            self.summary.current_sample_id = event.current_sample_id
            self._save_progress(force=new_phase)

    def _save_progress(self, force: bool) -> None:
        """Rewrite job.json mid-run: at once for a new phase, else throttled."""
        if self.summary.status != "running" or self._ended_elsewhere:
            return
        now = time.monotonic()
        if not force and now - self._saved_at < PROGRESS_SAVE_S:
            return
        self._saved_at = now
        key = layout.job_record(self.id)
        try:
            stored = self.storage.read_json(key)
        except (HotstepError, ValueError):
            stored = {}
        if isinstance(stored, dict) and stored.get("status") in TERMINAL_JOB_STATUSES:
            self._ended_elsewhere = True  # cancelled from outside: its word stands
            return
        try:
            self.save()
        except (HotstepError, OSError) as exc:  # a missed mid-run save is not worth a failure
            log.warning("could not update %s: %s", layout.job_record(self.id), exc)

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
        # `_track` takes the new phase (and writes it to job.json) as the event goes by
        self.events.emit(
            ProgressEvent(
                done=self.summary.done,
                total=self.summary.total,
                failed=self.summary.failed,
                phase=name,
            )
        )
        self.summary.phase = name

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
