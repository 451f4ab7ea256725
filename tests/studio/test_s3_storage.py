"""The API on an `s3://` storage root (moto's S3 server on 127.0.0.1): dataset records, a build
job run by a Ray actor, and `dataset.json` read back through the API (`s3_root`: conftest)."""

from __future__ import annotations

import pytest

API = "/api/training"


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
