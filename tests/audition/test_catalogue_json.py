"""The adapter catalogue on the wire (`GET /adapters`, `adapters list --json`) is camelCase, as
every other route and the trigger's own contract."""

from __future__ import annotations

import json

import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from hotstep_ray.audition import catalogue
from hotstep_ray.cli import adapters_cmd
from hotstep_ray.core.storage import Storage

RUN = "dit-xl-turbo/solo/2026-03-01_00-00-00"
KEYS = {
    "id",
    "kind",
    "baseFolder",
    "base",
    "artist",
    "run",
    "legacy",
    "format",
    "weights",
    "sizeBytes",
    "trainedAt",
    "trigger",
}


def _root(tmp_path):
    path = tmp_path / "adapters" / RUN / "lokr_weights.safetensors"
    path.parent.mkdir(parents=True)
    meta = {"hot_step_trigger": "zz", "hot_step_trigger_position": "append"}
    save_file({"lycoris_a.lokr_w1": torch.ones(2, 2)}, str(path), metadata=meta)
    return tmp_path


def test_catalogue_rows_are_camel_case(tmp_path):
    (entry,) = catalogue.list_adapters(Storage(_root(tmp_path)))
    row = entry.to_json_dict()
    assert set(row) == KEYS
    assert (row["id"], row["baseFolder"], row["trainedAt"]) == (
        RUN,
        "dit-xl-turbo",
        "2026-03-01T00:00:00",
    )
    assert row["sizeBytes"] == entry.size_bytes > 0
    trigger = row["trigger"]
    assert (trigger["word"], trigger["placement"], trigger["source"]) == (
        "zz",
        "append",
        "embedded",
    )
    json.dumps(row)  # plain JSON


def test_adapters_list_json_prints_the_same_rows(tmp_path):
    root = _root(tmp_path)
    listed = CliRunner().invoke(adapters_cmd.app, ["list", "--data", str(root), "--json"])
    assert listed.exit_code == 0, listed.output
    (row,) = json.loads(listed.output)
    # the catalogue's row, plus the run's state and its checks (camelCase too)
    checks = {"deltaVerdict", "deltaFlagged", "calibration"}
    assert set(row) == KEYS | {"status", "statusDetail"} | checks and row["id"] == RUN
