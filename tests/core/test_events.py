"""Events: JSONL round trip, unknown kinds ignored by readers, sinks never kill a job."""

from __future__ import annotations

import json

import pytest

from hotstep_ray.core.events import (
    EventLog,
    LogEvent,
    MetricEvent,
    ProgressEvent,
    StatusEvent,
    child_sink,
    parse_line,
    read_lines,
    to_line,
)


def test_events_round_trip_one_per_line():
    events = [
        ProgressEvent(done=3, total=10, phase="probe", current_sample_id="abc"),
        LogEvent(level="warn", message="only 3 samples", ts=1),
        MetricEvent(metric="step", step=5, loss=0.25, lr=1e-4, ts=2, crop=750),
        StatusEvent(status="done"),
    ]
    lines = [to_line(e) for e in events]
    assert all("\n" not in line for line in lines)
    assert json.loads(lines[0]) == {
        "type": "progress",
        "done": 3,
        "total": 10,
        "failed": 0,
        "phase": "probe",
        "currentSampleId": "abc",
    }
    back = list(read_lines(lines))
    assert [type(e) for e in back] == [type(e) for e in events]
    assert back[2].loss == 0.25 and back[2].model_extra == {"crop": 750}


def test_readers_skip_unknown_types_and_metric_kinds():
    lines = [
        '{"type":"metric","metric":"gpu-temperature","ts":1,"celsius":70}',
        '{"type":"telemetry","x":1}',
        "",
        '{"type":"metric","metric":"vram","ts":1,"usedMb":1024}',
    ]
    events = list(read_lines(lines))
    assert len(events) == 1 and events[0].metric == "vram"
    assert parse_line("   ") is None
    with pytest.raises(ValueError, match="malformed progress"):
        parse_line('{"type":"progress","done":"many"}')


def test_a_broken_sink_is_dropped_and_the_others_still_receive():
    got = []

    def broken(event):
        raise RuntimeError("terminal closed")

    log = EventLog(broken, got.append)
    log.log("one")
    log.log("two")
    assert [e.message for e in got] == ["one", "two"]
    assert len(log.errors) == 1 and "terminal closed" in log.errors[0]


def test_child_sink_keeps_sub_job_status_out_of_the_parent_stream():
    got = []
    parent = EventLog(got.append)
    forward = child_sink(parent)
    forward(LogEvent(message="child says hi", ts=1))
    forward(StatusEvent(status="done"))
    assert [e.type for e in got] == ["log"]


def test_follow_jsonl_forwards_whole_lines_once_and_drains_at_the_end(tmp_path):
    from hotstep_ray.core.events import FollowJsonl, LogEvent, to_line
    from hotstep_ray.core.storage import Storage

    storage = Storage(tmp_path)
    seen = []
    first, second = to_line(LogEvent(message="one")), to_line(LogEvent(message="two"))
    with FollowJsonl(storage, "e.jsonl", seen.append, every_s=60) as follow:  # no tick: explicit
        storage.write_text("e.jsonl", first + "\n" + second[:10])  # the second is half-written
        follow._drain()
        assert [e.message for e in seen] == ["one"]
        storage.write_text("e.jsonl", first + "\n" + second + "\n")
    assert [e.message for e in seen] == ["one", "two"]  # each once, the last by the final read
