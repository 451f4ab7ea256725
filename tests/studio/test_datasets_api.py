"""Dataset routes over a local storage root with the bundled songs: create (with a scan preview
first), list, detail with warnings, patch a sample, bulk set, settings; 404/409/422."""

from __future__ import annotations

API = "/api/training"


def test_scan_preview_then_create_list_and_detail(client, songs):
    preview = client.get(f"{API}/scan-preview", params={"path": str(songs)})
    assert preview.status_code == 200
    body = preview.json()
    assert body["audioFiles"] == 12 and body["withSidecar"] == 11 and not body["hasDatasetJson"]
    assert len(body["sampleNames"]) == 10

    created = client.post(f"{API}/datasets", json={"sourceDir": str(songs), "name": "My Band"})
    assert created.status_code == 201
    dataset = created.json()["dataset"]
    assert dataset["slug"] == "my-band" and dataset["sourceDir"] == str(songs)
    assert dataset["sampleCount"] == 12 and len(dataset["samples"]) == 12
    assert dataset["defaultLanguage"] == "en"  # camelCase on the wire

    listed = client.get(f"{API}/datasets").json()["datasets"]
    assert [d["slug"] for d in listed] == ["my-band"] and "samples" not in listed[0]

    by_slug = client.get(f"{API}/datasets/my-band").json()
    by_id = client.get(f"{API}/datasets/{dataset['id']}").json()
    assert by_slug["id"] == by_id["id"] == dataset["id"]
    assert by_slug["activeJobId"] == "" and by_slug["preprocessedVariants"] == []
    assert by_slug["warnings"] == []


def test_detail_reports_missing_files_and_few_samples(client, dataset, songs):
    for path in sorted(songs.glob("0*.*")):
        if path.suffix != ".txt":
            path.unlink()  # 9 of 12 songs gone from disk
    detail = client.get(f"{API}/datasets/{dataset['slug']}").json()
    assert "Only 3 samples — 10+ recommended" in detail["warnings"]


def test_create_errors(client, songs, tmp_path):
    first = client.post(f"{API}/datasets", json={"sourceDir": str(songs)})
    assert first.status_code == 201
    again = client.post(f"{API}/datasets", json={"sourceDir": str(songs)})
    assert again.status_code == 409 and "already has a dataset" in again.json()["error"]
    missing = client.post(f"{API}/datasets", json={"sourceDir": str(songs.parent / "nope")})
    assert missing.status_code == 404
    unknown_key = client.post(f"{API}/datasets", json={"sourceDir": str(songs), "colour": "red"})
    assert unknown_key.status_code == 422 and unknown_key.json()["detail"][0]["loc"][-1] == "colour"
    no_dir = client.post(f"{API}/datasets", json={"name": "x"})
    assert no_dir.status_code == 422
    ratio = client.post(f"{API}/datasets", json={"sourceDir": str(songs), "genreRatio": 101})
    assert ratio.status_code == 422
    assert client.get(f"{API}/datasets/nope").status_code == 404
    assert client.get(f"{API}/datasets/..%2F..%2Fetc").status_code == 404


def test_patch_sample_writes_the_sidecar(client, dataset, songs):
    sample = next(s for s in dataset["samples"] if s["filename"] == "05_untitled.flac")
    url = f"{API}/datasets/{dataset['slug']}/samples/{sample['sampleId']}"
    response = client.patch(url, json={"caption": "Warm lo-fi loop", "bpm": 84, "repeat": 2})
    assert response.status_code == 200
    patched = response.json()["sample"]
    assert patched["caption"] == "Warm lo-fi loop" and patched["bpm"] == 84
    assert patched["sources"]["caption"] == "user" and patched["labelStatus"] == "labeled"
    assert "Warm lo-fi loop" in (songs / "05_untitled.txt").read_text()

    assert client.patch(url, json={"repeat": 0}).status_code == 422
    assert client.patch(url, json={"mood": "sad"}).status_code == 422
    unknown = client.patch(f"{API}/datasets/{dataset['slug']}/samples/0123456789abcdef", json={})
    assert unknown.status_code == 404
    (songs / "05_untitled.flac").unlink()
    gone = client.patch(url, json={"caption": "x"})
    assert gone.status_code == 409 and "missing from disk" in gone.json()["error"]


