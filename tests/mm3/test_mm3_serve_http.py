"""The MM3 audition app on Ray Serve over HTTP (tiny MM3, CPU; one Serve start for the module):
A/B with the same seed, base side equal to an adapterless request, previews, statuses."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
import requests
from mm3_helpers import write_lora

from hotstep_ray.core.storage import Storage

pytestmark = [pytest.mark.slow, pytest.mark.ray]
REPO = Path(__file__).resolve().parents[2]
TOKEN = "mm3-token"
BODY = {"caption": "Global Metadata: calm", "duration_s": 1.6, "steps": 2, "seed": 3}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def served(ray_session, mm3_checkpoints, tmp_path_factory):
    from ray import serve

    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from serve_apps.mm3_app import Mm3AppConfig, build_app

    data = tmp_path_factory.mktemp("data")
    run = write_lora(Storage(data), mm3_checkpoints)
    port = _free_port()
    config = Mm3AppConfig(
        checkpoints=str(mm3_checkpoints), data=str(data), device="cpu", replica_cpus=0, token=TOKEN
    )
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        serve.run(build_app(config), name="mm3", route_prefix="/")
        yield f"http://127.0.0.1:{port}", run
    finally:
        serve.shutdown()


def _post(url: str, body: dict) -> requests.Response:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    return requests.post(url + "/mm3/audition", json=body, headers=auth, timeout=300)


def _get(url: str, path: str) -> requests.Response:
    return requests.get(url + path, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)


def test_ab_over_http_keeps_the_base_side_of_an_adapterless_run(served):
    url, run = served
    assert requests.get(url + "/health", timeout=30).json() == {"status": "ok", "backend": "mm3"}
    assert requests.get(url + "/mm3/adapters", timeout=30).status_code == 401
    assert _get(url, "/mm3/adapters").json() == [{"id": run, "artist": "band"}]
    plain = _post(url, BODY)
    assert plain.status_code == 200, plain.text
    assert plain.json()["slots"] == ["base"] and plain.json()["adapter"] is None
    ab = _post(url, {**BODY, "adapter": "band"})
    assert ab.status_code == 200, ab.text
    meta = ab.json()
    assert meta["slots"] == ["adapter", "base"] and meta["adapter"].startswith(run)
    assert meta["sampleRateHz"] == 44_100 and meta["seed"] == 3
    base = _get(url, f"/mm3/previews/{meta['previewId']}/base")
    adapter = _get(url, f"/mm3/previews/{meta['previewId']}/adapter")
    before = _get(url, f"/mm3/previews/{plain.json()['previewId']}/base")
    assert base.headers["content-type"] == "audio/wav" and base.content[:4] == b"RIFF"
    assert base.content == before.content  # byte-identical to the adapterless request
    assert adapter.content != base.content and len(adapter.content) == len(base.content)


def test_bad_requests_get_the_right_status(served):
    url, _ = served
    assert _post(url, {**BODY, "adapter": "nobody"}).status_code == 404
    invalid = _post(url, {**BODY, "duration_s": -1})
    assert invalid.status_code == 422 and "duration_s" in invalid.json()["error"]
    assert _post(url, {"duration_s": 2}).status_code == 422  # no caption
    assert _get(url, "/mm3/previews/abc/other").status_code == 404
