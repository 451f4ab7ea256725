"""Layout: names, DiT shorthands, run stamps and newest-run resolution (incl. legacy forms)."""

from __future__ import annotations

import pytest

from hotstep_ray.core import layout
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage


@pytest.mark.parametrize(
    ("model", "shorthand"),
    [
        ("acestep-v15-xl-turbo-BF16.gguf", "dit-xl-turbo"),
        ("acestep-v15-turbo", "dit-turbo"),
        ("acestep-v15-base-Q8_0.gguf", "dit-base"),
        ("acestep-v15-merge-base-sft-turbo-xl-thirds", "dit-xl-thirds"),
        ("acestep-v15-merge-sft-turbo-xl-ta-0.3-F16.gguf", "dit-xl-sft-turbo-ta03"),
        ("acestep-v15-turbo-shift3", "dit-turbo-shift3"),
        ("acestep-v15-my-merge-1.5", "dit-my-merge-15"),
        ("/models/acestep-v15-sft", "dit-sft"),
        ("", "dit-unknown-base"),
    ],
)
def test_dit_shorthand(model, shorthand):
    assert layout.dit_shorthand(model) == shorthand


def test_names_are_checked_before_they_become_folders():
    assert layout.lm_adapter_base("1.7B") == "adapters/lm-17b"
    for bad in ["../x", ".hidden", "a b", "", "x" * 65]:
        with pytest.raises(InputError):
            layout.dataset_dir(bad)
    with pytest.raises(InputError):
        layout.lm_adapter_base("7B")


def test_slugify():
    assert layout.slugify("My Band: Live!") == "my-band-live"
    assert layout.slugify("***") == "dataset"
    assert len(layout.slugify("a" * 100)) == 64


def _weights(storage, key, name="adapter_model.safetensors"):
    storage.write_bytes(f"{key}/{name}", b"w")


def test_new_run_dirs_never_collide(tmp_path):
    storage = Storage(tmp_path)
    now = 1_700_000_000.0
    first = layout.new_run_dir(storage, "adapters/lm-06b", "artist", now)
    assert layout.is_run_stamp(first.rsplit("/", 1)[-1])
    storage.makedirs(first)
    second = layout.new_run_dir(storage, "adapters/lm-06b", "artist", now)
    assert second == first + "-2"


def test_latest_run_wins_and_runs_without_weights_are_skipped(tmp_path):
    storage = Storage(tmp_path)
    base = "adapters/dit-turbo"
    _weights(storage, f"{base}/me/2026-01-01_10-00-00")
    _weights(storage, f"{base}/me/2026-02-01_10-00-00", "lokr_weights.safetensors")
    storage.makedirs(f"{base}/me/2026-03-01_10-00-00")  # crashed run: no weights
    _weights(storage, f"{base}/me/.2027-01-01_00-00-00")  # hidden
    assert layout.resolve_adapter(storage, base, "me") == f"{base}/me/2026-02-01_10-00-00"
    _weights(storage, f"{base}/me/2026-04-01_10-00-00-calibrated")
    assert layout.latest_run_dir(storage, f"{base}/me", skip_calibrated=True).endswith(
        "2026-02-01_10-00-00"
    )


def test_legacy_forms_are_read(tmp_path):
    storage = Storage(tmp_path)
    _weights(storage, "adapters/lm-4b/flat")  # weights directly in the artist folder
    assert layout.resolve_adapter(storage, "adapters/lm-4b", "flat") == "adapters/lm-4b/flat"
    _weights(storage, "adapters/lm/old-1.7B")  # flat lm/<name>-<size>
    assert layout.resolve_adapter(storage, "adapters/lm-17b", "old") == "adapters/lm/old-1.7B"
    _weights(storage, "adapters/rootdit")  # DiT adapter at the adapters root
    assert layout.resolve_adapter(storage, "adapters/dit-xl-turbo", "rootdit") == "adapters/rootdit"
    assert layout.resolve_adapter(storage, "adapters/dit-xl-turbo", "nobody") is None


def test_mm3_dit_adapters_have_their_own_folder_and_newest_run(tmp_path):
    storage = Storage(tmp_path)
    assert layout.mm3_dit_adapter_base() == "adapters/mm3-dit"
    assert layout.dit_adapter_base("mm3") != layout.mm3_dit_adapter_base()  # never an ACE folder
    assert layout.latest_mm3_dit_run(storage, "band") is None
    old = layout.new_run_dir(storage, layout.mm3_dit_adapter_base(), "band", now=1e9)
    new = layout.new_run_dir(storage, layout.mm3_dit_adapter_base(), "band", now=2e9)
    empty = layout.new_run_dir(storage, layout.mm3_dit_adapter_base(), "band", now=3e9)
    for run in (old, new):
        storage.write_bytes(f"{run}/{layout.MM3_DIT_WEIGHTS}", b"x")
    storage.write_bytes(f"{empty}/train_report.json", b"{}")  # a run without weights
    assert new.startswith("adapters/mm3-dit/band/")
    assert layout.latest_mm3_dit_run(storage, "band") == new
    with pytest.raises(InputError):
        layout.latest_mm3_dit_run(storage, "../x")


def test_job_and_tensor_files_are_named_in_one_place():
    assert layout.job_result("j1") == "jobs/j1/result.json"
    assert layout.job_meta("j1") == "jobs/j1/_meta.json"
    assert layout.job_loss_plot("j1") == "jobs/j1/loss.png"
    assert layout.job_side_events("j1", "train_events") == "jobs/j1/train_events.jsonl"
    assert layout.preprocess_meta(layout.tensor_dir("band", "turbo")) == (
        "tensors/band/turbo/preprocess_meta.json"
    )
    with pytest.raises(InputError):
        layout.job_side_events("j1", "../escape")


def test_find_lm_codes_picks_the_variant_or_the_newest_and_says_what_is_missing(tmp_path):
    import os

    import pytest

    from hotstep_ray.core.errors import InputError
    from hotstep_ray.core.layout import find_lm_codes, tensor_dir
    from hotstep_ray.core.storage import Storage

    storage = Storage(tmp_path)
    with pytest.raises(InputError, match="run preprocess first"):
        find_lm_codes(storage, "band")
    old, new = (f"{tensor_dir('band', v)}/lm_codes.jsonl" for v in ("base", "turbo"))
    for key, stamp in ((old, 1_000), (new, 2_000)):
        storage.write_text(key, "{}\n")
        os.utime(storage.local_path(key), (stamp, stamp))
    assert find_lm_codes(storage, "band") == new  # the most recently written
    assert find_lm_codes(storage, "band", "base") == old
    with pytest.raises(InputError, match="missing"):
        find_lm_codes(storage, "band", "sft")
