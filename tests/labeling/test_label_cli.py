"""`hotstep-ray label …` through typer's runner (plain path: `--no-ray`)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hotstep_ray.cli.label_cmd import app
from hotstep_ray.dataset.store import load_dataset

runner = CliRunner()
KEYS = ("GENIUS_ACCESS_TOKEN", "GEMINI_API_KEY", "OPENAI_API_KEY")


@pytest.fixture(autouse=True)
def no_keys(monkeypatch):
    for name in KEYS:  # never reach a real service from a test, whatever the shell has set
        monkeypatch.delenv(name, raising=False)


def test_run_labels_a_dataset_offline(song_dataset):
    ds = song_dataset
    data = str(ds.storage.local_path(""))
    args = ["run", ds.slug, "--data", data, "--no-ray", "--caption-provider", "offline", "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["labeled"] == 4 and report["failed"] == 0
    assert any("GENIUS_ACCESS_TOKEN" in w for w in report["warnings"])  # downgraded, not failed
    assert all(s.label_status == "labeled" for s in load_dataset(ds.storage, ds.slug).samples)


def test_explicit_genius_without_a_token_is_a_usage_error(song_dataset):
    ds = song_dataset
    data = str(ds.storage.local_path(""))
    result = runner.invoke(app, ["run", ds.slug, "--data", data, "--no-ray", "--genius"])
    assert result.exit_code == 2 and "GENIUS_ACCESS_TOKEN" in result.output
    bad = runner.invoke(app, ["run", ds.slug, "--data", data, "--merge-policy", "newest"])
    assert bad.exit_code == 2 and "--merge-policy" in bad.output
    # a model without its provider was dropped (the auto-picked provider used its own default)
    model_only = ["run", ds.slug, "--data", data, "--no-ray", "--caption-model", "gemini-x"]
    orphan = runner.invoke(app, model_only)
    assert orphan.exit_code == 2 and "--caption-model needs --caption-provider" in orphan.output


def test_providers_lists_what_is_configured(monkeypatch):
    monkeypatch.setenv("GEMINI_API_KEY", "secret-value")
    result = runner.invoke(app, ["providers", "--json"])
    assert result.exit_code == 0
    rows = {row["provider"]: row["configured"] for row in json.loads(result.output)}
    assert rows == {
        "essentia": True,
        "genius": False,
        "offline": True,
        "gemini": True,
        "openai": False,
    }
    assert "secret-value" not in result.output
    assert runner.invoke(app, ["providers"]).exit_code == 0