def test_bulk_set_reports_each_failure(client, dataset):
    ids = [s["sampleId"] for s in dataset["samples"][:3]]
    url = f"{API}/datasets/{dataset['slug']}/samples/bulk"
    response = client.post(
        url, json={"sampleIds": [*ids, "ffffffffffffffff"], "set": {"excluded": True}}
    )
    assert response.status_code == 200
    assert response.json() == {
        "updated": 3,
        "failed": [
            {"sampleId": "ffffffffffffffff", "error": response.json()["failed"][0]["error"]}
        ],
    }
    detail = client.get(f"{API}/datasets/{dataset['slug']}").json()
    assert detail["excludedCount"] == 3
    assert sum(s["excluded"] for s in detail["samples"]) == 3
    assert client.post(url, json={"sampleIds": ids, "set": {}}).status_code == 422
    assert client.post(url, json={"sampleIds": [], "set": {"genre": "x"}}).status_code == 422
    assert client.post(url, json={"sampleIds": ids, "set": {"caption": "x"}}).status_code == 422


def test_settings_patch_keeps_slug_and_source_immutable(client, dataset, songs):
    url = f"{API}/datasets/{dataset['slug']}"
    for body in ({"slug": "other"}, {"sourceDir": "/tmp"}, {"name": "x", "id": "y"}):
        response = client.patch(url, json=body)
        assert response.status_code == 422 and "cannot be changed" in response.json()["error"]
    changed = client.patch(url, json={"name": "Renamed", "customTag": "mb", "genreRatio": 40})
    assert changed.status_code == 200
    summary = changed.json()["dataset"]
    assert (summary["name"], summary["customTag"], summary["genreRatio"]) == ("Renamed", "mb", 40)
    assert summary["slug"] == dataset["slug"] and summary["sourceDir"] == str(songs)
    assert client.patch(url, json={"tagPosition": "middle"}).status_code == 422


def test_delete_forgets_the_dataset_not_the_songs(client, dataset, songs):
    assert client.delete(f"{API}/datasets/{dataset['slug']}").json() == {"ok": True}
    assert client.get(f"{API}/datasets/{dataset['slug']}").status_code == 404
    assert len(list(songs.glob("*.flac"))) == 8
    recreated = client.post(f"{API}/datasets", json={"sourceDir": str(songs)})
    assert recreated.status_code == 201


def test_job_routes_answer_before_any_job(client, dataset):
    slug = dataset["slug"]
    assert client.post(f"{API}/datasets/{slug}/bogus-kind", json={}).status_code == 404
    assert client.post(f"{API}/datasets/nope/label", json={}).status_code == 404
    bad = client.post(f"{API}/datasets/{slug}/label", json={"scope": "everything"})
    assert bad.status_code == 422
    assert client.get(f"{API}/jobs").json() == {"jobs": []}
    assert client.get(f"{API}/jobs/0123456789abcdef").status_code == 404
    assert client.get(f"{API}/jobs/../../etc").status_code == 404
    assert client.get(f"{API}/datasets/{slug}/dataset-json").status_code == 404  # not built


def test_capabilities_report_without_secrets(client, monkeypatch):
    monkeypatch.setenv("GEMINI_API_KEY", "do-not-leak-me")
    monkeypatch.delenv("GENIUS_ACCESS_TOKEN", raising=False)
    response = client.get(f"{API}/capabilities")
    assert response.status_code == 200 and "do-not-leak-me" not in response.text
    caps = response.json()
    assert caps["providers"]["llm"]["providers"]["gemini"] == {"configured": True}
    assert caps["providers"]["genius"] == {"configured": False}
    assert isinstance(caps["providers"]["essentia"]["available"], bool)
    assert caps["checkpoints"]["available"] is False and "error" in caps["checkpoints"]
    assert caps["stages"]["build"]["available"] and caps["stages"]["label"]["available"]
    for stage in caps["stages"].values():
        assert stage["available"] or "not available" in stage["reason"]
    assert set(caps["gpus"]) >= {"rayConnected", "total", "nodes"}
