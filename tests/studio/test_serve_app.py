"""The studio on Ray Serve (serve.py): the same app, built in the replica, on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import urllib.request

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _call(url: str, body: dict | None = None, token: str = "") -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_studio_runs_on_serve(ray_session, tmp_path, songs):
    from ray import serve

    from hotstep_ray.studio.serve import build_app

    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        app = build_app(
            {"data": str(tmp_path / "data"), "roots": str(songs.parent), "token": "t0k"}
        )
        serve.run(app, name="studio", route_prefix="/")
        base = f"http://127.0.0.1:{port}"
        assert _call(f"{base}/api/health") == (200, {"ok": True, "authorized": False})
        status, body = _call(f"{base}/api/health", token="t0k")
        assert status == 200 and body["authorized"]
        status, body = _call(
            f"{base}/api/training/datasets", {"sourceDir": str(songs)}, token="t0k"
        )
        assert status == 201 and body["dataset"]["sampleCount"] == 12
        status, body = _call(f"{base}/api/training/datasets", token="t0k")
        assert [d["slug"] for d in body["datasets"]] == ["songs"]
    finally:
        serve.shutdown()
