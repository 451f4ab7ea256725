"""A studio app served for real on 127.0.0.1 (uvicorn in a thread, an OS-chosen port), and a
small JSON client over urllib: the browser and load tests talk HTTP, not ASGI calls."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import uvicorn
from fastapi import FastAPI


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
