"""`hotstep-ray doctor`: the checks on a tmp data root and the tiny checkpoint tree."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from hotstep_ray.cli.doctor_cmd import check_checkpoints, check_keys, check_storage, run_checks
from hotstep_ray.cli.main import app

pytestmark = pytest.mark.slow  # the tiny tree and the model libraries: ~10 s
SECRET = "sk-test-DO-NOT-PRINT-4242"


@pytest.fixture(scope="module")
def tiny_tree(tmp_path_factory):
    from hotstep_ray.models.tiny_tree import make_tiny_tree

    return make_tiny_tree(tmp_path_factory.mktemp("checkpoints"))


def test_doctor_is_ready_on_the_tiny_tree_and_never_prints_a_key(tmp_path, tiny_tree, monkeypatch):
    for name in ("GENIUS_ACCESS_TOKEN", "GEMINI_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.setenv(name, SECRET)
    result = CliRunner().invoke(
        app, ["doctor", "--data", str(tmp_path / "data"), "--checkpoints", str(tiny_tree)]
    )
    assert result.exit_code == 0, result.output
    for name in ("python", "torch", "ray", "essentia", "soundfile", "checkpoints", "storage"):
        assert f"│ {name} " in result.output, name
    assert "GENIUS_ACCESS_TOKEN" in result.output and "ready (" in result.output
    assert SECRET not in result.output and "DO-NOT" not in result.output
    # the probe file is gone again
    assert list((tmp_path / "data").iterdir()) == []

    rows = {row.name.strip(): row for row in run_checks(str(tmp_path / "data"), tiny_tree)}
    assert rows["soundfile"].status == "ok" and "MP3 write ok" in rows["soundfile"].detail
    for stage in ("preprocess", "train-dit", "train-lm", "audition"):
        assert rows[f"stage {stage}"].status == "ok"
    for folder in ("acestep-v15-turbo", "vae", "Qwen3-Embedding-0.6B", "acestep-5Hz-lm-0.6B"):
        assert rows[folder].status == "ok", folder
    assert all(SECRET not in f"{row.detail} {row.fix}" for row in rows.values())


def test_doctor_fails_on_missing_weights_and_unwritable_storage(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    rows = {row.name: row for row in check_checkpoints(empty)}
    assert rows["stage train-lm"].status == "fail" and "lm" in rows["stage train-lm"].detail
    assert rows["stage preprocess"].fix.startswith("add dit, vae, text_encoder")

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    (storage,) = check_storage(str(blocker / "data"))
    assert storage.status == "fail" and storage.fix

    keys = {row.name: row for row in check_keys({"GEMINI_API_KEY": SECRET})}
    assert keys["GEMINI_API_KEY"].status == "ok" and keys["OPENAI_API_KEY"].status == "warn"

    result = CliRunner().invoke(
        app, ["doctor", "--data", str(blocker / "data"), "--checkpoints", str(empty)]
    )
    assert result.exit_code == 1
    assert "not ready:" in result.output and "storage" in result.output
