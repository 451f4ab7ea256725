"""The DiT's trigger is the tensors' own: the text conditions (the tag in every caption) were
encoded at preprocess time, so a `--trigger` that differs could only be stamped into the export's
metadata, naming a word the adapter never saw. It is refused before anything loads."""

from __future__ import annotations

import pytest
from safetensors.torch import save as save_safetensors_bytes
from test_dit_support import SLUG, song_tensors, write_cache
from typer.testing import CliRunner

from hotstep_ray.cli.train_dit_cmd import app
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage
from hotstep_ray.training import dit_data, dit_setup


def test_the_cli_refuses_another_trigger_in_one_line_before_anything_runs(tmp_path) -> None:
    storage = Storage(tmp_path / "data")
    write_cache(storage)  # preprocessed with the tag "zqx", prepended
    args = [SLUG, "--data", storage.url, "--no-ray", "--dit", str(tmp_path / "no-dit")]
    args += ["--init-adapter", ""]
    for extra, flag in (
        (["--trigger", "other"], "--trigger 'other'"),
        (["--trigger", ""], "--trigger ''"),  # would drop the word the adapter answers to
        (["--trigger-position", "append"], "--trigger-position append"),
    ):
        result = CliRunner().invoke(app, [*args, *extra])
        assert result.exit_code == 2, result.output
        assert result.output.count("error:") == 1 and flag in result.output
        assert "hotstep-ray dataset build <songs folder>" in result.output
        assert f"hotstep-ray preprocess run {SLUG}" in result.output
    assert not storage.exists("jobs") and not storage.exists("adapters")  # nothing started


def test_the_caches_own_trigger_is_kept_and_another_is_refused(tmp_path) -> None:
    storage = Storage(tmp_path)
    cache = dit_data.load_cache(storage, write_cache(storage))
    assert dit_setup.resolve_trigger(dit_setup.DitSettings(), cache) == ("zqx", "prepend")
    same = dit_setup.DitSettings(trigger="zqx", trigger_position="prepend")
    assert dit_setup.resolve_trigger(same, cache) == ("zqx", "prepend")
    with pytest.raises(InputError, match="preprocess run band"):
        dit_setup.resolve_trigger(dit_setup.DitSettings(trigger="other"), cache, SLUG)
    with pytest.raises(InputError, match="--trigger-position replace"):
        dit_setup.resolve_trigger(dit_setup.DitSettings(trigger_position="replace"), cache)


def test_the_early_check_reads_the_tag_as_the_cache_does(tmp_path) -> None:
    storage = Storage(tmp_path)
    key = write_cache(storage)
    assert dit_setup.cache_trigger(storage, key) == dit_data.load_cache(storage, key).trigger()
    key = write_cache(storage, meta={"variant_key": "turbo"})  # no meta tag: the file headers'
    for index in range(3):
        tags = {"custom_tag": "hdr", "tag_position": "append"} if index else {}
        data = save_safetensors_bytes(song_tensors(20, 4, seed=index), metadata=tags or None)
        storage.write_bytes(f"{key}/song{index}.safetensors", data)
    found = dit_setup.cache_trigger(storage, key)
    assert found == dit_data.load_cache(storage, key).trigger() == ("hdr", "append")
    untagged = write_cache(storage, variant="plain", meta={"variant_key": "plain"})
    assert dit_setup.cache_trigger(storage, untagged) == (None, "prepend")
    with pytest.raises(InputError, match="the tag 'none'"):  # adding a word is refused too
        dit_setup.check_trigger_request(
            storage, dit_setup.DitSettings(trigger="new"), SLUG, "plain"
        )
