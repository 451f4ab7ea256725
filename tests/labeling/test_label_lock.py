"""One label run per dataset: a second run refuses at once (before any sample, job record or Ray
pool), from the CLI as one line with exit 2; a run releases the lock however it ends."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from hotstep_ray.cli.label_cmd import app
from hotstep_ray.core.contracts import LabelOptions
from hotstep_ray.core.locks import LockHeldError, label_lock, lock_key
from hotstep_ray.dataset.store import load_dataset
from hotstep_ray.labeling import ray_pool
from hotstep_ray.labeling.analysis import EssentiaAnalyzer
from hotstep_ray.labeling.captions import OfflineCaptioner
from hotstep_ray.labeling.job import LabelExecutors, label_dataset
from hotstep_ray.labeling.providers import Providers

ALL = LabelOptions(scope="all", use_genius=False)


def _providers() -> Providers:
    return Providers(EssentiaAnalyzer(), None, OfflineCaptioner())


def test_a_second_label_run_refuses_before_any_work(song_dataset, monkeypatch):
    ds = song_dataset
    with label_lock(ds.storage, ds.slug, heartbeat_s=0):  # the first run, still going
        with pytest.raises(LockHeldError) as refused:
            label_dataset(ds.storage, ds.slug, ALL, providers=_providers())
        message = str(refused.value)
        assert message.startswith(f"another label run holds {ds.slug} since ")
        assert message.endswith(
            f"remove {ds.storage.url_of(lock_key('label', ds.slug))} if it died"
        )
        assert not ds.storage.exists("jobs")  # no job record either
        assert all(s.label_status == "unlabeled" for s in load_dataset(ds.storage, ds.slug).samples)

        # the Ray variant refuses before it starts a pool
        def no_pools(*args, **kwargs):
            raise AssertionError("a pool started although the dataset is locked")

        monkeypatch.setattr(ray_pool, "ensure_ray", lambda address=None: None)
        monkeypatch.setattr(ray_pool, "LabelPools", no_pools)
        with pytest.raises(LockHeldError):
            ray_pool.label_dataset_on_ray(ds.storage, ds.slug, ALL, providers=_providers())

        cli = CliRunner().invoke(
            app,
            ["run", ds.slug, "--data", ds.storage.url, "--no-ray", "--no-genius"],
            terminal_width=300,
        )
        assert cli.exit_code == 2, cli.output
        errors = [line for line in cli.output.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and errors[0].startswith(
            f"error: another label run holds {ds.slug}"
        )


def test_the_lock_is_released_when_a_run_ends_or_dies(song_dataset):
    ds = song_dataset
    key = lock_key("label", ds.slug)

    def killed(fn, items):  # the job is killed while it works
        for item in items:
            assert ds.storage.exists(key)  # held meanwhile
            raise KeyboardInterrupt("killed")
            yield fn(item)

    with pytest.raises(KeyboardInterrupt):
        label_dataset(
            ds.storage, ds.slug, ALL, providers=_providers(), executors=LabelExecutors(killed)
        )
    assert not ds.storage.exists(key)
    report = label_dataset(ds.storage, ds.slug, ALL, providers=_providers())
    assert report.labeled == report.total > 0
    assert not ds.storage.exists(key)
