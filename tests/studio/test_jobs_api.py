"""Jobs through the API on the session Ray: a build job reaches `done` with its events (SSE over
HTTP and `events.jsonl` in storage), one job per dataset (409), a failing job, cancel of a job
queued for resources that never come, and 501/503 for stages that cannot run."""

from __future__ import annotations

import json
import time

import pytest

from hotstep_ray.core import layout
from hotstep_ray.core.contracts import BuildOptions
from hotstep_ray.core.jobs import read_job_events
from hotstep_ray.studio import stages
from hotstep_ray.studio.app import storage_of
from hotstep_ray.studio.jobs import actor_name
from hotstep_ray.studio.records import NAMESPACE, read_meta

API = "/api/training"


def _wait_for(predicate, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("timed out")


@pytest.mark.ray
def test_build_job_reaches_done_with_its_events(client, dataset, ray_session, read_sse):
    slug = dataset["slug"]
    started = client.post(f"{API}/datasets/{slug}/build", json={})
    assert started.status_code == 202
    job_id = started.json()["jobId"]
    assert started.json()["job"]["status"] == "queued"
    # One job per dataset while it runs, whatever the kind.
    for kind in ("build", "label"):
        clash = client.post(f"{API}/datasets/{slug}/{kind}", json={})
        assert clash.status_code == 409 and job_id in clash.json()["error"]

    frames = read_sse(client, f"{API}/jobs/{job_id}/events")
    assert frames[0]["type"] == "job" and frames[0]["job"]["id"] == job_id
    assert frames[-1] == {"type": "status", "status": "done", "error": ""}
    assert [f["job"]["status"] for f in frames if f["type"] == "job"] == [
        "queued",
        "running",
        "done",
    ]
    probes = [f for f in frames if f["type"] == "progress" and f["phase"] == "probe"]
    assert probes[-1]["done"] == probes[-1]["total"] == 12
    assert any(f["type"] == "log" and "dataset.json written" in f["message"] for f in frames)

    job = client.get(f"{API}/jobs/{job_id}").json()
    assert (job["status"], job["kind"], job["datasetId"], job["total"]) == (
        "done",
        "build",
        dataset["id"],
        12,
    )
    assert job["startedAt"] >= job["createdAt"] and job["finishedAt"] >= job["startedAt"]
    # The same events are in storage, in the same order.
    storage = storage_of(client.app)
    stored = read_job_events(storage, job_id)
    assert [e.type for e in stored] == [f["type"] for f in frames]
    assert read_meta(storage, job_id).status == "done"

    built = client.get(f"{API}/datasets/{slug}/dataset-json").json()
    assert built["dataset"]["metadata"]["num_samples"] == 12
    assert client.get(f"{API}/jobs/{job_id}/result").json() == {"datasetJsonPath": built["path"]}
    detail = client.get(f"{API}/datasets/{slug}").json()
    assert detail["status"] == "built" and detail["activeJobId"] == ""
    listed = client.get(f"{API}/jobs", params={"datasetId": dataset["id"]}).json()["jobs"]
    assert [j["id"] for j in listed] == [job_id]
    assert client.get(f"{API}/jobs", params={"datasetId": "other"}).json() == {"jobs": []}
    # A replay after the end streams the whole log again and closes.
    assert read_sse(client, f"{API}/jobs/{job_id}/stream") == frames


@pytest.mark.ray
def test_a_failing_job_ends_failed_with_the_error(client, dataset, ray_session, read_sse):
    slug = dataset["slug"]
    ids = [s["sampleId"] for s in dataset["samples"]]
    bulk = client.post(
        f"{API}/datasets/{slug}/samples/bulk", json={"sampleIds": ids, "set": {"excluded": True}}
    )
    assert bulk.json()["updated"] == 12
    job_id = client.post(f"{API}/datasets/{slug}/build").json()["jobId"]
    frames = read_sse(client, f"{API}/jobs/{job_id}/events")
    assert frames[-1]["status"] == "failed" and "nothing to build" in frames[-1]["error"]
    job = client.get(f"{API}/jobs/{job_id}").json()
    assert job["status"] == "failed" and "nothing to build" in job["error"]


@pytest.mark.ray
def test_cancel_a_job_queued_for_resources(client, dataset, ray_session, read_sse):
    studio = client.app.state.studio
    summary = studio.jobs.submit(
        "build",
        _summary(client, dataset),
        BuildOptions(),
        actor_options={"resources": {"hotstep-test-never": 1}},  # no node has it: stays queued
    )
    time.sleep(0.5)
    assert client.get(f"{API}/jobs/{summary.id}").json()["status"] == "queued"
    detail = client.get(f"{API}/datasets/{dataset['slug']}").json()
    assert detail["activeJobId"] == summary.id

    cancelled = client.delete(f"{API}/jobs/{summary.id}")
    assert cancelled.status_code == 200 and cancelled.json()["job"]["status"] == "cancelled"
    assert client.post(f"{API}/jobs/{summary.id}/cancel").json()["job"]["status"] == "cancelled"
    frames = read_sse(client, f"{API}/jobs/{summary.id}/events")
    assert frames[-1] == {"type": "status", "status": "cancelled", "error": "cancelled by user"}
    storage = storage_of(client.app)
    assert json.loads(storage.read_text(layout.job_record(summary.id)))["status"] == "cancelled"
    assert read_job_events(storage, summary.id)[-1].status == "cancelled"

    def runner_gone() -> bool:
        try:
            ray_session.get_actor(actor_name(summary.id), namespace=NAMESPACE)
        except ValueError:
            return True
        return False

    _wait_for(runner_gone, 20)
    # The dataset is free again.
    assert client.get(f"{API}/datasets/{dataset['slug']}").json()["activeJobId"] == ""


def test_unavailable_stage_answers_501_and_missing_checkpoints_503(client, dataset, monkeypatch):
    slug = dataset["slug"]
    monkeypatch.setitem(
        stages.STAGES,
        "train-dit",
        stages.StageSpec(
            "train-dit", "hotstep_ray.core.contracts:TrainDitOptions", ("hotstep_ray.nope:train",)
        ),
    )
    missing = client.post(f"{API}/datasets/{slug}/train-dit", json={})
    assert missing.status_code == 501 and "not available yet" in missing.json()["error"]
    monkeypatch.setitem(
        stages.STAGES,
        "train-dit",
        stages.StageSpec(
            "train-dit",
            "hotstep_ray.core.contracts:TrainDitOptions",
            ("hotstep_ray.dataset.store:build_from_detail",),
            needs=("dit",),
        ),
    )
    assert client.post(f"{API}/datasets/{slug}/train-dit", json={"epochs": 0}).status_code == 422
    no_models = client.post(f"{API}/datasets/{slug}/train-dit", json={})
    assert no_models.status_code == 503 and "checkpoints" in no_models.json()["error"]
    caps = client.get(f"{API}/capabilities").json()["stages"]["train-dit"]
    assert caps == {"available": True, "entry": "hotstep_ray.dataset.store:build_from_detail"}


def _summary(client, dataset):
    from hotstep_ray.dataset.store import load_summary

    return load_summary(storage_of(client.app), dataset["slug"])


@pytest.mark.ray
def test_cli_cancel_finds_the_runner_by_name(client, dataset, ray_session):
    """`hotstep-ray jobs cancel` from another process: the runner is found by its name, and the
    server that started the job adopts the cancellation instead of reporting a crash."""
    from typer.testing import CliRunner

    from hotstep_ray.cli.studio_cmd import jobs_app

    studio = client.app.state.studio
    never = {"resources": {"hotstep-test-never": 1}}
    summary = studio.jobs.submit("build", _summary(client, dataset), BuildOptions(), never)
    data = studio.storage.url
    result = CliRunner().invoke(jobs_app, ["cancel", summary.id, "--data", data])
    assert result.exit_code == 0 and "cancelled" in result.output, result.output
    job = _wait_for(
        lambda: (j := client.get(f"{API}/jobs/{summary.id}").json())["status"] != "queued" and j
    )
    assert (job["status"], job["error"]) == ("cancelled", "cancelled by user")
    _wait_for(lambda: client.get(f"{API}/datasets/{dataset['slug']}").json()["activeJobId"] == "")
    assert read_meta(studio.storage, summary.id).status == "cancelled"


def test_label_refusals_before_any_job(client, dataset, monkeypatch):
    """The seed's label route rules: an explicitly requested provider without its key is 503;
    nothing to label is 422, or 200 `skipped` with allowEmpty."""
    monkeypatch.delenv("GENIUS_ACCESS_TOKEN", raising=False)
    url = f"{API}/datasets/{dataset['slug']}/label"
    asked = client.post(url, json={"useGenius": True})
    assert asked.status_code == 503 and "GENIUS_ACCESS_TOKEN" in asked.json()["error"]
    labeled = [s["sampleId"] for s in dataset["samples"] if s["labelStatus"] == "labeled"]
    body = {"sampleIds": labeled, "scope": "unlabeled", "useGenius": False, "useCaption": False}
    assert client.post(url, json=body).status_code == 422
    skipped = client.post(url, json={**body, "allowEmpty": True})
    assert skipped.status_code == 200
    assert skipped.json() == {"jobId": None, "skipped": "nothing-to-label"}
    assert client.get(f"{API}/jobs").json() == {"jobs": []}
