"""A bad option value is one red line per error that names the flag, what it allows and the value
given (`error: --epochs must be ≥ 1 (got -3)`), exit code 2: never pydantic's multi-line dump.

Each command here builds its contract from the options before it touches a model or a dataset, so
the refusal comes first and an empty storage root is enough.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from hotstep_ray.cli.common import validation_messages
from hotstep_ray.cli.main import app
from hotstep_ray.core.contracts import Sample, TrainDitOptions


def _errors(result) -> list[str]:
    """The command's output lines, each of which must be an `error:` line."""
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines and all(line.startswith("error: ") for line in lines), result.output
    return [line.removeprefix("error: ") for line in lines]


def _refused(args: list[str]) -> list[str]:
    result = CliRunner().invoke(app, args, terminal_width=200)
    assert result.exit_code == 2, result.output
    assert "pydantic" not in result.output and "validation error" not in result.output
    return _errors(result)


@pytest.fixture
def data(tmp_path: Path) -> str:
    return str(tmp_path / "data")


def test_train_dit_out_of_range_value_names_the_flag_bound_and_value(data: str) -> None:
    args = ["train-dit", "run", "band", "--data", data, "--variant", "turbo", "--epochs", "-3"]
    assert _refused(args) == ["--epochs must be ≥ 1 (got -3)"]


def test_train_dit_bad_choice_lists_the_choices(data: str) -> None:
    args = ["train-dit", "run", "band", "--data", data, "--variant", "turbo"]
    assert _refused([*args, "--adapter-type", "dora"]) == [
        "--adapter-type must be one of lora, lokr (got dora)"
    ]
    assert _refused([*args, "--stages", "train,bake"]) == [
        "--stages must be one of train, export (got bake)"
    ]
    assert _refused([*args, "--learning-rate", "0"]) == ["--learning-rate must be > 0 (got 0)"]
    assert _refused([*args, "--lokr-dim", "wide"]) == ["--lokr-dim must be an integer (got wide)"]


def test_several_errors_are_one_line_each(data: str) -> None:
    args = ["train-dit", "run", "band", "--data", data, "--variant", "turbo"]
    lines = _refused([*args, "--epochs", "5000", "--adapter-type", "dora"])
    assert sorted(lines) == [
        "--adapter-type must be one of lora, lokr (got dora)",
        "--epochs must be ≤ 2000 (got 5000)",
    ]


def test_a_check_across_fields_spells_the_fields_as_flags(data: str) -> None:
    args = ["train-dit", "run", "band", "--data", data, "--variant", "turbo"]
    lines = _refused([*args, "--t-min", "0.9", "--t-max", "0.2"])
    assert lines == ["--t-min (0.9) must be below --t-max (0.2)"]


def test_train_lm_names_the_flag_that_set_a_differently_named_field(
    data: str, tmp_path: Path
) -> None:
    # `--size` sets TrainLmOptions.lm_size: the line names the flag the user typed
    base = ["train-lm", "run", "band", "--data", data, "--checkpoints", str(tmp_path)]
    assert _refused([*base, "--size", "2B"]) == ["--size must be one of 0.6B, 1.7B, 4B (got 2B)"]
    assert _refused([*base, "--lr", "2"]) == ["--lr must be ≤ 1 (got 2)"]


def test_preprocess_bad_choices(data: str, tmp_path: Path) -> None:
    args = ["preprocess", "run", "band", "--data", data, "--checkpoints", str(tmp_path)]
    lines = _refused([*args, "--normalize", "loud", "--dtype", "f16"])
    assert sorted(lines) == [
        "--dtype must be one of f32, bf16 (got f16)",
        "--normalize must be one of none, peak (got loud)",
    ]


def test_models_make_random_and_mm3(data: str, tmp_path: Path) -> None:
    tree = str(tmp_path / "tree")
    assert _refused(["models", "make-random", tree, "--seed", "-1"]) == [
        "--seed must be ≥ 0 (got -1)"
    ]
    mm3 = ["mm3", "preprocess", "band", "--data", data, "--checkpoints", str(tmp_path)]
    assert _refused([*mm3, "--mode", "bogus"]) == [
        "--mode must be one of sampled, aligned (got bogus)"
    ]
    assert not Path(tree).exists()


def test_a_field_no_option_set_is_named_by_its_model() -> None:
    # a stored record that fails validation is not blamed on a flag the user never typed
    with pytest.raises(ValidationError) as caught:
        Sample.model_validate(
            {"sampleId": "a", "relPath": "a", "audioPath": "a", "filename": "a", "bpm": "fast"}
        )
    lines = validation_messages(caught.value, {"data": "--data"}, {"data": "./data"})
    assert sorted(lines) == [
        "bpm (Sample) must be an integer (got fast)",
        "sidecar_path (Sample) is required",
    ]


def test_camel_case_locations_map_to_the_snake_case_flag() -> None:
    with pytest.raises(ValidationError) as caught:
        TrainDitOptions.model_validate({"adapterType": "dora", "cfgRatio": 2})
    lines = validation_messages(
        caught.value,
        {"adapter_type": "--adapter-type", "cfg_ratio": "--cfg-ratio"},
        {"adapter_type": None, "cfg_ratio": None},
    )
    assert lines == [
        "--adapter-type must be one of lora, lokr (got dora)",
        "--cfg-ratio must be ≤ 1 (got 2)",
    ]


def test_calibrate_refuses_bad_grid_and_sampling_values_before_reading_the_run(data: str) -> None:
    # The run folder does not exist: the options are checked first, so only they are reported.
    args = ["calibrate", "run", "adapters/lm-1.7B/band/x", "--data", data, "--checkpoints", data]
    assert _refused([*args, "--seeds", "0"]) == ["--seeds must be ≥ 1 (got 0)"]
    assert _refused([*args, "--top-p", "many"]) == ["--top-p must be a number (got many)"]
    assert _refused([*args, "--scales", "3"]) == ["--scales scale 3: must be in (0, 2] (got 3)"]


def test_make_and_demo_refuse_a_bad_value_before_any_stage(data: str, tmp_path: Path) -> None:
    # their options come from core.contracts.MakeOptions: checked before Ray or the songs
    songs = str(tmp_path / "no-such-folder")
    assert _refused(["make", songs, "--data", data, "--epochs", "0"]) == [
        "--epochs must be ≥ 1 (got 0)"
    ]
    assert _refused(["demo", "--data", data, "--epochs", "many"]) == [
        "--epochs must be an integer (got many)"
    ]
    assert not Path(data).exists()
