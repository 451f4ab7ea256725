"""The whole pipeline through the HTTP API on the tiny checkpoints, with a bearer token:
create → label (offline captioner) → preprocess → train-dit → audition, each a job answered 202,
polled to `done`, its events replayed over SSE, its result and artifacts checked."""

from __future__ import annotations

import math

import pytest
from live_server import API, PIPELINE_SONGS, http_json, run_kind

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _types(frames):
    return [frame["type"] for frame in frames]


def test_every_stage_runs_as_a_job_over_http(studio_pipeline):
    pipeline = studio_pipeline
    print("stage seconds:", {k: round(v, 1) for k, v in pipeline.seconds.items()})
    dataset_id = pipeline.dataset["id"]
    for kind, run in pipeline.runs.items():
        assert run.accepted["job"]["status"] == "queued" and run.accepted["job"]["kind"] == kind
        assert run.polled[-1]["status"] == "done" and run.polled[-1]["datasetId"] == dataset_id
        assert run.frames[0]["type"] == "job" and run.frames[-1] == {
            "type": "status",
            "status": "done",
            "error": "",
        }
        # one job id per stream: a stage's own job record is folded in, never announced
        assert {f["job"]["id"] for f in run.frames if f["type"] == "job"} == {run.job_id}

    label = pipeline.runs["label"].frames
    assert sum(1 for f in label if f["type"] == "sample" and f["status"] == "labeled") >= 1
    status, detail = http_json(
        "GET", f"{pipeline.url}{API}/datasets/{pipeline.dataset['slug']}", token=pipeline.token
    )
    assert status == 200 and detail["labeledCount"] == len(PIPELINE_SONGS)
    untitled = next(s for s in detail["samples"] if s["filename"].startswith("05_untitled"))
    assert untitled["caption"] and untitled["bpm"]  # the offline captioner and Essentia

    pre = pipeline.runs["preprocess"].result
    assert pre["processed"] == len(PIPELINE_SONGS) and pre["failed"] == 0
    assert detail["preprocessedVariants"] == [pre["variantKey"]]

    train = pipeline.runs["train-dit"]
    assert train.result["variantKey"] == pre["variantKey"]
    assert train.result["epochsRun"] == 4 and train.result["stopReason"] == "epochs"
    run_dir = pipeline.root / "data" / train.result["runKey"]
    assert any(p.name.endswith(".safetensors") for p in run_dir.iterdir())
    steps = [f for f in train.frames if f["type"] == "metric" and f["metric"] == "step"]
    assert [f["step"] for f in steps][-1] == 4  # each epoch's last step is always reported
    assert all(math.isfinite(f["loss"]) for f in steps)
    assert any(f["type"] == "progress" and f["phase"] == "train" for f in train.frames)
    # the Ray Train stage job is a child: not listed as a job of its own
    status, listed = http_json(
        "GET", f"{pipeline.url}{API}/jobs?datasetId={dataset_id}", token=pipeline.token
    )
    assert sorted(j["kind"] for j in listed["jobs"]) == sorted(pipeline.runs)

    preview = pipeline.runs["audition"].result
    assert [s["slot"] for s in preview["sides"]] == ["base-render", "adapter-render"]
    assert all(s["ok"] for s in preview["sides"]) and preview["datasetId"] == dataset_id
    assert preview["sides"][1]["ditAdapter"] == pipeline.dataset["slug"]
    # the trigger the adapter was trained with (the songs' own tag) leads the rendered caption
    assert preview["trigger"]["word"] and preview["caption"].startswith(preview["trigger"]["word"])
    for side in preview["sides"]:
        audio = http_json_bytes(f"{pipeline.url}{side['audioUrl']}", pipeline.token)
        assert audio[:4] == b"RIFF" and audio[8:12] == b"WAVE"
    assert preview["sides"][0]["audioSha1"] != preview["sides"][1]["audioSha1"]
    status, listed = http_json(
        "GET", f"{pipeline.url}{API}/previews?datasetId={dataset_id}", token=pipeline.token
    )
    assert [p["previewId"] for p in listed["previews"]] == [preview["previewId"]]
    # the audio route wants the token like every other route
    status, _ = http_json("GET", f"{pipeline.url}{preview['sides'][0]['audioUrl']}")
    assert status == 401


TINY_LM = {
    "lmSize": "0.6B",
    "adapterType": "lora",
    "rank": 4,
    "alpha": 8,
    "optimizer": "adamw",
    "learningRate": 1e-2,
    "epochs": 2,
    "gradAccum": 1,
    "targetLoss": 0,
    "milestoneStep": 0,
    "initAdapter": "",
}


def test_lm_training_and_its_audition_run_as_jobs_over_http(studio_pipeline):
    """After the DiT side (the fixture): train-lm on the same tensor cache as a job, then the
    same-seed LM A/B (`engine: lm`) of the newest LM adapter, both through the API."""
    pipeline = studio_pipeline
    train = run_kind(pipeline, "train-lm", TINY_LM)
    assert train.result["runKey"].startswith(f"adapters/lm-06b/{pipeline.dataset['slug']}/")
    epochs = [f for f in train.frames if f["type"] == "metric" and f["metric"] == "epoch"]
    assert [f["epoch"] for f in epochs] == [1, 2] and all(math.isfinite(f["loss"]) for f in epochs)
    options = {"engine": "lm", "duration": 2.0, "seed": 7, "adapter": pipeline.dataset["slug"]}
    preview = run_kind(pipeline, "audition", options).result
    assert preview["engine"] == "lm" and len(preview["sides"]) == 2
    base, tuned = preview["sides"]
    assert base["ok"] and tuned["ok"]
    assert base["codesCount"] == tuned["codesCount"] == 10  # 2 s at 5 codes per second
    for side in preview["sides"]:
        audio = http_json_bytes(f"{pipeline.url}{side['audioUrl']}", pipeline.token)
        assert audio[:4] == b"RIFF"


def http_json_bytes(url: str, token: str) -> bytes:
    import urllib.request

    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.headers["content-type"] == "audio/wav"
        return response.read()
