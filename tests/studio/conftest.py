"""Studio fixtures: the bundled songs (rendered once per session, copied per test) and a
TestClient over a fresh storage root whose allowed roots hold the songs."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from hotstep_ray.audio.example_songs import write_example_songs
from hotstep_ray.core.storage import Storage
from hotstep_ray.studio.app import create_app
from hotstep_ray.studio.config import StudioConfig

API = "/api/training"


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
