"""Allowed roots (no `..`, no symlink escape, whole URL segments), the bearer token on every
route, and the request size cap."""

from __future__ import annotations

import pytest

from hotstep_ray.core.errors import InputError, PathNotAllowedError
from hotstep_ray.studio.security import PathGuard, token_matches

API = "/api/training"


def test_path_guard_local_paths(tmp_path):
    root = tmp_path / "allowed"
    (root / "songs").mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "escape").symlink_to(outside)
    guard = PathGuard([str(root)])
    assert guard.check(str(root / "songs")) == str((root / "songs").resolve())
    assert guard.check(str(root / "not-yet")) == str((root / "not-yet").resolve())
    for bad in (str(outside), str(root / "escape"), str(root / "songs" / ".." / ".." / "x")):
        with pytest.raises(PathNotAllowedError):
            guard.check(bad)
    with pytest.raises(InputError):
        guard.check("songs")  # relative: refused, never resolved against the server's cwd
    with pytest.raises(InputError):
        guard.check("")


def test_path_guard_urls():
    guard = PathGuard(["s3://bucket/data"])
    assert guard.check("s3://bucket/data/songs/") == "s3://bucket/data/songs"
    for bad in ("s3://bucket/database", "s3://bucket/data/../other", "s3://other/data", "/data"):
        with pytest.raises(PathNotAllowedError):
            guard.check(bad)


def test_token_matching():
    assert token_matches("", None, None)
    assert token_matches("s3cret", "Bearer s3cret", None)
    assert token_matches("s3cret", None, "s3cret")
    assert not token_matches("s3cret", "Bearer nope", None)
    assert not token_matches("s3cret", "Basic s3cret", None)
    assert not token_matches("s3cret", None, None)


def test_bearer_token_is_enforced_on_every_route(make_client):
    client = make_client(token="s3cret")
    good = {"Authorization": "Bearer s3cret"}
    for url in (f"{API}/datasets", f"{API}/jobs", f"{API}/capabilities"):
        assert client.get(url).status_code == 401, url
        assert client.get(url, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.get(url, headers=good).status_code == 200, url
    # Health answers a probe without a token, and shows nothing of the studio to it.
    assert client.get("/api/health").json() == {"ok": True, "authorized": False}
    wrong = client.get("/api/health", headers={"Authorization": "Bearer wrong"}).json()
    assert wrong == {"ok": True, "authorized": False}
    right = client.get("/api/health", headers=good).json()
    assert right["authorized"] is True and "storage" in right
    response = client.get(f"{API}/datasets")
    assert response.json() == {"error": "missing or wrong bearer token"}
    assert response.headers["www-authenticate"] == "Bearer"
    assert client.post(f"{API}/datasets", json={"sourceDir": "/x"}).status_code == 401
    # The query token is for EventSource only: other routes ignore it.
    assert client.get(f"{API}/datasets", params={"token": "s3cret"}).status_code == 401
    assert client.get(f"{API}/jobs/nope/events", params={"token": "s3cret"}).status_code == 404


def test_request_body_cap(make_client, songs):
    client = make_client(max_body_bytes=1000)
    big = {"sourceDir": str(songs), "name": "x" * 2000}
    response = client.post(f"{API}/datasets", json=big)
    assert response.status_code == 413 and "1000 bytes" in response.json()["error"]


def test_paths_outside_the_roots_are_refused(client, songs, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (songs.parent / "link").symlink_to(outside)
    for path in (str(outside), str(songs.parent / "link"), f"{songs}/../../elsewhere"):
        create = client.post(f"{API}/datasets", json={"sourceDir": path})
        assert create.status_code == 403, create.text
        preview = client.get(f"{API}/scan-preview", params={"path": path})
        assert preview.status_code == 403
    assert client.get(f"{API}/datasets").json() == {"datasets": []}


def test_build_output_outside_the_roots_is_refused(client, dataset, tmp_path):
    url = f"{API}/datasets/{dataset['slug']}/build"
    response = client.post(url, json={"outputPath": str(tmp_path / "elsewhere" / "d.json")})
    assert response.status_code == 403
    assert client.post(url, json={"outputPath": "/etc/dataset.json"}).status_code == 403


def test_model_folders_and_variant_keys_outside_the_roots_are_refused(client, dataset):
    """A job's model fields may name a folder under the checkpoints folder or an absolute path in
    an allowed root, and a variant key must be a plain name: anything else is refused at the
    request (403), before a job exists, not when the job later fails to load it."""
    base = f"{API}/datasets/{dataset['slug']}"
    refused = [
        ("preprocess", {"ditModel": "../../../etc"}),
        ("preprocess", {"vaeModel": "/etc"}),
        ("preprocess", {"ditModel": "sub/../../x"}),
        ("train-lm", {"lmModel": "/usr/lib"}),
        ("train-lm", {"lmModel": "~/models/lm"}),
        ("train-lm", {"variantKey": "../turbo"}),
        ("train-dit", {"variantKey": "a/b"}),
    ]
    for kind, body in refused:
        response = client.post(f"{base}/{kind}", json=body)
        assert response.status_code == 403, (kind, body, response.text)
    assert client.get(f"{API}/jobs").json()["jobs"] == []
    # a plain folder name passes the path check and meets the next one: this studio has no
    # checkpoints folder
    plain = client.post(f"{base}/train-lm", json={"lmModel": "acestep-5Hz-lm-0.6B"})
    assert plain.status_code == 503 and "needs a checkpoints folder" in plain.text
