"""The studio's job runner: one named, detached Ray actor per job.

Why actors and not Ray Jobs (`JobSubmissionClient`):
- Ray Jobs need the dashboard's job server. `ensure_ray` starts local Ray without a dashboard (and
  so does the test session), where a Jobs-based studio could not run a single job.
- A Ray Job is a new driver process: it re-imports torch and the stage, and reconnects to the
  cluster, for every job (seconds each). An actor starts in an already-warm worker.
- Live events: an actor keeps the job's events in memory and the server polls it (`poll`), so the
  SSE stream follows a job on any node without tailing logs or re-reading `events.jsonl` from
  object storage (an S3 "append" rewrites the whole object).
- Cancel and placement stay Ray-native: `ray.kill` ends the process tree of a stage that has no
  cancel token (the seed kills its child processes the same way), and the actor's resource request
  (`num_gpus`, `{"VRAM_GB": n}`) is what the autoscaler scales GPU nodes for. While no node can
  host it, the actor is pending and the job reads `queued`: Ray's scheduler is the job queue.
- Named + detached (namespace `hotstep-studio`, name `hotstep-job-<id>`): another process can find
  the runner by the job id alone, so `hotstep-ray jobs cancel` works from a shell, and a restarted
  server kills the runners its predecessor left behind.
`ray job submit -- hotstep-ray ...` stays the way to run a stage as a batch job: those runs write
the same `jobs/<id>/` records, and the studio lists them and replays their events.

Records (`records.py`): `jobs/<id>/job.json` (written by `core.jobs.Job` in the runner),
`events.jsonl`, `_meta.json` (the seed's job record: the summary plus slug, options, actor name and
the ids of stage-internal job records) and `result.json`. On start the server marks every studio
job still `queued`/`running` as failed, "server restarted": its runner died with the server or is
killed now. Jobs started elsewhere (CLI, `ray job submit`) have no `_meta.json` and are left alone.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from hotstep_ray.core import layout
from hotstep_ray.core.contracts import TERMINAL_JOB_STATUSES, DatasetSummary, JobSummary
from hotstep_ray.core.errors import StorageError
from hotstep_ray.core.events import JobEvent, StatusEvent, now_ms, parse_line, to_line
from hotstep_ray.core.jobs import Job
from hotstep_ray.core.storage import Storage
from hotstep_ray.studio import stages
from hotstep_ray.studio.errors import ServiceUnavailableError
from hotstep_ray.studio.records import (
    NAMESPACE,
    JobConflictError,
    StudioJobMeta,
    end_stored_job,
    list_stored,
    meta_key,
    read_meta,
    read_summary,
    recover_stale_jobs,
    result_key,
)
from hotstep_ray.studio.runners import ForwardLog, StageContext
from hotstep_ray.studio.sse import ReplayBuffer, buffer_from_jsonl

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.2
# Ended jobs kept in memory (their buffers); older ones are replayed from storage instead.
KEEP_ENDED_IN_MEMORY = 32


def actor_name(job_id: str) -> str:
    return f"hotstep-job-{job_id}"


# -- the runner actor (its methods run in the actor's process) -----------------------------------
class JobRunner:
    """Runs one stage under a `core.jobs.Job` with the studio's job id and keeps every event
    line in memory for `poll`. Threaded (max_concurrency > 1) so `poll` answers while `run`
    works."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self._lines: list[str] = []
        self._children: list[str] = []
        self._lock = threading.Lock()

    def _collect(self, event: Any) -> None:
        with self._lock:
            self._lines.append(to_line(event))

    def run(self) -> dict[str, Any]:
        spec = self.spec
        storage = Storage(spec["storage_url"], **spec["storage_options"])
        job = Job(
            storage,
            spec["kind"],
            dataset_id=spec["dataset_id"],
            job_id=spec["job_id"],
            sinks=(self._collect,),
        )
        job.summary.created_at = spec["created_at"]

        def forward(event: Any) -> None:
            # A stage's own Job record becomes a child: its job/status frames would otherwise
            # announce a second job id (and a premature end) on this job's stream.
            if isinstance(event, JobEvent):
                if event.job.id != job.id and event.job.id not in self._children:
                    with self._lock:
                        self._children.append(event.job.id)
                return
            if isinstance(event, StatusEvent):
                return
            job.events.emit(event)

        try:
            options = stages.resolve(spec["kind"]).options_model.model_validate(spec["options"])
            ctx = StageContext(
                storage, spec["slug"], options, job, ForwardLog(forward), spec["checkpoints_dir"]
            )
            with job:
                result = stages.result_json(stages.run_stage(ctx))
                if result is not None:
                    storage.write_json(result_key(job.id), result)
        except BaseException:  # recorded by Job.__exit__ (failed/cancelled + status event)
            log.debug("job %s ended with an error", job.id, exc_info=True)
        return job.summary.to_json_dict()

    def poll(self, cursor: int) -> tuple[list[str], int, list[str]]:
        """(event lines after `cursor`, the new cursor, child job ids)."""
        with self._lock:
            return self._lines[cursor:], len(self._lines), list(self._children)


