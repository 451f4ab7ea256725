"""The Ray path: one actor pool per stage gives the same label store as the plain path."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import soundfile as sf
from ray import cloudpickle

from hotstep_ray.core.contracts import CreateDatasetInput, LabelOptions
from hotstep_ray.core.storage import Storage
from hotstep_ray.dataset.ids import sample_id
from hotstep_ray.dataset.store import create_dataset, read_labels
from hotstep_ray.labeling.analysis import EssentiaAnalyzer
from hotstep_ray.labeling.captions import OfflineCaptioner
from hotstep_ray.labeling.genius import GeniusClient
from hotstep_ray.labeling.http import HttpClient
from hotstep_ray.labeling.job import label_dataset
from hotstep_ray.labeling.providers import Providers
from hotstep_ray.labeling.ray_pool import ActorPoolMap, LabelPools, PoolOptions

pytestmark = pytest.mark.ray
# Ray workers cannot import test modules by name; ship this module's functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
OPTIONS = LabelOptions(scope="all")
# Differ by run, not by executor.
VOLATILE = {"labeledAt", "durationCache"}


def _stable(records: dict) -> dict:
    return {k: {f: v for f, v in r.items() if f not in VOLATILE} for k, r in records.items()}


def _sidecars(source) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(source.glob("*.txt"))}


def _serve_genius(fake_http) -> GeniusClient:
    hit = {
        "type": "song",
        "result": {
            "title": "First",
            "primary_artist": {"name": "Band"},
            "url": f"{fake_http.url}/p",
        },
    }

    def handle(seen):
        if seen.path == "/search":
            return {"response": {"hits": [hit]}}
        return '<div data-lyrics-container="true">[Chorus: Band]<br>Oh oh</div>'

    fake_http.handler = handle
    return GeniusClient("t", fake_http.url, HttpClient(timeout_s=5, min_interval_s=0.01))


def test_actor_pools_match_the_plain_path(ray_session, tmp_path, dataset_factory, fake_http):
    genius = _serve_genius(fake_http)
    providers = Providers(EssentiaAnalyzer(), genius, OfflineCaptioner())
    plain = dataset_factory(tmp_path / "plain")
    pooled = dataset_factory(tmp_path / "pooled")

    expected = label_dataset(plain.storage, plain.slug, OPTIONS, providers=providers)
    with LabelPools(
        PoolOptions(analysis_actors=2, genius_concurrency=1, caption_concurrency=1)
    ) as pools:
        report = label_dataset(
            pooled.storage, pooled.slug, OPTIONS, providers=providers, executors=pools.executors
        )
        analysis_nodes = pools.analysis.node_ids
        assert len(analysis_nodes) == 2  # four songs, two CPUs: both analysis actors worked

    assert (report.labeled, report.failed, report.analysed) == (expected.labeled, 0, 4)
    assert _stable(read_labels(pooled.storage, pooled.slug)) == _stable(
        read_labels(plain.storage, plain.slug)
    )
    assert _sidecars(pooled.source) == _sidecars(plain.source)
    genius_searches = [r for r in fake_http.requests if r.path == "/search"]
    assert len(genius_searches) == 2 * 2  # two songs with an artist (tags), per run


def _where(x: int) -> tuple[int, int]:
    return x * 10, os.getpid()


def test_actor_pool_map_streams_lazily_and_caps_its_actors(ray_session):
    pool = ActorPoolMap("t", size=2, num_cpus=0)
    pulled: list[int] = []

    def items():
        for i in range(6):
            pulled.append(i)
            yield i

    try:
        results = pool(_where, items())
        first = next(results)
        assert len(pulled) <= 3  # it does not drain its input ahead of its actors
        rest = list(results)
        values = sorted([first[0]] + [r[0] for r in rest])
        assert values == [0, 10, 20, 30, 40, 50]
        pids = {first[1]} | {r[1] for r in rest}
        assert os.getpid() not in pids and len(pids) <= 2
    finally:
        pool.shutdown()


def test_the_analysis_time_limit_holds_on_an_actor(ray_session, tmp_path):
    # 10 s of 48 kHz stereo noise: decoding it and resampling it to 44.1 kHz takes far longer
    # than the 1 ms limit, on any machine. Analysis only, so a single actor starts.
    songs = tmp_path / "songs"
    songs.mkdir()
    noise = 0.1 * np.random.default_rng(0).standard_normal((10 * 48_000, 2))
    sf.write(songs / "long.wav", noise.astype(np.float32), 48_000, subtype="PCM_16")
    storage = Storage(tmp_path / "data")
    slug = create_dataset(storage, CreateDatasetInput(source_dir=str(songs))).slug
    providers = Providers(EssentiaAnalyzer(time_limit_s=0.001))

    with LabelPools(PoolOptions(analysis_actors=1)) as pools:
        report = label_dataset(
            storage, slug, OPTIONS, providers=providers, executors=pools.executors
        )

    assert (report.labeled, report.failed) == (0, 1)
    assert (
        "took longer than 0.001 s (the analysis time limit)" in report.errors[sample_id("long.wav")]
    )
    assert list(songs.glob("*.txt")) == []
