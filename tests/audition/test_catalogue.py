"""Adapter catalogue, trigger resolution order, trigger stacks, the stamper and its CLI."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from hotstep_ray.audition import catalogue
from hotstep_ray.audition.errors import NotFoundError
from hotstep_ray.audition.schemas import TriggerInfo
from hotstep_ray.cli import adapters_cmd
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage


def _weights(path, metadata=None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {"base_model.model.a.lora_A.weight": torch.arange(12.0).view(3, 4)}
    save_file(tensors, str(path), metadata=metadata)


@pytest.fixture()
def root(tmp_path, data_root):
    shutil.copytree(data_root / "adapters", tmp_path / "adapters")
    _weights(tmp_path / "adapters/lm-06b/band/adapter_model.safetensors")  # legacy unversioned
    _weights(tmp_path / "adapters/lm-06b/band/2025-12-31_23-59-59/adapter_model.safetensors")
    _weights(tmp_path / "adapters/lm/oldie-1.7B/adapter_model.safetensors")
    meta = {"hot_step_trigger": "zz", "hot_step_trigger_position": "append"}
    _weights(
        tmp_path / "adapters/dit-xl-turbo/solo/2026-03-01_00-00-00/lokr_weights.safetensors", meta
    )
    _weights(tmp_path / "adapters/rootdit/adapter_model.safetensors")  # legacy DiT at the root
    (tmp_path / "adapters/lm-06b/empty/2026-01-01_00-00-00").mkdir(parents=True)  # no weights
    return tmp_path


def test_list_every_adapter_with_base_run_size_trigger_time(root, runs):
    entries = {e.id: e for e in catalogue.list_adapters(Storage(root))}
    assert sorted(entries) == [
        "dit-turbo/crew/2026-02-03_04-05-06",
        "dit-xl-turbo/solo/2026-03-01_00-00-00",
        "lm-06b/band",
        "lm-06b/band/2025-12-31_23-59-59",
        "lm-06b/band/2026-01-02_03-04-05",
        "lm/oldie-1.7B",
        "rootdit",
    ]
    lm = entries["lm-06b/band/2026-01-02_03-04-05"]
    assert (lm.kind, lm.base, lm.artist, lm.run, lm.format) == (
        "lm",
        "0.6B",
        "band",
        lm.run,
        "lora",
    )
    assert lm.trained_at == "2026-01-02T03:04:05" and lm.size_bytes > 0
    assert (lm.trigger.word, lm.trigger.source) == ("band", "folder")
    dit = entries["dit-turbo/crew/2026-02-03_04-05-06"]
    assert (dit.base, dit.trigger.word, dit.trigger.source) == ("dit-turbo", "crewx", "embedded")
    solo = entries["dit-xl-turbo/solo/2026-03-01_00-00-00"]
    assert (solo.format, solo.trigger.placement) == ("lokr", "append")
    assert entries["lm/oldie-1.7B"].base == "1.7B" and entries["lm/oldie-1.7B"].legacy
    assert entries["lm/oldie-1.7B"].trigger.word == "oldie"
    assert entries["rootdit"].kind == "dit"


def test_trigger_resolution_order(root, runs):
    storage = Storage(root)
    dit = runs["dit"]
    override = TriggerInfo(word="mine", placement="append")
    assert catalogue.resolve_trigger(storage, dit, override).source == "override"
    assert catalogue.resolve_trigger(storage, dit).word == "crewx"  # embedded beats folder
    lm = catalogue.resolve_trigger(storage, runs["lm"])
    assert (lm.word, lm.source) == ("band", "folder")
    none = catalogue.resolve_trigger(storage, runs["lm"], folder_fallback=False)
    assert none.source == "none" and none.word == ""


def test_trigger_stack_mixes_prepend_and_append():
    specs = [
        TriggerInfo(word="a1", placement="prepend", source="embedded"),
        TriggerInfo(word="z9", placement="append", source="folder"),
        TriggerInfo(word="a2", placement="prepend", source="override"),
        TriggerInfo(word="a1", placement="prepend", source="folder"),
        TriggerInfo(word="", source="none"),
    ]
    assert catalogue.apply_triggers("rock", specs) == "a1, a2, rock, z9"
    assert catalogue.apply_triggers("a2 rock", specs) == "a1, a2 rock, z9"  # present: skipped
    replace = [*specs, TriggerInfo(word="only", placement="replace", source="embedded")]
    assert catalogue.apply_triggers("rock", replace) == "only"


def test_resolving_ids(root):
    storage = Storage(root)
    newest = "adapters/lm-06b/band/2026-01-02_03-04-05"
    assert catalogue.resolve_lm_adapter(storage, "band", "0.6B") == newest
    assert catalogue.resolve_lm_adapter(storage, "lm-06b/band", "0.6B") == newest
    old = "lm-06b/band/2025-12-31_23-59-59"
    assert catalogue.resolve_lm_adapter(storage, old, "0.6B") == f"adapters/{old}"
    with pytest.raises(InputError, match="1.7B"):
        catalogue.resolve_lm_adapter(storage, "lm/oldie-1.7B", "0.6B")
    with pytest.raises(NotFoundError):
        catalogue.resolve_lm_adapter(storage, "lm-06b/empty", "0.6B")
    with pytest.raises(InputError, match="dit-xl-turbo"):
        catalogue.resolve_dit_adapter(storage, "dit-xl-turbo/solo", "acestep-v15-turbo")
    assert catalogue.resolve_dit_adapter(storage, "rootdit", "acestep-v15-turbo").endswith(
        "rootdit"
    )


def _header_len(data: bytes) -> int:
    return struct.unpack("<Q", data[:8])[0]


def test_stamp_dry_run_writes_nothing_and_write_keeps_tensor_bytes(root):
    path = root / "adapters/lm-06b/band/2025-12-31_23-59-59/adapter_model.safetensors"
    before = path.read_bytes()
    payload = hashlib.sha256(before[8 + _header_len(before) :]).hexdigest()
    storage = Storage(root)
    key = "adapters/lm-06b/band/2025-12-31_23-59-59"
    dry = catalogue.stamp_triggers(storage, key, "bandword")
    assert dry[0].changed and not dry[0].written and dry[0].payload_sha256 == payload
    assert path.read_bytes() == before and not path.with_suffix(".safetensors.bak").exists()

    done = catalogue.stamp_triggers(storage, key, "bandword", "append", write=True)
    after = path.read_bytes()
    assert done[0].written and (8 + _header_len(after)) % 8 == 0
    assert hashlib.sha256(after[8 + _header_len(after) :]).hexdigest() == payload
    assert path.with_name(path.name + ".bak").read_bytes() == before
    header = json.loads(after[8 : 8 + _header_len(after)])
    assert header["__metadata__"]["hot_step_trigger"] == "bandword"
    assert header["__metadata__"]["hot_step_trigger_position"] == "append"
    assert header["__metadata__"]["modelspec.trigger_phrase"] == "bandword"
    assert torch.equal(
        load_file(str(path))["base_model.model.a.lora_A.weight"], torch.arange(12.0).view(3, 4)
    )
    again = catalogue.stamp_triggers(storage, key, "bandword", "append", write=True)
    assert not again[0].changed and not again[0].written  # idempotent


def test_stamp_folder_fallback_and_cli(root):
    runner = CliRunner()
    tree = root / "adapters/lm-06b"
    out = runner.invoke(adapters_cmd.app, ["stamp-triggers", str(tree), "--json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)
    assert {r["trigger"] for r in rows} == {"band"} and not any(r["written"] for r in rows)
    out = runner.invoke(adapters_cmd.app, ["stamp-triggers", str(tree), "--position", "replace"])
    assert out.exit_code == 2 and "replace" in out.output
    listed = runner.invoke(
        adapters_cmd.app, ["list", "--data", str(root), "--json", "--kind", "dit"]
    )
    assert listed.exit_code == 0
    assert {e["id"] for e in json.loads(listed.output)} == {
        "dit-turbo/crew/2026-02-03_04-05-06",
        "dit-xl-turbo/solo/2026-03-01_00-00-00",
        "rootdit",
    }


def test_the_folder_word_skips_a_runs_own_subfolders() -> None:
    """A run's diffusers-names copy and its milestones are the run's, not folders named for the
    artist: their trigger fallback is the artist's folder all the same."""
    run = "adapters/dit-turbo/band/2026-03-01_00-00-00"
    for key in (
        f"{run}/lokr_weights.safetensors",
        f"{run}/diffusers_names/lokr_weights.safetensors",
        f"{run}/milestones/ep0010/adapter_model.safetensors",
    ):
        assert catalogue.folder_word(key) == "band", key
