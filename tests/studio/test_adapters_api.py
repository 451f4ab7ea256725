"""The adapters list over HTTP: every trained run with its state, as `adapters list --json`
prints it; a bad kind answers 4xx and lists nothing."""

from __future__ import annotations

import json
import struct

from typer.testing import CliRunner

from hotstep_ray.cli.adapters_cmd import app as adapters_app
from hotstep_ray.core.storage import Storage

API = "/api/training"


def _lm_runs(storage: Storage) -> None:
    """A finished LM run (weights and its log) and an unfinished one (a checkpoint, no adapter),
    in the files the LM trainer writes."""
    finished, unfinished = (f"adapters/lm-06b/band/2026-01-0{d}_10-00-00" for d in (1, 2))
    header = json.dumps({"__metadata__": {"hot_step_trigger": "band"}}).encode()
    weights = struct.pack("<Q", len(header)) + header
    storage.write_bytes(f"{finished}/adapter_model.safetensors", weights)
    log = {"format": "hot-step-lm-train-v1", "stop_reason": "epochs", "epochs_run": 40}
    storage.write_json(f"{finished}/lm_train_log.json", log)
    config = {"options": {"epochs": 40}, "identity": {"kind": "lokr", "rank": 16}}
    manifest = {"format": "hotstep-ray-checkpoint-v1", "step": 9, "epoch": 12, "config": config}
    storage.write_json(f"{unfinished}/checkpoint/checkpoint.json", manifest)


def test_the_studio_lists_adapters_with_their_state_as_the_cli_does(client, tmp_path):
    storage = Storage(tmp_path / "data")
    _lm_runs(storage)
    response = client.get(f"{API}/adapters")
    assert response.status_code == 200, response.text
    adapters = response.json()["adapters"]
    states = {a["id"].rsplit("/", 1)[-1]: (a["status"], a["statusDetail"]) for a in adapters}
    assert states == {
        "2026-01-01_10-00-00": ("finished", "finished"),
        "2026-01-02_10-00-00": ("unfinished", "unfinished at epoch 12"),
    }
    cli = CliRunner().invoke(adapters_app, ["list", "--data", str(storage.url), "--json"])
    assert cli.exit_code == 0, cli.output
    assert json.loads(cli.output) == adapters  # one listing, two doors
    assert client.get(f"{API}/adapters?kind=dit").json() == {"adapters": []}
    bad = client.get(f"{API}/adapters?kind=mm3")
    assert 400 <= bad.status_code < 500 and "kind must be lm or dit" in bad.text
