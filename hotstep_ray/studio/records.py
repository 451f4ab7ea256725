"""Job records in storage, readable without Ray (the server, the `jobs` CLI, restart recovery).

    jobs/<id>/job.json       the JobSummary (`core.jobs.Job` writes it while the job runs)
    jobs/<id>/events.jsonl   every event, one JSON line each
    jobs/<id>/_meta.json     studio jobs only: the summary plus how the studio ran it
    jobs/<id>/result.json    what the stage returned, when it returned something JSON-able
    jobs/<id>/heartbeat.json the process running the job and when it last said so (`Heartbeat`)

A job without `_meta.json` was started elsewhere (CLI, `ray job submit`): listed and replayed,
never ended by the studio.

A killed process cannot end its own record, so a job whose record still reads `queued`/`running`
is read through its heartbeat, when it has one: it is shown `failed`, its error starting with
"lost:", once its process is gone from this machine or its heartbeat is older than
`LOST_AFTER_S`. That is how it reads, not a rewrite of the record: a process that was only slow
to beat still ends its own record.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from pathlib import Path
from typing import Any

from pydantic import Field

from hotstep_ray.core import layout
from hotstep_ray.core.contracts import JOB_PHASES, TERMINAL_JOB_STATUSES, JobSummary
from hotstep_ray.core.errors import HotstepError, InputError
from hotstep_ray.core.events import JobEvent, StatusEvent, now_ms, to_line
from hotstep_ray.core.storage import Storage
from hotstep_ray.studio.errors import ConflictError, NotFoundError

log = logging.getLogger(__name__)

NAMESPACE = "hotstep-studio"  # Ray namespace of the runner actors
RESTARTED = "server restarted"
LOST = "lost"  # the error prefix of a job whose process is gone
HEARTBEAT_EVERY_S = 15.0  # a running job's process rewrites its heartbeat this often
# A heartbeat older than this means its process is gone (seconds, by the reader's clock against
# the writer's: generous, so clock skew between machines and slow object stores stay below it).
LOST_AFTER_S = 120.0


class JobNotFoundError(NotFoundError):
    """No such job."""


class JobConflictError(ConflictError):
    """A job is already running for this dataset, or the job cannot be cancelled here."""


class StudioJobMeta(JobSummary):
    """`jobs/<id>/_meta.json`: the summary plus how the studio ran the job."""

    slug: str = ""
    options: dict[str, Any] = Field(default_factory=dict)
    runner: str = "ray-actor"
    actor_name: str = ""
    namespace: str = NAMESPACE
    child_job_ids: list[str] = Field(default_factory=list)


def meta_key(job_id: str) -> str:
    return layout.job_meta(job_id)


def result_key(job_id: str) -> str:
    return layout.job_result(job_id)


def read_meta(storage: Storage, job_id: str) -> StudioJobMeta | None:
    key = meta_key(job_id)
    if not storage.exists(key):
        return None
    return StudioJobMeta.model_validate(storage.read_json(key))


def heartbeat_key(job_id: str) -> str:
    return f"{layout.job_dir(job_id)}/heartbeat.json"


def _boot_id() -> str:
    """This machine's boot id (Linux): a host name alone may repeat across machines."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _this_machine() -> dict[str, str]:
    return {"host": socket.gethostname(), "boot_id": _boot_id()}


class Heartbeat:
    """While the block runs, `jobs/<id>/heartbeat.json` names this process (host, boot id, pid)
    and says when it last ran (`beat_at`, epoch ms), rewritten every `every_s` seconds by a
    daemon thread. A failed write is logged, never raised: the job matters more."""

    def __init__(self, storage: Storage, job_id: str, every_s: float = HEARTBEAT_EVERY_S) -> None:
        self.storage, self.key, self.every_s = storage, heartbeat_key(job_id), every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat:{job_id}", daemon=True)

    def beat(self) -> None:
        record = {**_this_machine(), "pid": os.getpid(), "beat_at": now_ms()}
        record["every_s"] = self.every_s
        try:
            self.storage.write_json(self.key, record)
        except (HotstepError, OSError) as exc:
            log.warning("could not write %s: %s", self.key, exc)

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.beat()

    def __enter__(self) -> Heartbeat:
        self.beat()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


def lost_reason(storage: Storage, summary: JobSummary, now: int | None = None) -> str:
    """Why an unended job's process is gone ("" = alive, ended, or no heartbeat to judge by)."""
    if summary.status in TERMINAL_JOB_STATUSES:
        return ""
    key = heartbeat_key(summary.id)
    try:
        beat = storage.read_json(key) if storage.exists(key) else None
    except (HotstepError, ValueError):
        return ""
    if not isinstance(beat, dict) or not beat.get("beat_at"):
        return ""
    age_s = ((now_ms() if now is None else now) - int(beat["beat_at"])) / 1000
    here = _this_machine()
    same_machine = beat.get("host") == here["host"] and beat.get("boot_id", "") == here["boot_id"]
    pid = int(beat.get("pid") or 0)
    if same_machine and pid and not _pid_alive(pid):
        return f"{LOST}: its process {pid} on {here['host']} is gone ({age_s:.0f} s since it ran)"
    # a writer that beats less often than the default is given four of its own intervals
    if age_s > max(LOST_AFTER_S, 4 * float(beat.get("every_s") or 0)):
        where = f"process {pid} on {beat.get('host')}"
        return f"{LOST}: no heartbeat from {where} for {age_s:.0f} s"
    return ""


