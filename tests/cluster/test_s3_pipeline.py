"""Storage on S3 end to end against a real S3 server (`rclone serve s3`, see conftest): songs →
dataset → tensor cache → DiT and LM adapters → an A/B preview, all under one `s3://` root.

Every stage runs in this process (the multi-node test covers Ray placement); what is checked
here is that each stage reads and writes only through the `s3://` root: the objects appear in
the folder behind the server, and a fresh S3 client reads them back."""

from __future__ import annotations

import json

import fsspec
import pytest
from cluster_support import ACCESS_KEY, SECRET_KEY, SONGS, TAG, write_songs
from safetensors import safe_open

from hotstep_ray.audition.ab import PreviewStore, run_ab
from hotstep_ray.audition.decode import CodesDecoder
from hotstep_ray.audition.planner import PlannerLM
from hotstep_ray.audition.schemas import AuditionRequest
from hotstep_ray.core.contracts import CreateDatasetInput, MakeOptions
from hotstep_ray.core.jobs import Job
from hotstep_ray.core.storage import Storage
from hotstep_ray.dataset.store import build_dataset, create_dataset, load_dataset
from hotstep_ray.main_job import (
    RunRecord,
    _with,
    tiny_recipe,
    train_dit_stage,
    train_lm_stage,
)
from hotstep_ray.preprocess.run import preprocess_dataset

pytestmark = [pytest.mark.slow]
VARIANT = "acestep-v15-turbo"  # the tiny tree's DiT folder = the tensor-cache variant key


def _storage(server, prefix: str) -> Storage:
    # Keys and endpoint given explicitly as well as in the env, so the root works the same in a
    # process that was started before the server (as a Ray worker would be).
    options = {
        "key": ACCESS_KEY,
        "secret": SECRET_KEY,
        "client_kwargs": {"endpoint_url": server.endpoint},
    }
    return Storage(server.root(prefix), **options)


def test_songs_to_previews_on_an_s3_root(s3_server, tiny_tree, tmp_path):
    storage = _storage(s3_server, "e2e")
    assert not storage.is_local and storage.url == "s3://hotstep-bucket/e2e"
    songs = storage.child("library/songs")
    write_songs(songs)

    # dataset: scanned from the s3:// song folder, sidecars read over S3, dataset.json written
    inp = CreateDatasetInput(name="s3 band", source_dir=songs.url, custom_tag=TAG)
    detail = create_dataset(storage, inp)
    dataset_json = build_dataset(storage, detail.slug)
    assert dataset_json == storage.url_of(f"datasets/{detail.slug}/dataset.json")
    built = json.loads(s3_server.on_disk(dataset_json).read_text())
    assert built["metadata"]["num_samples"] == len(SONGS)
    assert built["metadata"]["custom_tag"] == TAG
    # the samples point at the songs' s3:// URLs, not at a local copy
    assert all(s["audio_path"].startswith(songs.url + "/") for s in built["samples"]), built

    # tensors: the plain (in-process) preprocess path, every file through S3
    recipe = tiny_recipe(epochs=2)
    options = _with(recipe.preprocess, max_duration_s=1.0)
    pre = preprocess_dataset(storage, detail.slug, options, tiny_tree)
    assert (pre.processed, pre.failed) == (len(SONGS), 0)
    assert pre.tensor_dir == storage.url_of(f"tensors/{detail.slug}/{VARIANT}")
    tensor_files = sorted(s3_server.on_disk(pre.tensor_dir).glob("*.safetensors"))
    assert len(tensor_files) == len(SONGS)
    codes = s3_server.on_disk(pre.tensor_dir) / "lm_codes.jsonl"
    assert codes.read_text().count("\n") == len(SONGS)

    # adapters: the main job's two training stages, in process, 1 s songs → 24-frame crops
    recipe = tiny_recipe(epochs=2)
    recipe = type(recipe)(**{**recipe.__dict__, "dit": _with(recipe.dit, crop_frames=24)})
    config = MakeOptions(data=storage.url, ray_train=False, skip_audition=True)
    detail = load_dataset(storage, detail.slug)
    with Job(storage, "build") as job:
        runs = RunRecord(storage, detail.slug)  # the make_runs.json record, on S3 too
        dit_run, _ = train_dit_stage(
            job, storage, detail, pre, tiny_tree, recipe, config, runs, False
        )
        lm_run, _ = train_lm_stage(
            job, storage, detail, pre, tiny_tree, recipe, config, runs, False
        )
    assert set(storage.read_json(runs.key)) == {"dit", "lm"}
    for run, weights in ((dit_run, "lokr_weights.safetensors"), (lm_run, "adapter_model")):
        assert run.url.startswith(storage.url + "/adapters/"), run.url
        assert len(run.epoch_losses) == 2 and all(loss > 0 for loss in run.epoch_losses)
        exported = [p.name for p in s3_server.on_disk(run.url).iterdir()]
        assert any(name.startswith(weights) for name in exported), exported
    with safe_open(str(s3_server.on_disk(dit_run.url) / "lokr_weights.safetensors"), "pt") as f:
        assert (f.metadata() or {}).get("hot_step_trigger") == TAG
    # each stage's job record is on S3 too (the studio and `jobs list` read them there)
    kinds = {
        json.loads(storage.read_text(f"{key}/job.json"))["kind"] for key in storage.list("jobs")
    }
    assert kinds == {"build", "train-dit", "train-lm"}

    # previews: a same-seed A/B of the base LM against the new LM adapter, loaded from S3
    planner = PlannerLM.from_checkpoints(tiny_tree, data=storage, device="cpu")
    decoder = CodesDecoder.from_checkpoints(tiny_tree, device="cpu")
    request = AuditionRequest(
        caption="a calm tone",
        duration=1,
        seed=7,
        lm_adapter=lm_run.adapter_id,
        bpm=120,
        keyscale="C major",
        timesignature="4",
        top_k=8,
    )
    result, audio = run_ab(request, planner, decoder, PreviewStore(storage))
    assert [side.ok for side in result.sides] == [True, True], result.sides
    preview = s3_server.on_disk(storage.url_of(f"previews/{result.preview_id}"))
    assert sorted(p.name for p in preview.iterdir()) == ["adapter.wav", "base.wav", "preview.json"]
    assert (preview / "base.wav").read_bytes() == audio["base"].audio

    # a client with nothing but the environment (keys + AWS_ENDPOINT_URL) sees the same objects
    fresh = fsspec.filesystem("s3", skip_instance_cache=True)
    listed = fresh.find(f"{s3_server.bucket}/e2e/previews/{result.preview_id}")
    assert sorted(p.rsplit("/", 1)[1] for p in listed) == [
        "adapter.wav",
        "base.wav",
        "preview.json",
    ]
    assert Storage(storage.url).read_json(f"previews/{result.preview_id}/preview.json")[
        "previewId"
    ] == (result.preview_id)
