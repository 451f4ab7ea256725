"""The API on an `s3://` storage root (moto's S3 server on 127.0.0.1): dataset records, a build
job run by a Ray actor, and `dataset.json` read back through the API."""

from __future__ import annotations

import pytest

API = "/api/training"


@pytest.fixture
def s3_root(monkeypatch):
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

    fsspec.filesystem("s3", **options).mkdir("studio-bucket")
    yield "s3://studio-bucket/hotstep", options
    server.stop()


@pytest.mark.ray
def test_dataset_json_round_trip_on_s3(make_client, songs, s3_root, ray_session, read_sse):
    root, options = s3_root
    client = make_client(data=root, storage_options=options)
    created = client.post(f"{API}/datasets", json={"sourceDir": str(songs), "customTag": "s3tag"})
    assert created.status_code == 201
    dataset = created.json()["dataset"]
    slug = dataset["slug"]
    sample = dataset["samples"][0]["sampleId"]
    patch = {"excluded": True}
    assert client.patch(f"{API}/datasets/{slug}/samples/{sample}", json=patch).status_code == 200
    assert [d["slug"] for d in client.get(f"{API}/datasets").json()["datasets"]] == [slug]

    job_id = client.post(f"{API}/datasets/{slug}/build", json={}).json()["jobId"]
    frames = read_sse(client, f"{API}/jobs/{job_id}/events")
    assert frames[-1]["status"] == "done", frames[-1]
    built = client.get(f"{API}/datasets/{slug}/dataset-json").json()
    assert built["path"] == f"{root}/datasets/{slug}/dataset.json"
    assert built["dataset"]["metadata"]["custom_tag"] == "s3tag"
    assert built["dataset"]["metadata"]["num_samples"] == 11  # the excluded one left out

    storage = client.app.state.studio.storage
    assert storage.url == root and not storage.is_local
    for name in ("job.json", "_meta.json", "events.jsonl", "result.json"):
        assert storage.exists(f"jobs/{job_id}/{name}"), name
    assert client.get(f"{API}/datasets/{slug}").json()["status"] == "built"
