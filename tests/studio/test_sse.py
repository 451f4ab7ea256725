"""The SSE replay buffer: cap 2000, eviction order log → progress → job → metric, `sample` and
`status` never evicted (samples de-duplicated instead), and the frame format."""

from __future__ import annotations

import json

from hotstep_ray.core.contracts import JobSummary
from hotstep_ray.core.events import (
    JobEvent,
    LogEvent,
    MetricEvent,
    ProgressEvent,
    SampleEvent,
    StatusEvent,
    to_line,
)
from hotstep_ray.studio.sse import REPLAY_CAP, ReplayBuffer, buffer_from_jsonl, sse_frame


def _types(events) -> list[str]:
    return [e.type for e in events]


def test_cap_is_2000_and_logs_go_first_oldest_first():
    buffer = ReplayBuffer()
    assert buffer.cap == REPLAY_CAP == 2000
    buffer.append(ProgressEvent(done=0, total=10))
    for i in range(2100):
        buffer.append(LogEvent(message=f"line {i}"))
    events, last = buffer.snapshot()
    assert len(events) == 2000 and last == 2101
    assert events[0].type == "progress"  # older than every log, yet kept: logs go first
    logs = [e.message for e in events if e.type == "log"]
    assert logs[0] == "line 101" and logs[-1] == "line 2099"  # the oldest logs went
    assert buffer.evicted == 101


def test_eviction_order_then_never_sample_or_status():
    buffer = ReplayBuffer(cap=5)
    job = JobSummary(id="j1", kind="build")
    buffer.append(MetricEvent(metric="step", loss=1.0))
    buffer.append(JobEvent(job=job))
    buffer.append(ProgressEvent(done=1, total=2))
    buffer.append(LogEvent(message="a"))
    buffer.append(SampleEvent(sample_id="s1", status="labeled"))
    assert _types(buffer.snapshot()[0]) == ["metric", "job", "progress", "log", "sample"]
    buffer.append(SampleEvent(sample_id="s2", status="labeled"))  # evicts the log
    assert _types(buffer.snapshot()[0]) == ["metric", "job", "progress", "sample", "sample"]
    buffer.append(SampleEvent(sample_id="s3", status="error"))  # then progress
    buffer.append(SampleEvent(sample_id="s4", status="labeled"))  # then job
    buffer.append(StatusEvent(status="done"))  # then metric
    assert _types(buffer.snapshot()[0]) == ["sample"] * 4 + ["status"]
    # Nothing evictable is left: the cap yields rather than drop a sample or the status.
    buffer.append(SampleEvent(sample_id="s5", status="labeled"))
    events = buffer.snapshot()[0]
    assert len(events) == 6 and _types(events).count("sample") == 5
    assert buffer.terminal()


def test_sample_events_are_deduplicated_latest_wins():
    buffer = ReplayBuffer()
    buffer.append(SampleEvent(sample_id="s1", status="processing"))
    buffer.append(LogEvent(message="x"))
    buffer.append(SampleEvent(sample_id="s1", status="labeled"))
    events = buffer.snapshot()[0]
    assert _types(events) == ["log", "sample"] and events[1].status == "labeled"


def test_since_returns_only_newer_retained_events():
    buffer = ReplayBuffer()
    buffer.append(LogEvent(message="a"))
    seq = buffer.append(LogEvent(message="b"))
    buffer.append(LogEvent(message="c"))
    newer, last = buffer.since(seq)
    assert [e.message for e in newer] == ["c"] and last == 3
    assert buffer.since(last) == ([], 3)


def test_frames_and_jsonl_replay():
    frame = sse_frame(StatusEvent(status="failed", error="boom"))
    assert frame.startswith("data: ") and frame.endswith("\n\n")
    assert json.loads(frame[6:]) == {"type": "status", "status": "failed", "error": "boom"}
    lines = [to_line(LogEvent(message=str(i))) for i in range(2500)]
    lines += [to_line(SampleEvent(sample_id=f"s{i}", status="labeled")) for i in range(3)]
    lines += [to_line(StatusEvent(status="done")), '{"type":"log","mess']  # a torn last line
    buffer = buffer_from_jsonl("\n".join(lines))
    events = buffer.snapshot()[0]
    assert len(events) == 2000 and _types(events).count("sample") == 3 and buffer.terminal()


def test_a_quiet_stream_gets_keep_alive_comments(make_client):
    """A job that says nothing for a while (a stage loading its models) still sends a comment
    line every `sse_keepalive_s`, so a proxy's idle timeout does not cut the stream; the
    frames after it arrive as usual."""
    import threading

    from hotstep_ray.core.jobs import Job
    from hotstep_ray.studio.app import storage_of
    from hotstep_ray.studio.config import StudioConfig

    assert StudioConfig(data="x").sse_keepalive_s == 15.0
    client = make_client(sse_keepalive_s=0.05)
    job = Job(storage_of(client.app), "build")  # a CLI job, still running: the stream tails it
    job.__enter__()
    ender = threading.Timer(0.8, job.__exit__, (None, None, None))
    ender.start()
    lines = []
    with client.stream("GET", f"/api/training/jobs/{job.id}/events") as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line]
    ender.join()
    assert lines.count(": keep-alive") >= 3, lines
    frames = [json.loads(line[len("data: ") :]) for line in lines if line.startswith("data: ")]
    assert frames[0]["type"] == "job"
    assert (frames[-1]["type"], frames[-1]["status"]) == ("status", "done")
    assert set(lines) <= {": keep-alive"} | {line for line in lines if line.startswith("data: ")}
