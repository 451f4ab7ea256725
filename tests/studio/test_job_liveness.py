"""A job killed without ending its record (SIGKILL, a lost node) reads "running" in `job.json`
forever; its heartbeat (`core.jobs.Heartbeat`, which every `Job` runs) tells: `jobs list` shows
it lost once its process is gone from this machine or its heartbeat is stale. No Ray: the records
are written here."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from typer.testing import CliRunner

from hotstep_ray.cli.studio_cmd import jobs_app
from hotstep_ray.core import jobs
from hotstep_ray.core.events import now_ms
from hotstep_ray.core.jobs import Heartbeat, Job, heartbeat_key
from hotstep_ray.core.storage import Storage
from hotstep_ray.studio.records import list_stored, read_summary


def _running(storage: Storage, job_id: str) -> Job:
    job = Job(storage, "train-dit", dataset_id="band", job_id=job_id)
    job.set_status("running")  # as a process killed mid-run leaves it: never ended
    return job


def _gone_pid() -> int:
    """The id of a process of this machine that has exited (and been reaped)."""
    code = "import os; print(os.getpid())"
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return int(done.stdout)


def test_a_killed_jobs_record_reads_lost_and_a_live_one_running(tmp_path) -> None:
    storage = Storage(tmp_path)
    for job_id in ("killed", "stale", "alive", "remote", "old"):
        _running(storage, job_id)
    with Heartbeat(storage, "alive"):  # this process: alive
        pass
    beat = json.loads(storage.read_text(heartbeat_key("alive")))
    storage.write_json(heartbeat_key("killed"), {**beat, "pid": _gone_pid()})
    stale_at = now_ms() - int(jobs.LOST_AFTER_S * 1000) - 1000
    other = {**beat, "host": "elsewhere", "pid": 1}
    storage.write_json(heartbeat_key("stale"), {**other, "beat_at": stale_at})
    storage.write_json(heartbeat_key("remote"), {**other, "beat_at": now_ms()})
    ended = _running(storage, "ended")
    storage.write_json(heartbeat_key("ended"), {**beat, "pid": _gone_pid()})
    ended.set_status("done")  # ended its own record: its word stands
    # "old": no heartbeat (a record from before them, or a studio job): as recorded

    shown = {job.id: job for job in list_stored(storage)}
    assert {i: j.status for i, j in shown.items()} == {
        "killed": "failed",
        "stale": "failed",
        "alive": "running",
        "remote": "running",  # another machine's process, heard from recently
        "ended": "done",
        "old": "running",
    }
    assert shown["killed"].error.startswith("lost: its process")
    assert shown["stale"].error.startswith("lost: no heartbeat from process 1 on elsewhere")
    assert shown["killed"].finished_at == beat["beat_at"]  # its last sign of life
    assert read_summary(storage, "killed").status == "failed"  # `jobs show` says the same
    table = CliRunner().invoke(jobs_app, ["list", "--data", str(tmp_path)], terminal_width=200)
    assert table.exit_code == 0, table.output
    rows = {line.split("│")[1].strip(): line for line in table.output.splitlines() if "│" in line}
    assert "lost" in rows["killed"] and "running" in rows["alive"]


def test_the_heartbeat_is_rewritten_while_the_block_runs(tmp_path) -> None:
    storage = Storage(tmp_path)
    _running(storage, "j1")
    with Heartbeat(storage, "j1", every_s=0.01) as heartbeat:
        first = json.loads(storage.read_text(heartbeat.key))["beat_at"]
        time.sleep(0.2)
        later = json.loads(storage.read_text(heartbeat.key))["beat_at"]
    assert later > first


def test_jobs_list_shows_a_killed_job_of_any_kind_lost(tmp_path) -> None:
    """Not only train-dit: a label job beats from `Job.__enter__`, so its killed run (its
    process gone, its record left running) is listed lost, and a stage job another node runs
    (heard from recently) running."""
    storage = Storage(tmp_path)
    with Job(storage, "label", dataset_id="band", job_id="labeled"):
        beat = json.loads(storage.read_text(heartbeat_key("labeled")))
    _running(storage, "labeled")  # as a kill leaves it: the record says running
    storage.write_json(heartbeat_key("labeled"), {**beat, "pid": _gone_pid()})
    stage = Job(storage, "preprocess", dataset_id="band", job_id="staged")
    stage.set_status("running")
    storage.write_json(
        heartbeat_key("staged"), {**beat, "host": "ray-worker-3", "pid": _gone_pid()}
    )
    table = CliRunner().invoke(jobs_app, ["list", "--data", str(tmp_path)], terminal_width=200)
    assert table.exit_code == 0, table.output
    rows = {line.split("│")[1].strip(): line for line in table.output.splitlines() if "│" in line}
    assert "lost" in rows["labeled"] and "label" in rows["labeled"]
    assert "running" in rows["staged"] and "lost" not in rows["staged"]
