"""The discovery guard: an MM3 folder is kind `mm3`, never an ACE DiT, wherever it sits, and an
MM3-only install is listed without ACE weights and without an error (seed traps 9 and 19)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hotstep_ray.audition.checkpoints import pick
from hotstep_ray.cli.doctor_cmd import check_checkpoints
from hotstep_ray.models.discovery import discover, missing_for_stages
from hotstep_ray.models.errors import CheckpointError


def test_an_mm3_only_install_is_listed_as_mm3_without_errors(mm3_checkpoints):
    (found,) = discover(mm3_checkpoints)  # checkpoints/mm3/MiniMax-Music3/, nothing else
    assert (found.kind, found.name, found.format) == ("mm3", "mm3/MiniMax-Music3", "diffusers")
    assert found.usable and found.dtype == "float32" and found.size_bytes > 0
    missing = missing_for_stages([found])
    assert missing["train-dit"] == ["dit"]  # the ACE stages report what they lack, no raise
    rows = check_checkpoints(Path(mm3_checkpoints))
    assert any("mm3/MiniMax-Music3" in row.name and row.status == "ok" for row in rows)


def test_an_mm3_folder_at_the_root_is_never_taken_for_an_ace_dit(mm3_checkpoints, tmp_path):
    root = tmp_path / "checkpoints"
    shutil.copytree(mm3_checkpoints / "mm3" / "MiniMax-Music3", root / "MiniMax-Music3")
    (found,) = discover(root)
    assert found.kind == "mm3" and found.usable  # it has transformer/config.json, like ACE's
    with pytest.raises(CheckpointError, match="no usable dit"):
        pick(root, "dit")  # the ACE audition never loads the MM3 DiT


def test_an_mm3_folder_without_dit_weights_says_so(mm3_checkpoints, tmp_path):
    folder = tmp_path / "checkpoints" / "mm3" / "broken"
    shutil.copytree(mm3_checkpoints / "mm3" / "MiniMax-Music3", folder)
    for shard in (folder / "transformer").glob("*.safetensors"):
        shard.unlink()
    (found,) = discover(tmp_path / "checkpoints")
    assert found.kind == "mm3" and not found.usable
    assert any("missing shard" in problem for problem in found.problems)
