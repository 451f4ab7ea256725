"""`hotstep-ray models list|verify` and the discovery behind `list`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from hotstep_ray.cli.models_cmd import app
from hotstep_ray.models.discovery import discover, missing_for_stages
from hotstep_ray.models.tiny_dit import write_tiny_dit

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TINY = FIXTURES / "acestep15-tiny"
runner = CliRunner()


def _weights(path: Path, dtype: torch.dtype = torch.bfloat16, **shapes: tuple[int, ...]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {name: torch.zeros(shape, dtype=dtype) for name, shape in shapes.items()}
    save_file(tensors, str(path))


def _json(path: Path, value: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value))


@pytest.fixture
def checkpoints(tmp_path: Path) -> Path:
    """A checkpoints/ tree: two tiny DiTs, a VAE, a text encoder, a sharded LM missing one shard,
    and a GGUF-only DiT."""
    root = tmp_path / "checkpoints"
    write_tiny_dit(root / "acestep-v15-turbo", "turbo")
    write_tiny_dit(root / "acestep-v15-xl-base", "xl-base")
    _json(root / "vae" / "config.json", {"_class_name": "AutoencoderOobleck"})
    _weights(root / "vae" / "diffusion_pytorch_model.safetensors", torch.float32, w=(8, 8))
    qwen = root / "Qwen3-Embedding-0.6B"
    # The released embedding config may name a CausalLM class: the folder name decides.
    _json(qwen / "config.json", {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]})
    _weights(qwen / "model.safetensors", w=(16, 16))
    (qwen / "tokenizer.json").write_text("{}")
    lm = root / "acestep-5Hz-lm-1.7B"
    _json(lm / "config.json", {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]})
    shards = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    _json(lm / "model.safetensors.index.json", {"weight_map": shards})
    _weights(lm / shards["a"], a=(4, 4))
    (lm / "tokenizer.json").write_text("{}")
    (root / "acestep-v15-base-q8").mkdir()
    (root / "acestep-v15-base-q8" / "model-Q8_0.gguf").write_bytes(b"GGUF")
    (root / "notes").mkdir()  # not a checkpoint: ignored
    return root


def test_discover_reports_variants_dtypes_and_problems(checkpoints: Path) -> None:
    found = {info.name: info for info in discover(checkpoints)}
    assert sorted(found) == [
        "Qwen3-Embedding-0.6B",
        "acestep-5Hz-lm-1.7B",
        "acestep-v15-base-q8",
        "acestep-v15-turbo",
        "acestep-v15-xl-base",
        "vae",
    ]
    turbo, xl = found["acestep-v15-turbo"], found["acestep-v15-xl-base"]
    assert (turbo.kind, turbo.variant, turbo.layout, turbo.dtype) == (
        "dit",
        "turbo",
        "2b",
        "float32",
    )
    assert (xl.variant, xl.layout) == ("xl-base", "xl")
    assert turbo.usable and turbo.size_bytes > 2_000_000
    assert found["Qwen3-Embedding-0.6B"].kind == "text_encoder"
    assert found["Qwen3-Embedding-0.6B"].dtype == "bfloat16"
    lm = found["acestep-5Hz-lm-1.7B"]
    assert (lm.kind, lm.variant) == ("lm", "1.7B")
    assert lm.problems == ["missing shard model-00002-of-00002.safetensors"]
    assert "GGUF" in found["acestep-v15-base-q8"].problems[0]
    assert missing_for_stages(list(found.values())) == {
        "preprocess": [],
        "train-dit": [],
        "train-lm": ["lm"],
        "audition": ["lm (optional)"],
    }


def test_discover_flags_truncated_and_quantized_weights(checkpoints: Path) -> None:
    lm = checkpoints / "acestep-5Hz-lm-1.7B"
    _weights(lm / "model-00002-of-00002.safetensors", torch.int8, b=(4, 4))
    path = checkpoints / "vae" / "diffusion_pytorch_model.safetensors"
    path.write_bytes(path.read_bytes()[:-10])
    found = {info.name: info for info in discover(checkpoints)}
    assert "I8" in found["acestep-5Hz-lm-1.7B"].problems[0]
    assert "truncated" in found["vae"].problems[0]
    assert missing_for_stages(list(found.values()))["preprocess"] == ["vae"]


def test_list_command_json_and_table(checkpoints: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["list", "--checkpoints", str(checkpoints), "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert len(payload["components"]) == 6
    assert payload["stages"]["train-lm"] == ["lm"]
    table = runner.invoke(app, ["list", "--checkpoints", str(checkpoints)])
    assert table.exit_code == 0
    assert "train-dit: ready" in table.stdout
    missing = runner.invoke(app, ["list", "--checkpoints", str(tmp_path / "absent")])
    assert missing.exit_code == 2


def test_verify_command_passes_on_the_fixture() -> None:
    result = runner.invoke(
        app,
        [
            "verify",
            "--checkpoint",
            str(TINY / "checkpoint"),
            "--cases",
            str(TINY / "reference"),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert len(rows) == 18 and all(row["status"] == "pass" for row in rows)


def test_verify_command_fails_on_a_corrupted_copy(tmp_path: Path) -> None:
    cases = Path(
        shutil.copytree(TINY / "reference", tmp_path / "cases", copy_function=shutil.copyfile)
    )
    path = cases / "dit_b2_t40.safetensors"
    tensors = load_file(str(path))
    tensors["out.velocity"][0, 3, 5] += 1e-3  # one value, ten times the tolerance
    save_file(tensors, str(path))
    result = runner.invoke(
        app, ["verify", "--checkpoint", str(TINY / "checkpoint"), "--cases", str(cases)]
    )
    assert result.exit_code == 1
    assert "1 of 18 cases failed" in result.stdout
    bad_input = runner.invoke(
        app, ["verify", "--checkpoint", str(TINY / "checkpoint"), "--cases", str(tmp_path)]
    )
    assert bad_input.exit_code == 2


def test_make_tiny_writes_a_tree_every_stage_can_use(tmp_path: Path) -> None:
    result = runner.invoke(app, ["make-tiny", str(tmp_path / "tiny"), "--seed", "3"])
    assert result.exit_code == 0, result.output
    found = discover(tmp_path / "tiny")
    assert {info.kind for info in found} == {"dit", "vae", "text_encoder", "lm"}
    assert all(info.usable for info in found)
    assert missing_for_stages(found) == {
        "preprocess": [],
        "train-dit": [],
        "train-lm": [],
        "audition": [],
    }
