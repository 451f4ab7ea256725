"""`adapters list` says how far each LM run got, as it does for DiT runs: finished (its log says
it stopped and the adapter is exported), unfinished (a checkpoint, no adapter yet: listed though
it has no weights), training (the job its checkpoint names is alive), unexported (trained
without the export stage). Read from JSON only: the folders here are written by hand."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

from typer.testing import CliRunner

from hotstep_ray.cli import common
from hotstep_ray.cli.adapters_cmd import app
from hotstep_ray.core.jobs import Job, heartbeat_key
from hotstep_ray.core.storage import Storage

BASE = "adapters/lm-06b/band"


def _weights(storage: Storage, run_key: str) -> None:
    header = json.dumps({"__metadata__": {"hot_step_trigger": "band"}}).encode()
    storage.write_bytes(
        f"{run_key}/adapter_model.safetensors", struct.pack("<Q", len(header)) + header
    )


def _log(storage: Storage, run_key: str, stop_reason: str, epochs_run: int) -> None:
    log = {"format": "hot-step-lm-train-v1", "stop_reason": stop_reason, "epochs_run": epochs_run}
    storage.write_json(f"{run_key}/lm_train_log.json", log)


def _checkpoint(storage: Storage, run_key: str, epoch: int, job: str = "") -> None:
    config = {"options": {"epochs": 40}, "identity": {"kind": "lokr", "rank": 16}}
    if job:
        config["job"] = job
    manifest = {"format": "hotstep-ray-checkpoint-v1", "step": 9, "epoch": epoch, "config": config}
    storage.write_json(f"{run_key}/checkpoint/checkpoint.json", manifest)


def _runs(storage: Storage) -> dict[str, str]:
    """One run of each state; their keys by state."""
    runs = {
        "finished": f"{BASE}/2026-01-01_10-00-00",
        "unfinished": f"{BASE}/2026-01-02_10-00-00",
        "training": f"{BASE}/2026-01-03_10-00-00",
        "killed": f"{BASE}/2026-01-04_10-00-00",
        "unexported": f"{BASE}/2026-01-05_10-00-00",
        "no-log": f"{BASE}/2026-01-06_10-00-00",
        "leftover": f"{BASE}/2026-01-07_10-00-00",
    }
    _weights(storage, runs["finished"])
    _log(storage, runs["finished"], "epochs", 40)
    _checkpoint(storage, runs["unfinished"], epoch=12)  # killed: a checkpoint, no adapter
    with Job(storage, "train-lm", dataset_id="band", job_id="lmalive"):
        pass
    Job(storage, "train-lm", job_id="lmalive").set_status("running")  # beats: this process
    _checkpoint(storage, runs["training"], epoch=3, job="lmalive")
    dead = json.loads(storage.read_text(heartbeat_key("lmalive")))
    Job(storage, "train-lm", job_id="lmdead").set_status("running")  # its process is gone
    storage.write_json(heartbeat_key("lmdead"), {**dead, "host": "gone", "beat_at": 1})
    _checkpoint(storage, runs["killed"], epoch=5, job="lmdead")
    _checkpoint(storage, runs["unexported"], epoch=40)  # --stages train: state kept, log written
    _log(storage, runs["unexported"], "target", 40)
    _weights(storage, runs["no-log"])  # an adapter the log of which is gone: unknown
    # exported, then killed before the checkpoint was deleted: the export is whole
    _weights(storage, runs["leftover"])
    _log(storage, runs["leftover"], "epochs", 40)
    _checkpoint(storage, runs["leftover"], epoch=40)
    return runs


def test_adapters_list_shows_each_lm_runs_state(tmp_path, monkeypatch) -> None:
    storage = Storage(tmp_path)
    runs = _runs(storage)
    listed = CliRunner().invoke(app, ["list", "--data", str(tmp_path), "--json"])
    assert listed.exit_code == 0, listed.output
    shown = {e["id"]: e for e in json.loads(listed.output)}
    state = {name: shown[key.removeprefix("adapters/")] for name, key in runs.items()}
    assert {name: (e["status"], e["statusDetail"]) for name, e in state.items()} == {
        "finished": ("finished", "finished"),
        "unfinished": ("unfinished", "unfinished at epoch 12"),
        "training": ("training", "training (epoch 3)"),
        "killed": ("unfinished", "unfinished at epoch 5"),
        "unexported": ("unexported", "trained 40 epochs, not exported"),
        "no-log": ("", ""),
        "leftover": ("finished", "finished"),
    }
    # the runs without an adapter yet are listed for their state, without weights
    assert (state["unfinished"]["weights"], state["unfinished"]["sizeBytes"]) == ("", 0)
    assert state["unfinished"]["format"] == "lokr"  # the checkpoint's identity
    assert state["unfinished"]["trainedAt"] == "2026-01-02T10:00:00"
    assert state["finished"]["weights"] == "adapter_model.safetensors"

    monkeypatch.setattr(common.console, "width", 250)  # rich folds cells to fit its width
    table = CliRunner().invoke(app, ["list", "--data", str(tmp_path)])
    assert table.exit_code == 0, table.output
    assert "unfinished at epoch 12" in table.output and "not exported" in table.output
    dit_only = CliRunner().invoke(app, ["list", "--data", str(tmp_path), "--kind", "dit", "--json"])
    assert json.loads(dit_only.output) == []


def test_the_cli_names_the_lm_trainers_files_as_it_writes_them() -> None:
    """The adapters list spells the trainer's file names (importing it would load torch)."""
    from hotstep_ray.studio import adapter_runs
    from hotstep_ray.training import checkpoint, lm_save

    assert adapter_runs.LM_LOG_FILE == lm_save.LOG_FILE
    assert adapter_runs.LM_CHECKPOINT_MANIFEST == f"{lm_save.CHECKPOINT_DIR}/{checkpoint.MANIFEST}"
    assert (
        lm_save.checkpoint_key("r") + "/" + checkpoint.MANIFEST
        == f"r/{adapter_runs.LM_CHECKPOINT_MANIFEST}"
    )


_PROBE = textwrap.dedent(
    """
    import json, sys
    from typer.testing import CliRunner
    from hotstep_ray.cli.adapters_cmd import app

    listed = CliRunner().invoke(app, ["list", "--data", sys.argv[1], "--json"])
    heavy = sorted(name for name in ("torch", "transformers", "diffusers", "ray") if name in sys.modules)
    print(json.dumps({"code": listed.exit_code, "output": listed.output, "heavy": heavy}))
    """
)


def test_adapters_list_reads_lm_runs_without_loading_torch(tmp_path: Path) -> None:
    storage = Storage(tmp_path)
    _checkpoint(storage, f"{BASE}/2026-01-02_10-00-00", epoch=12)
    _weights(storage, f"{BASE}/2026-01-01_10-00-00")
    _log(storage, f"{BASE}/2026-01-01_10-00-00", "epochs", 40)
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["code"] == 0, report["output"]
    assert [e["status"] for e in json.loads(report["output"])] == ["finished", "unfinished"]
    assert report["heavy"] == []
