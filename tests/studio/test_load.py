"""The API under a bounded load on loopback: 200 requests, 16 at a time, mixed GETs over
datasets, a dataset's detail, jobs, capabilities and health, against a real server with a token.
Every answer must be a 200 with the JSON each route promises; p50/p99 latencies are printed."""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from live_server import API, LiveServer, http_json

from hotstep_ray.studio.app import create_app
from hotstep_ray.studio.config import StudioConfig

REQUESTS = 200
CONCURRENCY = 16
TOKEN = "load-s3cret"


def test_two_hundred_mixed_requests_sixteen_at_a_time(tmp_path, songs):
    config = StudioConfig(data=str(tmp_path / "data"), roots=(str(songs.parent),), token=TOKEN)
    with LiveServer(create_app(config)) as server:
        status, created = http_json(
            "POST", f"{server.url}{API}/datasets", {"sourceDir": str(songs)}, TOKEN
        )
        assert status == 201
        slug = created["dataset"]["slug"]
        # route -> what a correct answer holds
        routes = {
            f"{API}/datasets": lambda body: [d["slug"] for d in body["datasets"]] == [slug],
            f"{API}/datasets/{slug}": lambda body: len(body["samples"]) == 12,
            f"{API}/jobs": lambda body: body == {"jobs": []},
            f"{API}/capabilities": lambda body: "stages" in body,
            "/api/health": lambda body: body["ok"] is True,
        }
        paths = [list(routes)[i % len(routes)] for i in range(REQUESTS)]

        def one(path: str) -> tuple[str, int, bool, float]:
            started = time.perf_counter()
            status, body = http_json("GET", server.url + path, token=TOKEN, timeout_s=60)
            seconds = time.perf_counter() - started
            return path, status, status == 200 and routes[path](body), seconds

        started = time.perf_counter()
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            results = list(pool.map(one, paths))
        wall = time.perf_counter() - started

    bad = [(path, status) for path, status, ok, _ in results if not ok]
    assert not bad, bad[:10]
    latencies_ms = sorted(r[3] * 1000 for r in results)
    p50 = statistics.median(latencies_ms)
    p99 = latencies_ms[int(0.99 * (len(latencies_ms) - 1))]
    print(
        f"\n{REQUESTS} requests, {CONCURRENCY} concurrent: {wall:.2f} s, "
        f"{REQUESTS / wall:.0f} req/s, p50 {p50:.1f} ms, p99 {p99:.1f} ms"
    )
    assert len(results) == REQUESTS
    assert p99 < 20_000  # bounded: a stuck request would hit this (the box may be busy)
