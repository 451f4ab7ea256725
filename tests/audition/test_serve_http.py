"""The audition app on Ray Serve, over HTTP on 127.0.0.1: routes, statuses, A/B, concurrency."""

from __future__ import annotations

import io
import json
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import soundfile as sf

pytestmark = [pytest.mark.slow, pytest.mark.ray]
REPO = Path(__file__).resolve().parents[2]
TOKEN = "test-token"
# All metas pinned (no phase 1). top_k: the tiny LM's logits are nearly flat over 64,000 codes,
# so with one seed the exponential race picks the same code whatever the weights; restricting to
# the model's own top 8 makes its ranking (and so the adapter) decide.
PIN = {"bpm": 120, "keyscale": "C major", "timesignature": "4", "top_k": 8}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def base_url(ray_session, tiny_tree, data_root):
    from ray import serve

    from hotstep_ray.audition.serve_app import AuditionAppConfig, build_app

    port = _free_port()
    config = AuditionAppConfig(
        checkpoints=str(tiny_tree),
        data=str(data_root),
        device="cpu",
        enable_dit=False,  # the DiT path is covered on the plain class; one replica less
        replica_cpus=0,
        max_body_bytes=64 * 1024,
        token=TOKEN,
    )
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        serve.run(build_app(config), name="audition", route_prefix="/")
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()


def _post(base_url: str, path: str, body, **kwargs) -> requests.Response:
    headers = {"Authorization": f"Bearer {TOKEN}", **kwargs.pop("headers", {})}
    if not isinstance(body, dict | list):  # raw bytes, or an iterator (sent chunked)
        headers.setdefault("content-type", "application/json")
        return requests.post(base_url + path, data=body, headers=headers, timeout=120, **kwargs)
    return requests.post(base_url + path, json=body, headers=headers, timeout=120, **kwargs)


def _get(base_url: str, path: str) -> requests.Response:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    return requests.get(base_url + path, headers=auth, timeout=60)


def test_health_docs_auth_and_catalogue(base_url, runs):
    assert requests.get(base_url + "/health", timeout=30).json()["lmSize"] == "0.6B"
    assert requests.get(base_url + "/docs", timeout=30).status_code == 200
    spec = requests.get(base_url + "/openapi.json", timeout=30).json()
    assert {"/codes-decode", "/lm", "/audition", "/adapters"} <= set(spec["paths"])
    assert requests.get(base_url + "/adapters", timeout=30).status_code == 401
    wrong = {"Authorization": "Bearer nope"}
    assert requests.get(base_url + "/adapters", headers=wrong, timeout=30).status_code == 401
    listed = _get(base_url, "/adapters").json()
    ids = {a["id"] for a in listed}
    assert runs["lm"].removeprefix("adapters/") in ids
    assert all({"baseFolder", "sizeBytes", "trainedAt"} <= set(a) for a in listed)  # camelCase


def test_decode_returns_a_wav_of_codes_times_0_2_s(base_url):
    response = _post(base_url, "/codes-decode", {"audio_codes": [1, 2, 3, 63999, 5, 6, 7]})
    assert response.status_code == 200 and response.headers["content-type"] == "audio/wav"
    audio, rate = sf.read(io.BytesIO(response.content))
    assert rate == 48000 and audio.shape == (7 * 9600, 2)
    assert response.headers["x-codes-count"] == "7" and response.headers["x-duration-s"] == "1.4"


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"audio_codes": [64000]}, 400, "64000"),
        ({"audio_codes": [5, -3]}, 400, "-3"),
        ({"audio_codes": []}, 400, "empty"),
        ({"audio_codes": "1," * 3001}, 413, "600 s"),
        ({"audio_codes": "<|audio_code_1|>junk"}, 400, "junk"),
        ({"audio_codes": [True]}, 422, "audio_codes"),  # a bool is not a code
        ({"audio_codes": [1, "7"]}, 422, "audio_codes"),  # nor a string inside the list
        ({"audio_codes": [2.0]}, 422, "audio_codes"),
        ({"audioCodes": [1], "colour": "red"}, 422, "colour"),
        (b'{"audio_codes": [1,', 422, "JSON"),
        (b'{"audio_codes": "' + b"1," * 40000 + b'1"}', 413, "cap"),
    ],
)
def test_bad_decode_input_gets_its_status(base_url, body, status, needle):
    response = _post(base_url, "/codes-decode", body)
    assert response.status_code == status, response.text
    assert needle in response.json()["error"]


