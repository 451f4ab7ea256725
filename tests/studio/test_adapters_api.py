"""The adapters list over HTTP: every trained run with its state, as `adapters list --json`
prints it; a bad kind answers 4xx and lists nothing. One adapter downloads as a zip of its
folder and can be deleted (not while its run trains); ids the listing lacks answer 404."""

from __future__ import annotations

import io
import json
import struct
import zipfile

from typer.testing import CliRunner

from hotstep_ray.cli.adapters_cmd import app as adapters_app
from hotstep_ray.core.jobs import Job
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


# -- download and delete ----------------------------------------------------------------------
DIT_RUN = "adapters/dit-turbo/band/2026-01-03_10-00-00"


def _weights(tail: bytes = b"") -> bytes:
    """A safetensors file's bytes (the listing reads its header for the trigger)."""
    header = json.dumps({"__metadata__": {"hot_step_trigger": "band"}}).encode()
    return struct.pack("<Q", len(header)) + header + tail


def _dit_run(storage: Storage, run_key: str = DIT_RUN, final: bool = True, job: str = "") -> None:
    """A DiT run folder as the trainer leaves it: both name sets of the weights, a milestone, its
    log, and what a download leaves out (the resumable checkpoint, a stamp's `.bak`, a temp
    file). Distinct bytes per file, so a swapped member shows."""
    weights = _weights()
    for name in ("adapter_model.safetensors", "diffusers_names/adapter_model.safetensors"):
        storage.write_bytes(f"{run_key}/{name}", weights + name.encode() * 50)
    for name in ("adapter_config.json", "diffusers_names/adapter_config.json"):
        storage.write_json(f"{run_key}/{name}", {"r": 16, "file": name})
    storage.write_bytes(f"{run_key}/milestones/epoch-0010/adapter_model.safetensors", weights)
    storage.write_bytes(f"{run_key}/empty.txt", b"")
    log = {"final": final, "stop_reason": "epochs" if final else "", "epochs_run": 2, "job": job}
    storage.write_json(f"{run_key}/dit_train_log.json", log)
    storage.write_json(f"{run_key}/checkpoint/checkpoint.json", {"step": 9})
    storage.write_bytes(f"{run_key}/adapter_model.safetensors.bak", b"before the stamp")
    storage.write_bytes(f"{run_key}/.tmp-x.part", b"half written")


def _ids(client) -> list[str]:
    return [a["id"] for a in client.get(f"{API}/adapters").json()["adapters"]]


def test_download_zips_the_adapters_files(client, tmp_path, monkeypatch):
    from hotstep_ray.studio import adapter_runs

    storage = Storage(tmp_path / "data")
    _dit_run(storage)
    _lm_runs(storage)
    monkeypatch.setattr(adapter_runs, "ZIP_CHUNK_BYTES", 7)  # many pieces per member
    adapter_id = DIT_RUN.removeprefix("adapters/")
    response = client.get(f"{API}/adapters/{adapter_id}/download")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/zip"
    assert response.headers["content-disposition"] == (
        'attachment; filename="band-dit-turbo-2026-01-03_10-00-00.zip"'
    )
    archive = zipfile.ZipFile(io.BytesIO(response.content))
    assert archive.testzip() is None
    expected = [
        "adapter_config.json",
        "adapter_model.safetensors",
        "diffusers_names/adapter_config.json",
        "diffusers_names/adapter_model.safetensors",
        "dit_train_log.json",
        "empty.txt",
        "milestones/epoch-0010/adapter_model.safetensors",
    ]
    assert sorted(archive.namelist()) == expected
    for name in expected:
        assert archive.read(name) == storage.read_bytes(f"{DIT_RUN}/{name}"), name
    # a legacy LM adapter: weights straight in the artist folder, whose runs are not its files
    storage.write_bytes("adapters/lm-06b/band/lokr_weights.safetensors", _weights(b"legacy"))
    legacy = client.get(f"{API}/adapters/lm-06b/band/download")
    assert legacy.status_code == 200, legacy.text
    assert zipfile.ZipFile(io.BytesIO(legacy.content)).namelist() == ["lokr_weights.safetensors"]
    assert 'filename="band-lm-06b.zip"' in legacy.headers["content-disposition"]


def test_download_of_an_unknown_or_unexported_adapter_is_refused(client, tmp_path):
    storage = Storage(tmp_path / "data")
    _lm_runs(storage)
    storage.write_json("jobs/abc/job.json", {"secret": 1})
    for adapter_id in ("dit-turbo/nobody/2026-01-01_10-00-00", "..%2F..%2Fjobs%2Fabc", "lm-06b"):
        missing = client.get(f"{API}/adapters/{adapter_id}/download")
        assert missing.status_code == 404, (adapter_id, missing.text)
        assert missing.json() == {"error": f"no adapter {adapter_id.replace('%2F', '/')!r}"}
    unexported = client.get(f"{API}/adapters/lm-06b/band/2026-01-02_10-00-00/download")
    assert unexported.status_code == 409 and "no exported weights" in unexported.json()["error"]


