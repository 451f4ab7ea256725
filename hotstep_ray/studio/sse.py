"""The per-job replay buffer behind the SSE stream, and the SSE frame encoding.

A client that connects (or reconnects: browsers' EventSource retries on its own) first gets the
whole buffer, then every new event. The buffer is capped (2000 events, as the seed studio) and
evicts by value to a client, oldest first within a type:

- `log`, then `progress`, then `job`, then `metric` are evicted when over the cap;
- `sample` and `status` are never evicted: a reconnecting UI must see every sample's latest state
  and the terminal status, or its table and its "done" badge would be wrong. `sample` events are
  de-duplicated per sample id instead (the latest wins), which bounds them by the dataset size.

Every event gets a sequence number, so a streaming reader asks for "what came after N" without
re-sending what it already has. Thread-safe: the job pump appends from a thread while SSE
handlers read from the event loop.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Iterable
from typing import Any

from hotstep_ray.core.events import parse_line, to_line

REPLAY_CAP = 2000
EVICTION_ORDER: tuple[str, ...] = ("log", "progress", "job", "metric")
NEVER_EVICTED: frozenset[str] = frozenset({"sample", "status"})
# Frame headers: no caching, no proxy buffering (nginx holds SSE frames back without it).
SSE_HEADERS = {
    "Cache-Control": "no-cache",
    "Connection": "keep-alive",
    "X-Accel-Buffering": "no",
}


# An SSE comment line, which clients ignore: sent after this long without a frame, so a proxy's
# idle timeout (commonly 30-60 s) does not cut a stream while a stage works silently (loading
# models before its first progress event).
SSE_KEEPALIVE_S = 15.0
KEEPALIVE_FRAME = ": keep-alive\n\n"


def sse_frame(event: Any) -> str:
    """One unnamed SSE frame (`data: <json>\\n\\n`), the seed's framing: no `event:`/`id:`."""
    line = event if isinstance(event, str) else to_line(event)
    return f"data: {line}\n\n"


def event_type(event: Any) -> str:
    return getattr(event, "type", "") or ""


class ReplayBuffer:
    """Ordered, capped event buffer with the eviction policy in the module docstring."""

    def __init__(self, cap: int = REPLAY_CAP) -> None:
        if cap < 1:
            raise ValueError("cap must be at least 1")
        self.cap = cap
        self._lock = threading.Lock()
        self._events: dict[int, Any] = {}  # seq -> event; insertion order == seq order
        self._by_type: dict[str, deque[int]] = {kind: deque() for kind in EVICTION_ORDER}
        self._sample_seq: dict[str, int] = {}
        self._next_seq = 1
        self.evicted = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._events)

    @property
    def last_seq(self) -> int:
        with self._lock:
            return self._next_seq - 1

    def append(self, event: Any) -> int:
        """Add an event; returns its sequence number."""
        with self._lock:
            seq = self._next_seq
            self._next_seq += 1
            kind = event_type(event)
            if kind == "sample":
                old = self._sample_seq.get(event.sample_id)
                if old is not None:
                    self._events.pop(old, None)
                self._sample_seq[event.sample_id] = seq
            self._events[seq] = event
            if kind in self._by_type:
                self._by_type[kind].append(seq)
            elif kind not in NEVER_EVICTED:
                # An unknown type (a newer writer) is treated like a log line: cheapest to lose.
                self._by_type["log"].append(seq)
            self._evict()
            return seq

    def extend(self, events: Iterable[Any]) -> None:
        for event in events:
            self.append(event)

    def _evict(self) -> None:
        while len(self._events) > self.cap:
            if not self._evict_one():
                return  # only never-evicted events left: the cap yields to them

    def _evict_one(self) -> bool:
        for kind in EVICTION_ORDER:
            queue = self._by_type[kind]
            while queue:
                seq = queue.popleft()
                if self._events.pop(seq, None) is not None:
                    self.evicted += 1
                    return True
        return False

    def snapshot(self) -> tuple[list[Any], int]:
        """(every retained event in order, the last sequence number)."""
        with self._lock:
            return list(self._events.values()), self._next_seq - 1

    def since(self, seq: int) -> tuple[list[Any], int]:
        """(retained events newer than `seq`, the last sequence number)."""
        with self._lock:
            if seq >= self._next_seq - 1:
                return [], self._next_seq - 1
            return [e for s, e in self._events.items() if s > seq], self._next_seq - 1

    def has_type(self, kind: str) -> bool:
        with self._lock:
            return any(event_type(e) == kind for e in self._events.values())

    def terminal(self) -> bool:
        return self.has_type("status")


def buffer_from_jsonl(text: str, cap: int = REPLAY_CAP) -> ReplayBuffer:
    """A buffer replaying a stored `events.jsonl` (a job this server does not run)."""
    buffer = ReplayBuffer(cap)
    for line in text.splitlines():
        try:
            event = parse_line(line)
        except (ValueError, json.JSONDecodeError):
            continue  # a torn last line of a log still being written
        if event is not None:
            buffer.append(event)
    return buffer