def kill_runner(ray: Any, job_id: str) -> bool:
    """Kill a job's runner actor if it is alive anywhere on the cluster."""
    try:
        handle = ray.get_actor(actor_name(job_id), namespace=NAMESPACE)
    except ValueError:
        return False
    ray.kill(handle, no_restart=True)
    return True


# How long, after a runner is killed, to look for the placement groups its Ray Train job held:
# the Train controller dies with the runner a moment later, and only then is its group orphaned.
ORPHAN_WAIT_S = 10.0


def holds_placement_groups(kind: str) -> bool:
    """Whether a job of `kind` runs a Ray Train job (whose placement groups a kill orphans)."""
    return kind.startswith(("train-", "mm3-train")) or kind == "make"


def free_placement_groups(wait_s: float = ORPHAN_WAIT_S) -> list[str]:
    """Remove the placement groups a killed runner's Ray Train job left behind (the studio's
    local Ray has no dashboard, which Ray Train's own cleaner needs:
    `distributed.runtime.remove_orphaned_placement_groups`), polling up to `wait_s` seconds
    for the first; their ids."""
    from hotstep_ray.distributed.runtime import remove_orphaned_placement_groups

    deadline = time.monotonic() + wait_s
    while True:
        try:
            removed = remove_orphaned_placement_groups()
        except Exception:  # never fail a cancel over the cleanup
            log.warning("could not free the placement groups of a cancelled job", exc_info=True)
            return []
        if removed or time.monotonic() >= deadline:
            return removed
        time.sleep(0.25)


def cancel_stored_job(storage: Storage, get_ray: Callable[[], Any], job_id: str) -> JobSummary:
    """Cancel a studio job from outside the server that runs it (the `jobs cancel` CLI).
    `get_ray` connects only when there is a runner to kill."""
    meta = read_meta(storage, job_id)
    if meta is None:
        summary = read_summary(storage, job_id)
        if summary.status in TERMINAL_JOB_STATUSES:
            return summary
        raise JobConflictError(
            f"job {job_id} was not started by the studio; stop it where it runs "
            "(e.g. `ray job stop <submission id>`)"
        )
    if meta.status in TERMINAL_JOB_STATUSES:
        return JobSummary.model_validate(meta.model_dump())
    # Recorded before the kill, so the server running the job reads "cancelled", not a crash.
    ended = end_stored_job(storage, meta, "cancelled", "cancelled by user")
    if kill_runner(get_ray(), job_id) and holds_placement_groups(meta.kind):
        free_placement_groups()
    return JobSummary.model_validate(ended.model_dump())


# -- the manager (in the server process) ----------------------------------------------------------
_RUNNER_CLASS: Any = None


def _runner_class(ray: Any) -> Any:
    global _RUNNER_CLASS
    if _RUNNER_CLASS is None:
        _RUNNER_CLASS = ray.remote(JobRunner)
    return _RUNNER_CLASS


@dataclass
class ActiveJob:
    meta: StudioJobMeta
    buffer: ReplayBuffer
    actor: Any = None
    run_ref: Any = None
    ended: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def summary(self) -> JobSummary:
        return JobSummary.model_validate(self.meta.model_dump())


