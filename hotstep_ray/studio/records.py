"""Job records in storage, readable without Ray (the server, the `jobs` CLI, restart recovery).

    jobs/<id>/job.json       the JobSummary (`core.jobs.Job` writes it while the job runs)
    jobs/<id>/events.jsonl   every event, one JSON line each
    jobs/<id>/_meta.json     studio jobs only: the summary plus how the studio ran it
    jobs/<id>/result.json    what the stage returned, when it returned something JSON-able
    jobs/<id>/heartbeat.json the process running the job and when it last said so
                             (`core.jobs.Heartbeat`, which every `Job` runs)

A job without `_meta.json` was started elsewhere (CLI, `ray job submit`): listed and replayed,
never ended by the studio.

A killed process cannot end its own record, so a plain record that still reads `queued`/`running`
is read through its heartbeat, when it has one (`core.jobs.with_liveness`): shown `failed`, its
error starting with "lost:", once its process is gone. The heartbeat and that rule live in
`core.jobs` with the `Job` that writes them; their names are re-exported here for the studio's
readers.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import Field

from hotstep_ray.core import layout
from hotstep_ray.core.contracts import JOB_PHASES, TERMINAL_JOB_STATUSES, JobSummary
from hotstep_ray.core.errors import HotstepError, InputError
from hotstep_ray.core.events import JobEvent, StatusEvent, now_ms, to_line

# the heartbeat's names, as the studio's readers and the CLI knew them here (the rule is core's)
from hotstep_ray.core.jobs import (  # noqa: F401
    HEARTBEAT_EVERY_S,
    LOST,
    LOST_AFTER_S,
    Heartbeat,
    heartbeat_key,
    lost_reason,
    with_liveness,
)
from hotstep_ray.core.storage import Storage
from hotstep_ray.studio.errors import ConflictError, NotFoundError

log = logging.getLogger(__name__)

NAMESPACE = "hotstep-studio"  # Ray namespace of the runner actors
RESTARTED = "server restarted"


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
