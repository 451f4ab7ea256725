"""The event stream: one typed union, one JSON object per line (JSONL).

Every stage reports through these events; CLI progress, the per-job `events.jsonl` and the HTTP SSE
stream all consume the same objects. Readers ignore what they do not know: an unknown `type`, or a
`metric` kind outside `METRIC_KINDS`, is skipped, so newer writers never break older readers.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.alias_generators import to_camel

from hotstep_ray.core.contracts import (
    Contract,
    JobStatus,
    JobSummary,
    Sample,
    SampleLabelStatus,
)

METRIC_KINDS: frozenset[str] = frozenset({"vram", "data", "step", "epoch", "milestone", "eval"})


def now_ms() -> int:
    return int(time.time() * 1000)


class _Event(Contract):
    # Extra keys are kept (metric events carry open-ended fields) and never rejected on read.
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")


class JobEvent(_Event):
    type: Literal["job"] = "job"
    job: JobSummary


class ProgressEvent(_Event):
    type: Literal["progress"] = "progress"
    done: int
    total: int
    failed: int = 0
    phase: str = ""
    current_sample_id: str = ""


class SampleEvent(_Event):
    type: Literal["sample"] = "sample"
    sample_id: str
    status: SampleLabelStatus
    sample: Sample | None = None
    error: str = ""


class LogEvent(_Event):
    type: Literal["log"] = "log"
    level: Literal["info", "warn", "error"] = "info"
    message: str
    ts: int = Field(default_factory=now_ms)


class StatusEvent(_Event):
    """Terminal: the stream ends after it."""

    type: Literal["status"] = "status"
    status: JobStatus
    error: str = ""


class MetricEvent(_Event):
    """A measurement. Known kinds are `METRIC_KINDS`; the optional fields below are the common
    ones (units in the names where they are not obvious); any other key is carried as extra."""

    type: Literal["metric"] = "metric"
    metric: str
    ts: int = Field(default_factory=now_ms)
    epoch: int | None = None
    epochs: int | None = None
    step: int | None = None
    total_steps: int | None = None
    loss: float | None = None
    lr: float | None = None
    grad_norm: float | None = None
    step_ms: float | None = None
    eta_ms: float | None = None
    path: str | None = None


Event = Annotated[
    JobEvent | ProgressEvent | SampleEvent | LogEvent | StatusEvent | MetricEvent,
    Field(discriminator="type"),
]
_EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)
_EVENT_TYPES = frozenset({"job", "progress", "sample", "log", "status", "metric"})


def to_line(event: _Event) -> str:
    """One compact JSON line, camelCase keys, no unset optional fields."""
    data = event.model_dump(mode="json", by_alias=True, exclude_none=True)
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def parse_line(line: str) -> _Event | None:
    """Parse one JSONL line; None for blank lines, unknown types and unknown metric kinds."""
    line = line.strip()
    if not line:
        return None
    data: Any = json.loads(line)
    if not isinstance(data, dict) or data.get("type") not in _EVENT_TYPES:
        return None
    if data["type"] == "metric" and data.get("metric") not in METRIC_KINDS:
        return None
    try:
        return _EVENT_ADAPTER.validate_python(data)
    except ValidationError as exc:
        raise ValueError(f"malformed {data['type']} event: {exc}") from exc


def read_lines(lines: Iterable[str]) -> Iterator[_Event]:
    for line in lines:
        event = parse_line(line)
        if event is not None:
            yield event


EventSink = Callable[[_Event], None]


class EventLog:
    """Fan-out for one job's events: every event goes to each sink (JSONL file, CLI, queue).
    A failing sink is dropped after its first error so a broken display never stops a job."""

    def __init__(self, *sinks: EventSink) -> None:
        self._sinks: list[EventSink] = list(sinks)
        self.errors: list[str] = []

    def add(self, sink: EventSink) -> None:
        self._sinks.append(sink)

    def emit(self, event: _Event) -> None:
        for sink in list(self._sinks):
            try:
                sink(event)
            except Exception as exc:  # a sink must never kill the job it reports on
                self.errors.append(f"{getattr(sink, '__name__', sink)!s}: {exc}")
                self._sinks.remove(sink)

    def log(self, message: str, level: Literal["info", "warn", "error"] = "info") -> None:
        self.emit(LogEvent(level=level, message=message))

    def progress(self, done: int, total: int, phase: str = "", failed: int = 0, current: str = ""):
        self.emit(
            ProgressEvent(
                done=done, total=total, failed=failed, phase=phase, current_sample_id=current
            )
        )


def child_sink(parent: EventLog, source: str = "") -> EventSink:
    """Forward a sub-job's events into a parent's log, minus its `job` and terminal `status`
    events: those belong to the sub-job's own record, and a reader of the parent stream stops at
    the first `status` it sees. With `source`, its log and metric events carry it as the extra key
    `source`, so a reader can tell apart the lines of sub-jobs that run at the same time."""

    def forward(event: _Event) -> None:
        if event.type in ("job", "status"):
            return
        if source and event.type in ("log", "metric"):
            event = type(event).model_validate({**event.model_dump(), "source": source})
        parent.emit(event)

    return forward


def jsonl_sink(storage, key: str) -> EventSink:
    """A sink that appends each event as one line to `key` in a Storage."""

    def write(event: _Event) -> None:
        storage.append_line(key, to_line(event))

    write.__name__ = f"jsonl:{key}"
    return write


class FollowJsonl:
    """Emit each event appended to a JSONL key into `sink` while a block runs (polling; one last
    read after the block, so nothing written before it ended is missed). `storage`: anything with
    `exists` and `read_text` (core.storage.Storage). Used to fold a stage's own event log (a Ray
    Train worker's, a sub-job's) into the job that started it."""

    def __init__(self, storage: Any, key: str, sink: EventSink, every_s: float = 0.5) -> None:
        self.storage, self.key, self.sink, self.every_s = storage, key, sink, every_s
        self._offset = 0  # characters of the file already forwarded (complete lines only)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"follow:{key}", daemon=True)

    def _drain(self) -> None:
        if not self.storage.exists(self.key):
            return
        text = self.storage.read_text(self.key)
        end = text.rfind("\n") + 1  # a line still being written waits for the next read
        for line in text[self._offset : end].splitlines():
            try:
                event = parse_line(line)
            except ValueError:
                continue
            if event is not None:
                self.sink(event)
        self._offset = max(self._offset, end)

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            with contextlib.suppress(OSError):  # a storage hiccup: the next tick retries
                self._drain()

    def __enter__(self) -> FollowJsonl:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._drain()