class JobStream:
    """What an SSE handler reads: the job's buffer, `refresh()` to pick up new events of a job
    this server does not run (a CLI job still writing `events.jsonl`), and `finished()`."""

    def __init__(
        self,
        summary: JobSummary,
        buffer: ReplayBuffer,
        tail: Storage | None = None,
        static: bool = False,
    ) -> None:
        self.summary = summary
        self.buffer = buffer
        self._tail = tail
        self._static = static  # a stored, ended job: its replay is all there is
        self._lines = 0

    def finished(self) -> bool:
        return self._static or self.buffer.terminal()

    def refresh(self) -> None:
        if self._tail is None:
            return
        try:
            text = self._tail.read_text(layout.job_events(self.summary.id))
        except StorageError:
            return
        lines = text.splitlines()
        if text and not text.endswith("\n"):
            lines = lines[:-1]  # a line still being written
        for line in lines[self._lines :]:
            try:
                event = parse_line(line)
            except ValueError:
                event = None
            if event is not None:
                self.buffer.append(event)
        self._lines = max(self._lines, len(lines))


class JobManager:
    """Starts, tracks and cancels studio jobs; one per server (the job map is in memory).

    Args:
        storage: the storage root jobs read and write.
        ray_address: Ray to join on the first job ("" = running / `$RAY_ADDRESS` / local).
        checkpoints_dir: the `checkpoints/` folder GPU stages load models from.
    """

    def __init__(
        self,
        storage: Storage,
        ray_address: str = "",
        checkpoints_dir: str = "",
        poll_interval_s: float = POLL_INTERVAL_S,
    ) -> None:
        self.storage = storage
        self.ray_address = ray_address
        self.checkpoints_dir = checkpoints_dir
        self.poll_interval_s = poll_interval_s
        self._jobs: dict[str, ActiveJob] = {}
        self._lock = threading.RLock()
        self._ray: Any = None
        self.recovered = recover_stale_jobs(storage)

    # -- Ray -------------------------------------------------------------------------------------
    def ray(self) -> Any:
        if self._ray is None:
            from hotstep_ray.distributed.runtime import ensure_ray

            self._ray = ensure_ray(self.ray_address or None)
            for job_id in self.recovered:  # runners a previous server left behind
                kill_runner(self._ray, job_id)
        return self._ray

    # -- queries ---------------------------------------------------------------------------------
    def active_job_for(self, dataset_id: str) -> str:
        """The dataset's unfinished job ("" = none). A job whose status already reads terminal
        frees its dataset at once, before the pump has released its runner: a client that polled
        it to `done` may start the next stage straight away."""
        with self._lock:
            for job_id, active in self._jobs.items():
                if (
                    active.meta.dataset_id == dataset_id
                    and not active.ended
                    and active.meta.status not in TERMINAL_JOB_STATUSES
                ):
                    return job_id
        return ""

    def get(self, job_id: str) -> JobSummary:
        with self._lock:
            active = self._jobs.get(job_id)
        if active is not None:
            with active.lock:
                return active.summary
        return read_summary(self.storage, job_id)

    def list(self, dataset_id: str = "") -> list[JobSummary]:
        with self._lock:
            live = {job_id: active for job_id, active in self._jobs.items()}
        merged = {s.id: s for s in list_stored(self.storage)}
        for job_id, active in live.items():
            with active.lock:
                merged[job_id] = active.summary
        jobs = [s for s in merged.values() if not dataset_id or s.dataset_id == dataset_id]
        return sorted(jobs, key=lambda s: (s.created_at, s.id), reverse=True)

    def stream(self, job_id: str) -> JobStream:
        with self._lock:
            active = self._jobs.get(job_id)
        if active is not None:
            with active.lock:
                return JobStream(active.summary, active.buffer)
        summary = read_summary(self.storage, job_id)
        if summary.status in TERMINAL_JOB_STATUSES:
            try:
                text = self.storage.read_text(layout.job_events(job_id))
            except StorageError:
                text = ""
            return JobStream(summary, buffer_from_jsonl(text), static=True)
        stream = JobStream(summary, ReplayBuffer(), tail=self.storage)
        stream.refresh()
        return stream

    # -- submit ----------------------------------------------------------------------------------
    def submit(
        self,
        kind: str,
        dataset: DatasetSummary,
        options: BaseModel,
        actor_options: dict[str, Any] | None = None,
    ) -> JobSummary:
        """Start a job; JobConflictError when the dataset already has one running."""
        import uuid

        job_id = uuid.uuid4().hex[:16]
        meta = StudioJobMeta(
            id=job_id,
            kind=kind,  # type: ignore[arg-type]
            dataset_id=dataset.id,
            created_at=now_ms(),
            slug=dataset.slug,
            options=options.model_dump(mode="json", by_alias=True, exclude_unset=True),
            actor_name=actor_name(job_id),
        )
        active = ActiveJob(meta=meta, buffer=ReplayBuffer())
        with self._lock:
            running = self.active_job_for(dataset.id)
            if running:
                raise JobConflictError(
                    f"a job is already running for dataset {dataset.slug!r} ({running})"
                )
            self._jobs[job_id] = active
        try:
            self._persist(active)
            self.storage.write_json(layout.job_record(job_id), active.summary.to_json_dict())
            queued = JobEvent(job=active.summary)
            self.storage.append_line(layout.job_events(job_id), to_line(queued))
            active.buffer.append(queued)
        except BaseException:
            with self._lock:
                self._jobs.pop(job_id, None)
            raise
        try:
            self._start(active, kind, options, actor_options or {})
        except Exception as exc:  # Ray unreachable, bad actor options: the job never started
            with active.lock:
                self._end_active(active, "failed", f"could not start: {exc}")
                active.ended = True
            raise ServiceUnavailableError(f"could not start the job on Ray: {exc}") from exc
        return active.summary

    def _start(
        self, active: ActiveJob, kind: str, job_options: BaseModel, actor_options: dict[str, Any]
    ) -> None:
        ray = self.ray()
        needs = stages.runner_actor_options(kind, job_options, ray.cluster_resources())
        options = {"num_cpus": 0, **needs, **actor_options}
        runner = _runner_class(ray).options(
            name=active.meta.actor_name,
            namespace=NAMESPACE,
            lifetime="detached",  # findable by name from any process; killed when the job ends
            max_concurrency=4,  # run + poll at once
            max_restarts=0,  # a restarted runner would rerun half a job
            **options,
        )
        meta = active.meta
        active.actor = runner.remote(
            {
                "job_id": meta.id,
                "kind": kind,
                "dataset_id": meta.dataset_id,
                "slug": meta.slug,
                "options": meta.options,
                "created_at": meta.created_at,
                "storage_url": self.storage.url,
                "storage_options": self.storage.storage_options,
                "checkpoints_dir": self.checkpoints_dir,
            }
        )
        active.run_ref = active.actor.run.remote()
        threading.Thread(
            target=self._pump, args=(active,), name=f"job-pump-{meta.id}", daemon=True
        ).start()

    # -- the pump: actor events -> buffer + summary ----------------------------------------------
    def _pump(self, active: ActiveJob) -> None:
        ray = self.ray()
        cursor = 0
        pending_poll = None
        error = ""
        while not active.ended:
            finished = bool(ray.wait([active.run_ref], timeout=0)[0])
            if pending_poll is None:
                pending_poll = active.actor.poll.remote(cursor)
            ready, _ = ray.wait([pending_poll], timeout=1.0)
            if not ready:
                continue  # the actor is still pending (queued for resources)
            try:
                lines, cursor, children = ray.get(pending_poll)
            except Exception as exc:  # the runner died (OOM, node lost, killed)
                error = f"job runner died: {type(exc).__name__}: {exc}"
                break
            finally:
                pending_poll = None
            self._observe(active, lines, children)
            if finished:
                break
            time.sleep(self.poll_interval_s)
        self._finish(active, error)

    def _observe(self, active: ActiveJob, lines: list[str], children: list[str]) -> None:
        with active.lock:
            if active.ended:
                return
            for line in lines:
                event = parse_line(line)
                if event is None:
                    continue
                active.buffer.append(event)
                if isinstance(event, JobEvent):
                    active.meta = StudioJobMeta.model_validate(
                        {**active.meta.model_dump(), **event.job.model_dump()}
                    )
                elif event.type == "progress":
                    active.meta.done, active.meta.total = event.done, event.total
                    active.meta.failed = event.failed
                    active.meta.phase = event.phase or active.meta.phase
                    active.meta.current_sample_id = event.current_sample_id
            if children and children != active.meta.child_job_ids:
                active.meta.child_job_ids = list(children)
                self._persist(active)  # so a restart can end the stage's own record too

    def _finish(self, active: ActiveJob, error: str) -> None:
        final: JobSummary | None = None
        if not error:
            try:
                final = JobSummary.model_validate(self.ray().get(active.run_ref))
            except Exception as exc:
                error = f"job runner died: {type(exc).__name__}: {exc}"
        # A runner killed from elsewhere (`hotstep-ray jobs cancel`) is not a crash: that
        # process records the end in storage, maybe a moment after the kill.
        stored = self._ended_elsewhere(active.meta.id) if error else None
        with active.lock:
            if active.ended:
                return
            if final is not None:
                active.meta = StudioJobMeta.model_validate(
                    {**active.meta.model_dump(), **final.model_dump()}
                )
            if stored is not None:
                active.meta = stored
                active.buffer.append(JobEvent(job=active.summary))
                active.buffer.append(StatusEvent(status=stored.status, error=stored.error))
            elif error or active.meta.status not in TERMINAL_JOB_STATUSES:
                self._end_active(active, "failed", error or "job runner stopped")
            active.ended = True
            self._persist(active)
        self._release(active)
        self._forget_old()

    def _ended_elsewhere(self, job_id: str, grace_s: float = 2.0) -> StudioJobMeta | None:
        deadline = time.monotonic() + grace_s
        while True:
            stored = read_meta(self.storage, job_id)
            if stored is not None and stored.status in TERMINAL_JOB_STATUSES:
                return stored
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.2)

    def _end_active(self, active: ActiveJob, status: str, error: str) -> None:
        """(lock held) End the job in storage and in the live stream."""
        active.meta = end_stored_job(self.storage, active.meta, status, error)
        active.buffer.append(JobEvent(job=active.summary))
        active.buffer.append(StatusEvent(status=status, error=error))  # type: ignore[arg-type]

    def _forget_old(self) -> None:
        with self._lock:
            ended = [job_id for job_id, active in self._jobs.items() if active.ended]
            for job_id in ended[:-KEEP_ENDED_IN_MEMORY]:  # dicts keep submission order
                del self._jobs[job_id]

    def _release(self, active: ActiveJob) -> None:
        if active.actor is not None and self._ray is not None:
            try:
                self._ray.kill(active.actor, no_restart=True)  # detached: not freed on its own
            except Exception:
                log.debug("runner of %s already gone", active.meta.id, exc_info=True)
                return
            if holds_placement_groups(active.meta.kind):  # off the request's thread: the
                # groups are orphaned only once the controller has died too
                threading.Thread(target=free_placement_groups, name="free-pgs", daemon=True).start()

    def _persist(self, active: ActiveJob) -> None:
        self.storage.write_json(meta_key(active.meta.id), active.meta.to_json_dict())

    # -- cancel / shutdown -----------------------------------------------------------------------
    def cancel(self, job_id: str, reason: str = "cancelled by user") -> JobSummary:
        with self._lock:
            active = self._jobs.get(job_id)
        if active is None:
            return cancel_stored_job(self.storage, self.ray, job_id)
        with active.lock:
            if active.ended or active.meta.status in TERMINAL_JOB_STATUSES:
                return active.summary
            active.ended = True  # the pump stops; the runner's death is no longer news
            self._release(active)
            self._end_active(active, "cancelled", reason)
            self._persist(active)
            summary = active.summary
        self._forget_old()
        return summary

    def shutdown(self) -> None:
        """End every live job (the server is going away; their runners go with it)."""
        with self._lock:
            live = [job_id for job_id, active in self._jobs.items() if not active.ended]
        for job_id in live:
            try:
                self.cancel(job_id, reason="server stopped")
            except Exception:
                log.warning("could not stop job %s", job_id, exc_info=True)
