"""`preprocess_dataset` holds the (dataset, variant) lock for the whole run: a second run on the
same variant refuses at once (one line from the CLI, exit 2) before it plans or loads a model, a
run that fails releases it, and so does one that finishes."""

from __future__ import annotations

from pathlib import Path

import pytest
from preprocess_support import make_song_folder, new_dataset
from typer.testing import CliRunner

from hotstep_ray.cli.preprocess_cmd import app
from hotstep_ray.core import layout
from hotstep_ray.core.contracts import PreprocessOptions
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.locks import LockHeldError, lock_key, preprocess_lock
from hotstep_ray.core.storage import Storage
from hotstep_ray.preprocess.run import preprocess_dataset

VARIANT = "acestep-v15-turbo"  # the tiny tree's DiT folder: the default variant key


@pytest.fixture
def dataset(tmp_path: Path) -> tuple[Storage, str]:
    storage = Storage(tmp_path / "root")
    return storage, new_dataset(storage, make_song_folder(tmp_path / "songs"))


def test_a_second_run_on_the_same_variant_refuses_before_any_work(dataset, tiny_ckpt):
    storage, slug = dataset
    with preprocess_lock(storage, slug, VARIANT, heartbeat_s=0):  # the first run, still going
        with pytest.raises(LockHeldError) as refused:
            preprocess_dataset(storage, slug, PreprocessOptions(), tiny_ckpt)
        assert str(refused.value).startswith(f"another preprocess run holds {slug}/{VARIANT} ")
        assert not storage.exists(layout.tensor_dir(slug, VARIANT))  # nothing encoded

        cli = CliRunner().invoke(
            app,
            ["run", slug, "--data", storage.url, "--checkpoints", str(tiny_ckpt)],
            terminal_width=300,
        )
        assert cli.exit_code == 2, cli.output
        (line,) = [line for line in cli.output.splitlines() if line.startswith("error: ")]
        assert line.startswith(f"error: another preprocess run holds {slug}/{VARIANT} since ")
        key = lock_key("preprocess", slug, VARIANT)
        assert line.endswith(f"wait for it or remove {storage.url_of(key)} if it died")


@pytest.mark.parametrize(
    "options",
    [
        PreprocessOptions(sample_ids=["whatever"]),  # a run over some samples only
        PreprocessOptions(dtype="bf16", max_duration_s=6.0),  # other tensor settings
    ],
    ids=["sample-ids", "other-settings"],
)
def test_runs_with_other_settings_or_samples_take_the_same_lock(dataset, tiny_ckpt, options):
    """Neither settings nor `sample_ids` name the folder, so neither may name the lock: two such
    runs would write the same files."""
    storage, slug = dataset
    with preprocess_lock(storage, slug, VARIANT, heartbeat_s=0):
        with pytest.raises(LockHeldError):
            preprocess_dataset(storage, slug, options, tiny_ckpt)
    assert not storage.exists(layout.tensor_dir(slug, VARIANT))


def test_a_failing_run_releases_the_lock(dataset, tiny_ckpt):
    storage, slug = dataset
    bad = PreprocessOptions(vae_chunk_frames=64, vae_overlap_frames=40)  # refused when planned
    with pytest.raises(InputError, match="must exceed twice vae_overlap_frames"):
        preprocess_dataset(storage, slug, bad, tiny_ckpt)
    assert not storage.exists(lock_key("preprocess", slug, VARIANT))
    with preprocess_lock(storage, slug, VARIANT, heartbeat_s=0):
        pass  # free


def test_a_finished_run_leaves_no_lock(plain_run):
    assert plain_run.result.processed > 0
    assert not plain_run.storage.exists(lock_key("preprocess", plain_run.slug, VARIANT))