def test_missing_length_and_bad_lm_requests(base_url):
    chunked = _post(base_url, "/codes-decode", iter([b'{"audio_codes": [1]}']))
    assert chunked.status_code == 411
    cases = [
        ({"caption": "x", "duration": 2, "lm_adapter": "nobody"}, 404, "nobody"),
        ({"caption": "x", "duration": 2, "lm_adapter": "lm-4b/band"}, 400, "4B"),
        ({"caption": "x", "duration": 0.5}, 422, "duration"),
        ({"caption": "x", "duration": 2, "temperature": 9}, 422, "temperature"),
        ({"caption": "x", "duration": 2, "timesignature": "5/4"}, 422, "timesignature"),
    ]
    for body, status, needle in cases:
        response = _post(base_url, "/lm", body)
        assert response.status_code == status, response.text
        assert needle in response.json()["error"]


def test_ab_same_seed_over_http(base_url):
    body = {"caption": "dream pop", "duration": 2, "seed": 21, "lm_adapter": "band", **PIN}
    first = _post(base_url, "/audition", body).json()
    second = _post(base_url, "/audition", body).json()
    base, tuned = first["sides"]
    assert base["ok"] and tuned["ok"], json.dumps(first)
    assert second["sides"][0]["codesSha1"] == base["codesSha1"]
    assert tuned["codesSha1"] != base["codesSha1"] and not first["identical"]
    plain = {"caption": first["caption"], "duration": 2, "lm_seed": 21, **PIN}
    assert _post(base_url, "/lm", plain).json()["codesSha1"] == base["codesSha1"]
    audio = _get(base_url, base["audioUrl"])
    assert audio.status_code == 200
    assert sf.read(io.BytesIO(audio.content))[0].shape == (2 * 48000, 2)
    assert _get(base_url, f"/previews/{first['previewId']}/nope").status_code == 404
    assert first["previewId"] in {p["previewId"] for p in _get(base_url, "/previews").json()}


def test_32_concurrent_decodes_all_succeed(base_url):
    def decode(i: int) -> tuple[int, int]:
        response = _post(
            base_url, "/codes-decode", {"audio_codes": [i, i + 1, i + 2, i + 3, i + 4]}
        )
        frames = sf.info(io.BytesIO(response.content)).frames if response.ok else -1
        return response.status_code, frames

    with ThreadPoolExecutor(max_workers=32) as pool:
        results = list(pool.map(decode, range(32)))
    assert results == [(200, 5 * 9600)] * 32


def test_lifecycle_swaps_in_the_suspended_app(base_url, tiny_tree, data_root):
    """Runs last in this module: the app stays suspended until the fixture shuts Serve down.
    (Restoring is the same `serve.run` as the fixture's; the guard itself is in
    test_lifecycle.py.)"""
    from hotstep_ray.audition.lifecycle import EngineLifecycle, serve_app_callbacks
    from hotstep_ray.audition.serve_app import AuditionAppConfig, build_app, build_suspended_app

    config = AuditionAppConfig(checkpoints=str(tiny_tree), data=str(data_root), token=TOKEN)
    stop, start = serve_app_callbacks(
        "audition", "/", lambda: build_app(config), lambda: build_suspended_app(config)
    )
    restored = []
    life = EngineLifecycle(stop, lambda: restored.append(start))
    token = life.acquire("train-1")
    assert requests.get(base_url + "/health", timeout=30).json()["status"] == "suspended"
    response = _post(base_url, "/lm", {"caption": "x", "duration": 1})
    assert response.status_code == 503 and "training job" in response.json()["error"]
    life.release(token)
    assert restored == [start]  # the real redeploy is skipped here (time); the callback ran
