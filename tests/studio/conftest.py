"""Studio fixtures: the bundled songs (rendered once per session, copied per test), a
TestClient over a fresh storage root whose allowed roots hold the songs, and one real server that
ran the whole pipeline on the tiny checkpoints (shared by the end-to-end and browser tests)."""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from live_server import (
    API,
    PIPELINE_SONGS,
    PIPELINE_TOKEN,
    LiveServer,
    Pipeline,
    http_json,
    run_kind,
)

from hotstep_ray.audio.example_songs import write_example_songs
from hotstep_ray.core.storage import Storage
from hotstep_ray.studio.app import create_app
from hotstep_ray.studio.config import StudioConfig


@pytest.fixture(scope="session")
def rendered_songs(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("rendered") / "songs"
    write_example_songs(Storage(folder))
    return folder


@pytest.fixture
def songs(rendered_songs: Path, tmp_path: Path) -> Path:
    """A private copy of the 12 example songs (tests edit sidecars)."""
    target = tmp_path / "library" / "songs"
    shutil.copytree(rendered_songs, target)
    return target


@pytest.fixture
def make_client(tmp_path: Path, songs: Path) -> Callable[..., TestClient]:
    """`make_client(**config_overrides)`: a studio over `tmp_path/data`, songs allowed."""

    def make(**overrides: Any) -> TestClient:
        values: dict[str, Any] = {"data": str(tmp_path / "data"), "roots": (str(songs.parent),)}
        values.update(overrides)
        return TestClient(create_app(StudioConfig(**values)))

    return make


@pytest.fixture
def client(make_client) -> TestClient:
    return make_client()


@pytest.fixture
def dataset(client: TestClient, songs: Path) -> dict[str, Any]:
    response = client.post(f"{API}/datasets", json={"sourceDir": str(songs), "name": "My Band"})
    assert response.status_code == 201, response.text
    return response.json()["dataset"]


def _read_sse(client: TestClient, url: str, **kwargs: Any) -> list[dict[str, Any]]:
    frames = []
    with client.stream("GET", url, **kwargs) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                frames.append(json.loads(line[len("data: ") :]))
    return frames


@pytest.fixture
def read_sse() -> Callable[..., list[dict[str, Any]]]:
    """`read_sse(client, url)`: every `data:` frame of an SSE response, parsed (the server
    closes the stream after the terminal `status` frame)."""
    return _read_sse


@pytest.fixture
def s3_root(monkeypatch) -> Iterator[tuple[str, dict[str, Any]]]:
    """`(root URL, storage options)` of a bucket on moto's S3 server (127.0.0.1, a free port)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    # Region from the env, never client_kwargs (s3fs would send a LocationConstraint moto refuses).
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(name, value)
    options = {
        "client_kwargs": {"endpoint_url": f"http://{host}:{port}"},
        "key": "testing",  # explicit, so the runner actor (started before this env) has them
        "secret": "testing",
    }
    import fsspec

    # moto keeps its buckets per process, not per server: a fresh name per test
    bucket = f"studio-{uuid.uuid4().hex[:12]}"
    fsspec.filesystem("s3", **options).mkdir(bucket)
    yield f"s3://{bucket}/hotstep", options
    server.stop()


# -- a real server over the whole pipeline (the end-to-end and browser tests share it) ---------


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory) -> Path:
    from hotstep_ray.models.tiny_tree import make_tiny_tree

    return make_tiny_tree(tmp_path_factory.mktemp("checkpoints"), seed=0)


@pytest.fixture(scope="session")
def studio_pipeline(tmp_path_factory, rendered_songs, tiny_checkpoints, ray_session):
    """A studio with a token on a real port; dataset → label → preprocess → train-dit →
    audition, each a job started over HTTP. Yields while the server still runs."""
    root = tmp_path_factory.mktemp("pipeline")
    songs = root / "library" / "band"
    songs.mkdir(parents=True)
    for path in rendered_songs.iterdir():
        if path.name.split(".")[0] in PIPELINE_SONGS:
            shutil.copy(path, songs / path.name)
    config = StudioConfig(
        data=str(root / "data"),
        roots=(str(root / "library"),),
        token=PIPELINE_TOKEN,
        checkpoints=str(tiny_checkpoints),
    )
    with LiveServer(create_app(config)) as server:
        status, created = http_json(
            "POST",
            f"{server.url}{API}/datasets",
            {"sourceDir": str(songs), "name": "Tiny Band", "customTag": "tnyb"},
            PIPELINE_TOKEN,
        )
        assert status == 201, created
        pipeline = Pipeline(server.url, PIPELINE_TOKEN, root, created["dataset"])
        for kind in ("label", "preprocess", "train-dit", "audition"):
            pipeline.runs[kind] = run_kind(pipeline, kind)
        yield pipeline