def test_delete_removes_the_adapter_and_only_it(client, tmp_path):
    storage = Storage(tmp_path / "data")
    _dit_run(storage)
    _lm_runs(storage)
    legacy = "adapters/dit-turbo/band/adapter_model.safetensors"  # beside the artist's runs
    storage.write_bytes(legacy, _weights(b"legacy"))
    before = set(storage.walk_files("adapters"))
    assert _ids(client) == [
        "dit-turbo/band",
        "dit-turbo/band/2026-01-03_10-00-00",
        "lm-06b/band/2026-01-01_10-00-00",
        "lm-06b/band/2026-01-02_10-00-00",
    ]

    gone = client.delete(f"{API}/adapters/{DIT_RUN.removeprefix('adapters/')}")
    assert gone.status_code == 200, gone.text
    assert gone.json() == {"ok": True, "id": "dit-turbo/band/2026-01-03_10-00-00"}
    assert not storage.exists(DIT_RUN)
    assert set(storage.walk_files("adapters")) == {k for k in before if not k.startswith(DIT_RUN)}
    assert "dit-turbo/band/2026-01-03_10-00-00" not in _ids(client)

    _dit_run(storage)  # the legacy adapter goes; the run in its folder stays, every file of it
    run_files = set(storage.walk_files(DIT_RUN))
    assert client.delete(f"{API}/adapters/dit-turbo/band").status_code == 200
    assert not storage.exists(legacy) and set(storage.walk_files(DIT_RUN)) == run_files
    assert _ids(client) == [
        "dit-turbo/band/2026-01-03_10-00-00",
        "lm-06b/band/2026-01-01_10-00-00",
        "lm-06b/band/2026-01-02_10-00-00",
    ]
    # an LM run without an adapter yet (its checkpoint) can go too; a second delete is a 404
    unfinished = "lm-06b/band/2026-01-02_10-00-00"
    assert client.delete(f"{API}/adapters/{unfinished}").status_code == 200
    assert not storage.exists(f"adapters/{unfinished}")
    again = client.delete(f"{API}/adapters/{unfinished}")
    assert again.status_code == 404 and again.json() == {"error": f"no adapter {unfinished!r}"}


def test_delete_of_a_run_still_training_is_refused(client, tmp_path):
    storage = Storage(tmp_path / "data")
    with Job(storage, "train-dit", dataset_id="band", job_id="ditalive"):
        pass
    Job(storage, "train-dit", job_id="ditalive").set_status("running")  # beats: this process
    _dit_run(storage, final=False, job="ditalive")  # a best-so-far export, its job alive
    before = {k: storage.read_bytes(k) for k in storage.walk_files("adapters")}
    adapter_id = DIT_RUN.removeprefix("adapters/")
    (row,) = client.get(f"{API}/adapters").json()["adapters"]
    assert (row["id"], row["status"]) == (adapter_id, "training")
    refused = client.delete(f"{API}/adapters/{adapter_id}")
    assert refused.status_code == 409
    assert refused.json() == {
        "error": f"adapter {adapter_id!r} is still training: cancel its job first"
    }
    assert {k: storage.read_bytes(k) for k in storage.walk_files("adapters")} == before


def test_delete_needs_the_token_when_one_is_set(make_client, tmp_path):
    client = make_client(token="s3cret")
    storage = Storage(tmp_path / "data")
    _dit_run(storage)
    url = f"{API}/adapters/{DIT_RUN.removeprefix('adapters/')}"
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        assert client.delete(url, headers=headers).status_code == 401
        assert client.get(f"{url}/download", headers=headers).status_code == 401
    assert storage.exists(f"{DIT_RUN}/adapter_model.safetensors")
    good = {"Authorization": "Bearer s3cret"}
    assert client.get(f"{url}/download", headers=good).status_code == 200
    assert client.delete(url, headers=good).status_code == 200
    assert not storage.exists(DIT_RUN)


def test_download_and_delete_on_an_s3_root(make_client, s3_root):
    root, options = s3_root
    client = make_client(data=root, storage_options=options)
    storage = client.app.state.studio.storage
    assert not storage.is_local
    _dit_run(storage)
    _dit_run(storage, DIT_RUN.replace("band", "other"))
    adapter_id = DIT_RUN.removeprefix("adapters/")
    response = client.get(f"{API}/adapters/{adapter_id}/download")
    assert response.status_code == 200, response.text
    archive = zipfile.ZipFile(io.BytesIO(response.content))
    members = {name: archive.read(name) for name in archive.namelist()}
    assert len(members) == 7 and "checkpoint/checkpoint.json" not in members
    assert members == {name: storage.read_bytes(f"{DIT_RUN}/{name}") for name in members}
    assert client.delete(f"{API}/adapters/{adapter_id}").status_code == 200
    assert list(storage.walk_files(DIT_RUN)) == []
    assert _ids(client) == ["dit-turbo/other/2026-01-03_10-00-00"]
