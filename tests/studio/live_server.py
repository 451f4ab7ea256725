"""A studio app served for real on 127.0.0.1 (uvicorn in a thread, an OS-chosen port), and a
small JSON client over urllib: the browser and load tests talk HTTP, not ASGI calls; and the
whole-pipeline run the end-to-end and browser tests share (conftest.py's `studio_pipeline`).
Test modules import these from here: `from conftest import ...` takes whichever folder's
conftest Python imported first."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI

API = "/api/training"


class LiveServer:
    """`with LiveServer(app) as server: server.url` — stopped (and the app's lifespan ended) on
    exit."""

    def __init__(self, app: FastAPI, start_timeout_s: float = 20.0) -> None:
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.timeout_s = start_timeout_s
        self.thread = threading.Thread(target=self.server.run, name="studio-http", daemon=True)
        self.url = ""

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + self.timeout_s
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the studio server did not start")
            time.sleep(0.05)
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def http_json(
    method: str, url: str, body: Any = None, token: str = "", timeout_s: float = 30.0
) -> tuple[int, Any]:
    """(status, parsed JSON body) of one request; error statuses are returned, not raised."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    return status, json.loads(raw) if raw else None


def read_sse(url: str, token: str = "", timeout_s: float = 120.0) -> list[dict[str, Any]]:
    """Every `data:` frame of an SSE response until the server closes it."""
    request = urllib.request.Request(url, headers={"Accept": "text/event-stream"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    frames = []
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        for raw in response:
            line = raw.decode().rstrip("\n")
            if line.startswith("data: "):
                frames.append(json.loads(line[len("data: ") :]))
    return frames


# -- a real server over the whole pipeline (the end-to-end and browser tests share it) ---------
PIPELINE_TOKEN = "pipeline-s3cret"
PIPELINE_SONGS = ("01_morning_drive", "05_untitled")  # a sidecar caption, and none (labeled)
# Every stage sized for seconds on 2 CPU cores: 2 s cuts, a tiny LoKR, one step per epoch.
PIPELINE_OPTIONS: dict[str, dict[str, Any]] = {
    "label": {"scope": "all", "useGenius": False, "caption": {"provider": "offline"}},
    "preprocess": {"maxDurationS": 2.0},
    "train-dit": {
        "adapterType": "lokr",
        "lokrDim": 8,
        "lokrAlpha": 8,
        "cropFrames": 48,
        "batch": 2,
        "gradAccum": 1,
        "epochs": 4,
        "targetLoss": 0,
        "milestoneStep": 0,
        "checkpointSegments": 0,
        "initAdapter": "",
    },
    "audition": {"duration": 2.0, "seed": 7},
}


@dataclass
class PipelineRun:
    """One kind's job: the 202 answer, the polled summaries, the SSE frames, the result."""

    job_id: str
    accepted: dict[str, Any]
    polled: list[dict[str, Any]]
    frames: list[dict[str, Any]]
    result: Any


@dataclass
class Pipeline:
    url: str
    token: str
    root: Path
    dataset: dict[str, Any]
    runs: dict[str, PipelineRun] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)


def run_kind(
    pipeline: Pipeline, kind: str, options: dict[str, Any] | None = None, timeout_s: float = 180.0
) -> PipelineRun:
    """Start one job over HTTP (default options: `PIPELINE_OPTIONS`), poll it to its end, replay
    its events and fetch its result."""
    base, token = f"{pipeline.url}{API}", pipeline.token
    started = time.monotonic()
    body = PIPELINE_OPTIONS[kind] if options is None else options
    status, accepted = http_json(
        "POST", f"{base}/datasets/{pipeline.dataset['slug']}/{kind}", body, token
    )
    assert status == 202, (kind, status, accepted)
    job_id = accepted["jobId"]
    polled = []
    while True:  # the REST way: poll the job until it ends
        status, job = http_json("GET", f"{base}/jobs/{job_id}", token=token)
        assert status == 200
        polled.append(job)
        if job["status"] in ("done", "failed", "cancelled"):
            break
        assert time.monotonic() - started < timeout_s, f"{kind} still {job['status']}"
        time.sleep(0.25)
    frames = read_sse(f"{base}/jobs/{job_id}/events", token)  # the replay of the ended job
    assert job["status"] == "done", (kind, job["error"], frames[-5:])
    status, result = http_json("GET", f"{base}/jobs/{job_id}/result", token=token)
    pipeline.seconds[kind] = time.monotonic() - started
    return PipelineRun(job_id, accepted, polled, frames, result if status == 200 else None)
