"""Job records: `jobs/<id>/job.json` (the summary) and `jobs/<id>/events.jsonl` (every event).

A `Job` is a context manager around one stage run. It writes the record when it starts, streams
events to the JSONL log (and any extra sink, e.g. the CLI), keeps the summary's counters and phase in
step with progress events, and always ends with a terminal `status` event — `failed` with the
error when the body raises, so a crashed run is never left looking "running".

While it runs, `job.json` follows the run: rewritten at each new phase and at most every
`PROGRESS_SAVE_S` for the counters, so a run that is killed (a studio job cancelled with
`ray.kill`, a lost node) leaves a record of how far it got. A record another process ended (the
studio's or `jobs cancel`'s `cancelled`) is not overwritten by a runner that is still dying.

While it runs, `jobs/<id>/heartbeat.json` names the process running it (host, boot id, pid
namespace, pid) and says when it last ran (`Heartbeat`, started and stopped by the context
manager, whatever the job kind). A killed process cannot end its own record, so a reader takes an
unended record through its heartbeat (`lost_reason`, `with_liveness`): it is shown `failed`, its
error starting with "lost:", once its process is gone from the reader's machine or its heartbeat
is older than `LOST_AFTER_S`. That is how it reads, not a rewrite of the record: a process that
was only slow to beat still ends its own record.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path
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
HEARTBEAT_EVERY_S = 15.0  # a running job's process rewrites its heartbeat this often
# A heartbeat older than this means its process is gone (seconds, by the reader's clock against
# the writer's: generous, so clock skew between machines and slow object stores stay below it).
LOST_AFTER_S = 120.0
LOST = "lost"  # the error prefix of a job whose process is gone
# How long a job's end waits for a beat in flight (a slow object store): the thread is a daemon,
# and a beat that lands after the record ended changes nothing a reader shows.
_HEARTBEAT_JOIN_S = 5.0


def heartbeat_key(job_id: str) -> str:
    return f"{layout.job_dir(job_id)}/heartbeat.json"


def _read_proc(path: str, link: bool = False) -> str:
    try:
        return os.readlink(path) if link else Path(path).read_text().strip()
    except OSError:  # not Linux, or /proc hidden
        return ""


def _this_machine() -> dict[str, str]:
    """Who may judge a pid: a host name alone may repeat across machines (the boot id tells them
    apart) and a container sharing the host's name and kernel numbers its own processes (its pid
    namespace tells it apart)."""
    return {
        "host": socket.gethostname(),
        "boot_id": _read_proc("/proc/sys/kernel/random/boot_id"),
        "pid_ns": _read_proc("/proc/self/ns/pid", link=True),
    }


class Heartbeat:
    """While it runs, `jobs/<id>/heartbeat.json` names this process (host, boot id, pid namespace,
    pid) and says when it last ran (`beat_at`, epoch ms), rewritten every `every_s` seconds by a
    daemon thread through the job's storage (so an object store root has one too). Nothing here
    raises into the job: a failed write or a thread that cannot start is logged, no more."""

    def __init__(self, storage: Storage, job_id: str, every_s: float | None = None) -> None:
        self.storage, self.key = storage, heartbeat_key(job_id)
        self.every_s = HEARTBEAT_EVERY_S if every_s is None else every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat:{job_id}", daemon=True)

    def beat(self) -> None:
        try:
            record = {**_this_machine(), "pid": os.getpid(), "beat_at": now_ms()}
            record["every_s"] = self.every_s
            self.storage.write_json(self.key, record)
        # any store's error (an object store's client raises its own kinds): the job matters more
        except Exception as exc:
            log.warning("could not write %s: %s", self.key, exc)

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.beat()

    def start(self) -> Heartbeat:
        self.beat()
        try:
            self._thread.start()
        except RuntimeError as exc:  # no thread to be had: the job runs without later beats
            log.warning("no heartbeat thread for %s: %s", self.key, exc)
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(_HEARTBEAT_JOIN_S)

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


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
        self._heartbeat: Heartbeat | None = None

    @property
    def id(self) -> str:
        return self.summary.id

    def __getstate__(self) -> dict:
        # A running job may be shipped to another process (Ray pickles what a task closes over,
        # and the event log holds this job's `_track`): the copy goes without the heartbeat,
        # whose thread cannot travel and whose beats belong to the process that entered the job.
        return {**self.__dict__, "_heartbeat": None}

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
        if self._heartbeat is None:
            self._heartbeat = Heartbeat(self.storage, self.id).start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
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
        finally:  # after the terminal record: beats until then keep an ending job from reading lost
            if self._heartbeat is not None:
                self._heartbeat.stop()
                self._heartbeat = None


def load_job(storage: Storage, job_id: str) -> JobSummary:
    return JobSummary.model_validate(storage.read_json(layout.job_record(job_id)))


def read_job_events(storage: Storage, job_id: str):
    text = storage.read_text(layout.job_events(job_id))
    return list(read_lines(text.splitlines()))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


def _read_heartbeat(storage: Storage, job_id: str) -> dict | None:
    key = heartbeat_key(job_id)
    try:
        beat = storage.read_json(key) if storage.exists(key) else None
    except (HotstepError, ValueError, OSError):
        return None
    if not isinstance(beat, dict):
        return None
    at = beat.get("beat_at")
    if isinstance(at, bool) or not isinstance(at, int | float) or not at:
        return None
    return beat


def lost_reason(storage: Storage, summary: JobSummary, now: int | None = None) -> str:
    """Why an unended job's process is gone ("" = alive, ended, or no heartbeat to judge by).

    The pid is asked only on the machine (host, boot id, pid namespace) that wrote the heartbeat:
    a record written by a Ray worker or runner actor elsewhere is judged by its heartbeat's age.
    """
    if summary.status in TERMINAL_JOB_STATUSES:
        return ""
    beat = _read_heartbeat(storage, summary.id)
    if beat is None:
        return ""
    age_s = ((now_ms() if now is None else now) - int(beat["beat_at"])) / 1000
    here = _this_machine()
    same_machine = all(beat.get(name, "") == value for name, value in here.items())
    try:
        pid = int(beat.get("pid") or 0)
        every_s = float(beat.get("every_s") or 0)
    except (TypeError, ValueError):
        pid, every_s = 0, 0.0
    if same_machine and pid > 0 and not _pid_alive(pid):
        return f"{LOST}: its process {pid} on {here['host']} is gone ({age_s:.0f} s since it ran)"
    # a writer that beats less often than the default is given four of its own intervals
    if age_s > max(LOST_AFTER_S, 4 * every_s):
        where = f"process {pid} on {beat.get('host')}"
        return f"{LOST}: no heartbeat from {where} for {age_s:.0f} s"
    return ""


def with_liveness(storage: Storage, summary: JobSummary) -> JobSummary:
    """`summary`, shown `failed` ("lost: ...") when its process is gone (`lost_reason`), ended at
    its last sign of life."""
    reason = lost_reason(storage, summary)
    if not reason:
        return summary
    beat = _read_heartbeat(storage, summary.id)
    if beat is not None:
        with contextlib.suppress(TypeError, ValueError):
            summary = summary.model_copy(update={"finished_at": int(beat["beat_at"])})
    return summary.model_copy(update={"status": "failed", "error": reason})