def with_liveness(storage: Storage, summary: JobSummary) -> JobSummary:
    """`summary`, shown `failed` ("lost: ...") when its process is gone (`lost_reason`)."""
    reason = lost_reason(storage, summary)
    if not reason:
        return summary
    key = heartbeat_key(summary.id)
    with contextlib.suppress(HotstepError, ValueError, TypeError):
        summary = summary.model_copy(update={"finished_at": int(storage.read_json(key)["beat_at"])})
    return summary.model_copy(update={"status": "failed", "error": reason})


def read_summary(storage: Storage, job_id: str) -> JobSummary:
    """A stored job's summary: the studio record first, then the plain `job.json` (read through
    its heartbeat: `with_liveness`)."""
    try:
        layout.check_name(job_id, "job id")
    except InputError as exc:
        raise JobNotFoundError(f"no job {job_id!r}") from exc
    meta = read_meta(storage, job_id)
    if meta is not None:
        return JobSummary.model_validate(meta.model_dump())
    key = layout.job_record(job_id)
    if not storage.exists(key):
        raise JobNotFoundError(f"no job {job_id!r}")
    return with_liveness(storage, JobSummary.model_validate(storage.read_json(key)))


def _job_ids(storage: Storage) -> list[str]:
    names = (key.rsplit("/", 1)[-1] for key in storage.list("jobs"))
    return [name for name in names if not name.startswith(".")]


def list_stored(storage: Storage) -> list[JobSummary]:
    """Every job under `jobs/`, minus the stage-internal records of studio jobs."""
    summaries: dict[str, JobSummary] = {}
    children: set[str] = set()
    for job_id in _job_ids(storage):
        try:
            meta = read_meta(storage, job_id)
            if meta is not None:
                children.update(meta.child_job_ids)
                summaries[job_id] = JobSummary.model_validate(meta.model_dump())
            elif storage.exists(layout.job_record(job_id)):
                summaries[job_id] = read_summary(storage, job_id)
        except (HotstepError, ValueError):
            continue  # a half-written or foreign folder is not a job
    return [s for i, s in summaries.items() if i not in children]


PROGRESS_FIELDS = ("phase", "done", "total", "failed", "current_sample_id")


def _reached(summary: JobSummary) -> tuple[int, int]:
    """How far a record says its job got: (phase rank, items done). A phase the kind does not
    list (calibrate, a stage's own) ranks after the listed ones; `queued` ranks first."""
    phases = JOB_PHASES.get(summary.kind, ("queued",))
    if summary.phase in phases:
        return phases.index(summary.phase), summary.done
    return (0 if summary.phase == "queued" else len(phases)), summary.done


def furthest_progress(stored: JobSummary, live: JobSummary) -> dict[str, Any]:
    """The progress fields of whichever record got further (`live` on a tie): an ended job
    keeps the phase and counts it reached, whichever of its records saw them last."""
    source = live if _reached(live) >= _reached(stored) else stored
    return {name: getattr(source, name) for name in PROGRESS_FIELDS}


def _end_record(
    storage: Storage, job_id: str, status: str, error: str, live: JobSummary | None = None
) -> JobSummary | None:
    """Rewrite `job.json` as terminal and append the closing frames to `events.jsonl`, unless it
    already ended; returns the new summary (None when there was nothing to end). `live`: the
    caller's view of the job, whose progress wins when it got further than the stored one."""
    key = layout.job_record(job_id)
    if not storage.exists(key):
        return None
    summary = JobSummary.model_validate(storage.read_json(key))
    if summary.status in TERMINAL_JOB_STATUSES:
        return None
    update: dict[str, Any] = {"status": status, "error": error, "finished_at": now_ms()}
    if live is not None:
        update.update(furthest_progress(summary, live))
    summary = summary.model_copy(update=update)
    storage.write_json(key, summary.to_json_dict())
    events_key = layout.job_events(job_id)
    storage.append_line(events_key, to_line(JobEvent(job=summary)))
    storage.append_line(events_key, to_line(StatusEvent(status=status, error=error)))
    return summary


def end_stored_job(storage: Storage, meta: StudioJobMeta, status: str, error: str) -> StudioJobMeta:
    """Mark a studio job (and its stage-internal records) terminal in storage, keeping the
    furthest phase and counts either `meta` or the job's own `job.json` reached."""
    ended = _end_record(storage, meta.id, status, error, live=meta)
    if ended is None:
        # job.json already terminal (or never written): keep its word, else use ours.
        record = layout.job_record(meta.id)
        if storage.exists(record):
            ended = JobSummary.model_validate(storage.read_json(record))
        else:
            ended = meta.model_copy(update={"status": status, "error": error})
            ended = JobSummary.model_validate(ended.model_dump())
            ended.finished_at = now_ms()
            storage.append_line(layout.job_events(meta.id), to_line(JobEvent(job=ended)))
            storage.append_line(
                layout.job_events(meta.id), to_line(StatusEvent(status=status, error=error))
            )
    for child in meta.child_job_ids:
        _end_record(storage, child, status, error)
    new_meta = StudioJobMeta.model_validate({**meta.model_dump(), **ended.model_dump()})
    storage.write_json(meta_key(meta.id), new_meta.to_json_dict())
    return new_meta


def recover_stale_jobs(storage: Storage) -> list[str]:
    """Mark studio jobs left `queued`/`running` by a previous server as failed; returns ids."""
    recovered = []
    for job_id in _job_ids(storage):
        try:
            meta = read_meta(storage, job_id)
        except (HotstepError, ValueError):
            continue
        if meta is not None and meta.status not in TERMINAL_JOB_STATUSES:
            end_stored_job(storage, meta, "failed", RESTARTED)
            recovered.append(job_id)
    return recovered
