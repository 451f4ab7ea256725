"""Fixtures of the labeling tests: a fake HTTP server on 127.0.0.1 and small synthesized songs.

No test talks to a real service: every provider is pointed at `fake_http`, which records each
request and answers with whatever the test's handler returns.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from hotstep_ray.audio.synth import SongSpec, render_song
from hotstep_ray.core.contracts import CreateDatasetInput
from hotstep_ray.core.storage import Storage
from hotstep_ray.dataset.store import create_dataset


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Reply:
    status: int = 200
    body: Any = None  # dict/list -> JSON, str/bytes as is
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


Handler = Callable[[Seen], Reply | dict | str]


class FakeHttp:
    Reply = Reply  # handlers build answers as `fake_http.Reply(...)`: no conftest import needed

    def __init__(self) -> None:
        self.requests: list[Seen] = []
        self.handler: Handler = lambda seen: Reply(404, {"error": "no handler"})
        self.url = ""

    def reply(self, seen: Seen) -> Reply:
        self.requests.append(seen)
        answer = self.handler(seen)
        return answer if isinstance(answer, Reply) else Reply(200, answer)


def _make_handler(fake: FakeHttp) -> type[BaseHTTPRequestHandler]:
    class _Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            parts = urllib.parse.urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            seen = Seen(
                self.command,
                parts.path,
                dict(urllib.parse.parse_qsl(parts.query)),
                {k.lower(): v for k, v in self.headers.items()},
                self.rfile.read(length) if length else b"",
            )
            reply = fake.reply(seen)
            if reply.delay_s:
                threading.Event().wait(reply.delay_s)
            body = reply.body
            if isinstance(body, dict | list):
                body, kind = json.dumps(body).encode(), "application/json"
            elif isinstance(body, str):
                body, kind = body.encode(), "text/html; charset=utf-8"
            else:
                body, kind = body or b"", "application/octet-stream"
            try:
                self.send_response(reply.status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client timed out and left: that is what the test wanted

        do_GET = do_POST = _serve

        def log_message(self, *args: Any) -> None:  # keep pytest output clean
            pass

    return _Handler


@pytest.fixture
def fake_http() -> Iterator[FakeHttp]:
    fake = FakeHttp()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(fake))
    server.daemon_threads = True
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    # A short poll keeps teardown (`shutdown` waits for one poll) from costing 0.5 s per test.
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    yield fake
    server.shutdown()
    server.server_close()


def write_song(
    path: Path,
    spec: SongSpec,
    rate: int = 22_050,
    tags: dict[str, str] | None = None,
) -> Path:
    """Render `spec` to `path` (format from the suffix), with optional embedded tags."""
    audio = render_song(spec, rate=rate)
    path.parent.mkdir(parents=True, exist_ok=True)
    with sf.SoundFile(path, "w", rate, 2, subtype="PCM_16") as handle:
        for name, value in (tags or {}).items():
            setattr(handle, name, value)
        handle.write(np.ascontiguousarray(audio.T))
    return path


SONGS = [
    (
        "a_first.wav",
        SongSpec("First", 120, "A", "major", 3.0, 11),
        {"artist": "Band", "title": "First"},
    ),
    (
        "b_second.wav",
        SongSpec("Second", 100, "C", "major", 3.0, 12),
        {"artist": "Band", "title": "Second"},
    ),
    ("c_third.wav", SongSpec("Third", 90, "E", "minor", 3.0, 13), {}),
    ("d_fourth.wav", SongSpec("Fourth", 128, "G", "major", 3.0, 14), {}),
]


@dataclass
class SongDataset:
    storage: Storage
    source: Path
    slug: str


def make_dataset(root: Path, songs=SONGS, **settings: Any) -> SongDataset:
    source = root / "songs"
    for name, spec, tags in songs:
        write_song(source / name, spec, tags=tags)
    storage = Storage(root / "data")
    detail = create_dataset(storage, CreateDatasetInput(source_dir=str(source), **settings))
    return SongDataset(storage, source, detail.slug)


@pytest.fixture
def song_dataset(tmp_path) -> SongDataset:
    """Four 3-second songs, no sidecars, registered as a dataset (default language en)."""
    return make_dataset(tmp_path, default_artist="Band")


@pytest.fixture
def dataset_factory() -> Callable[..., SongDataset]:
    """`make_dataset(root, songs=SONGS, **dataset settings)` for tests that need two copies."""
    return make_dataset


@pytest.fixture
def song_writer() -> Callable[..., Path]:
    return write_song
