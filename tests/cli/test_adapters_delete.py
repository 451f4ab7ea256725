"""`hotstep-ray adapters delete RUN` is the studio's Delete button: the run folder and the folder
Ray Train kept for it go (after a yes, or with --yes); a run still training is refused and an
id the listing lacks is one red line, both exit 2, nothing removed."""

from __future__ import annotations

import json
import struct

from typer.testing import CliRunner

from hotstep_ray.cli.adapters_cmd import app
from hotstep_ray.core.jobs import Job
from hotstep_ray.core.storage import Storage

RUN_ID = "dit-turbo/band/2026-01-03_10-00-00"
RUN = f"adapters/{RUN_ID}"
RAY_RUN = "ray_results/adapters_dit-turbo_band_2026-01-03_10-00-00"


def _dit_run(storage: Storage, final: bool = True, job: str = "") -> None:
    header = json.dumps({"__metadata__": {"hot_step_trigger": "band"}}).encode()
    storage.write_bytes(f"{RUN}/adapter_model.safetensors", struct.pack("<Q", len(header)) + header)
    log = {"final": final, "stop_reason": "epochs" if final else "", "epochs_run": 2, "job": job}
    storage.write_json(f"{RUN}/dit_train_log.json", log)
    storage.write_json(f"{RAY_RUN}/checkpoint_000009/checkpoint.json", {"step": 9})


def _delete(tmp_path, *args: str, answer: str = ""):
    return CliRunner().invoke(app, ["delete", *args, "--data", str(tmp_path)], input=answer)


def test_delete_removes_the_run_and_its_ray_folder(tmp_path):
    storage = Storage(tmp_path)
    _dit_run(storage)
    kept = _delete(tmp_path, RUN_ID, answer="n\n")
    assert kept.exit_code == 1 and storage.exists(RUN) and storage.exists(RAY_RUN)

    done = _delete(tmp_path, f"adapters/{RUN_ID}/", answer="y\n")  # a pasted key works too
    assert done.exit_code == 0, done.output
    assert not storage.exists(RUN) and not storage.exists(RAY_RUN)
    assert f"deleted {storage.url_of(RAY_RUN)}" in done.output
    assert f"deleted {storage.url_of(RUN)}" in done.output


def test_an_unknown_run_or_one_still_training_is_refused(tmp_path):
    storage = Storage(tmp_path)
    missing = _delete(tmp_path, RUN_ID, "--yes")
    assert missing.exit_code == 2
    assert missing.output.startswith(f"error: no adapter {RUN_ID!r} in {tmp_path}")
    assert len(missing.output.strip().splitlines()) == 1

    with Job(storage, "train-dit", dataset_id="band", job_id="ditalive"):
        pass
    Job(storage, "train-dit", job_id="ditalive").set_status("running")  # beats: this process
    _dit_run(storage, final=False, job="ditalive")
    refused = _delete(tmp_path, RUN_ID, "--yes")
    assert refused.exit_code == 2
    assert "is still training: cancel its job first" in refused.output
    assert storage.exists(f"{RUN}/adapter_model.safetensors") and storage.exists(RAY_RUN)
