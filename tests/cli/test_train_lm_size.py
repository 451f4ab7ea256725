"""`train-lm` picks its LM: `--lm-model FOLDER` takes the size from its config.json; without it
or `--size`, the default size, else the largest LM present.

The folders here hold only a config.json (the size is read from it, no weight is): the 1.7B one
is `full_configs`' 1.7B config, the tiny one an architecture of no released size. Training itself
is replaced by a stub that records the spec the command built.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hotstep_ray.cli.train_lm_cmd import app, lm_folder
from hotstep_ray.core.contracts import TrainLmOptions
from hotstep_ray.core.errors import InputError
from hotstep_ray.models.full_configs import LM_CONFIGS
from hotstep_ray.training import lm, lm_save, lm_spec, lm_vram

CODES = "tensors/band/v1/lm_codes.jsonl"


def _lm_folder(path: Path, config: dict) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return path


@pytest.fixture
def checkpoints(tmp_path: Path) -> Path:
    root = tmp_path / "checkpoints"
    _lm_folder(root / "acestep-5Hz-lm-1.7B", LM_CONFIGS["1.7B"])
    tiny = {**LM_CONFIGS["0.6B"], "hidden_size": 32, "num_hidden_layers": 2}
    _lm_folder(root / "tiny-lm", tiny)
    return root


@pytest.fixture
def trained(monkeypatch) -> list[lm_spec.LmTrainSpec]:
    """The specs `run_lm_training` was called with (it returns an empty extract-only result)."""
    seen: list[lm_spec.LmTrainSpec] = []

    def stub(spec, storage, **_):
        seen.append(spec)
        return lm_save.LmRunResult(run_key="", files=[CODES], log={}, finished=True)

    monkeypatch.setattr(lm, "run_lm_training", stub)
    return seen


def _train(checkpoints: Path, tmp_path: Path, *args: str):
    argv = ["run", "band", "--data", str(tmp_path / "data"), "--checkpoints", str(checkpoints)]
    return CliRunner().invoke(app, [*argv, "--codes", CODES, *args], terminal_width=200)


def test_the_folder_size_wins_over_the_default(checkpoints, tmp_path, trained) -> None:
    folder = checkpoints / "acestep-5Hz-lm-1.7B"
    for named in (str(folder), folder.name):  # a path, or a name under --checkpoints
        result = _train(checkpoints, tmp_path, "--lm-model", named)
        assert result.exit_code == 0, result.output
        spec = trained.pop()
        assert spec.options.lm_size == "1.7B" and Path(spec.lm_dir) == folder
    assert TrainLmOptions().lm_size == "4B"  # what it would have been


def test_an_explicit_size_must_match_the_folder(checkpoints, tmp_path, trained) -> None:
    folder = str(checkpoints / "acestep-5Hz-lm-1.7B")
    same = _train(checkpoints, tmp_path, "--lm-model", folder, "--size", "1.7B")
    assert same.exit_code == 0, same.output
    assert trained.pop().options.lm_size == "1.7B"
    other = _train(checkpoints, tmp_path, "--lm-model", folder, "--size", "4B")
    assert other.exit_code == 2 and not trained  # refused before any training
    message = other.output.strip()
    assert "\n" not in message and message.startswith("error:")
    assert "1.7B model" in message and "not 4B" in message


def test_an_unknown_architecture_keeps_the_size_asked_for(checkpoints, tmp_path, trained) -> None:
    folder = str(checkpoints / "tiny-lm")
    assert _train(checkpoints, tmp_path, "--lm-model", folder).exit_code == 0
    assert trained.pop().options.lm_size == TrainLmOptions().lm_size
    assert _train(checkpoints, tmp_path, "--lm-model", folder, "--size", "0.6B").exit_code == 0
    assert trained.pop().options.lm_size == "0.6B"


def test_without_a_folder_the_size_picks_the_official_one(checkpoints, tmp_path, trained) -> None:
    result = _train(checkpoints, tmp_path, "--size", "1.7B")
    assert result.exit_code == 0, result.output
    spec = trained.pop()
    assert spec.options.lm_size == "1.7B" and Path(spec.lm_dir).name == "acestep-5Hz-lm-1.7B"


def test_lm_folder_and_lm_size_of(checkpoints) -> None:
    folder, options = lm_folder(str(checkpoints), TrainLmOptions(lm_model="acestep-5Hz-lm-1.7B"))
    assert folder == checkpoints / "acestep-5Hz-lm-1.7B" and options.lm_size == "1.7B"
    dims = lm_vram.LmDims.from_config(LM_CONFIGS["4B"])
    assert lm_spec.lm_size_of(dims, "0.6B", explicit=False) == "4B"
    assert lm_spec.lm_size_of(dims, "4B") == "4B"
    with pytest.raises(InputError, match="holds a 4B model"):
        lm_spec.lm_size_of(dims, "0.6B")  # explicit by default: the trainers' own check


def test_without_a_size_or_folder_the_largest_present_lm_trains(
    checkpoints, tmp_path, trained
) -> None:
    """The contract's 4B is not in this tree: the 1.7B that is trains (as `make` picks it),
    while an explicit --size 4B still names the missing folder."""
    result = _train(checkpoints, tmp_path)
    assert result.exit_code == 0, result.output
    spec = trained.pop()
    assert spec.options.lm_size == "1.7B"
    assert Path(spec.lm_dir) == checkpoints / "acestep-5Hz-lm-1.7B"
    missing = _train(checkpoints, tmp_path, "--size", "4B")
    assert missing.exit_code == 2 and "acestep-5Hz-lm-4B" in missing.output
