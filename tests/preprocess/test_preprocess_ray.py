"""The Ray Data path on the session Ray: same files as the plain path, byte for byte, and each
song's file is its own record, as on the plain path (a driver killed before it wrote the variant
files loses nothing)."""

from __future__ import annotations

import json

import pytest
from preprocess_support import new_dataset

from hotstep_ray.core.contracts import PreprocessOptions
from hotstep_ray.core.events import EventLog, ProgressEvent
from hotstep_ray.core.storage import Storage
from hotstep_ray.preprocess.ray_pipeline import RayPipelineConfig
from hotstep_ray.preprocess.run import preprocess_dataset

pytestmark = pytest.mark.ray


def test_ray_pipeline_writes_the_same_files_as_the_plain_path(
    ray_session, plain_run, tmp_path
) -> None:
    storage = Storage(tmp_path / "root")
    slug = new_dataset(storage, plain_run.source)
    events = []
    # 2 CPUs in the session Ray: one for the encoder actor, the rest for decode/write tasks.
    # Same batch size as the plain run, so rows pad alike and the bytes can match exactly.
    config = RayPipelineConfig(decode_cpus=0.5, write_cpus=0.25, batch_size=4)
    result = preprocess_dataset(
        storage,
        slug,
        PreprocessOptions(sidestep_pt=True),
        plain_run.ckpt,
        executor="ray",
        events=EventLog(events.append),
        ray_config=config,
    )
    assert result.processed == 3 and result.failed == 0
    tensor_dir = storage.local_path(f"tensors/{slug}/acestep-v15-turbo")
    ours = {p.name: p.read_bytes() for p in tensor_dir.iterdir()}
    theirs = {p.name: p.read_bytes() for p in plain_run.tensor_dir.iterdir()}
    assert sorted(ours) == sorted(theirs)
    for name in ours:
        if name.endswith((".safetensors", ".pt", ".jsonl")) or name == "channel_stats.json":
            assert ours[name] == theirs[name], name
    plain_meta = json.loads(theirs["preprocess_meta.json"])
    ray_meta = json.loads(ours["preprocess_meta.json"])
    assert ray_meta["samples"] == plain_meta["samples"]
    progress = [e for e in events if isinstance(e, ProgressEvent)]
    assert [e.done for e in progress] == [1, 2, 3]

    # The driver dies after the rows were written, before `finalize`: the rerun keeps all three
    # songs by their headers and writes the variant files the first run would have.
    for name in ("preprocess_meta.json", "lm_codes.jsonl", "channel_stats.json"):
        (tensor_dir / name).unlink()
    again = preprocess_dataset(
        storage, slug, PreprocessOptions(sidestep_pt=True), plain_run.ckpt, executor="ray"
    )
    assert (again.processed, again.cached, len(again.recovered)) == (0, 3, 3)
    rebuilt = {p.name: p.read_bytes() for p in tensor_dir.iterdir()}
    assert json.loads(rebuilt["preprocess_meta.json"])["samples"] == plain_meta["samples"]
    for name in ("lm_codes.jsonl", "channel_stats.json"):
        assert rebuilt[name] == theirs[name], name
