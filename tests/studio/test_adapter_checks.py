"""What the Adapters table says of each adapter beyond its state: the ΔW/W verdict of a DiT run's
final log and the calibration baked into `<run>-calibrated/` ("" where the files say nothing),
and that deleting a run trained with `--ray` also removes the folder Ray Train kept for it,
on a local and an S3 root."""

from __future__ import annotations

import json
import struct

import pytest

from hotstep_ray.core.storage import Storage
from hotstep_ray.studio import adapter_runs

API = "/api/training"
RUN = "adapters/dit-turbo/band/2026-01-03_10-00-00"
LM_RUN = "adapters/lm-06b/band/2026-01-01_10-00-00"


def _report(*medians: float) -> list[dict]:
    """A `delta_report` as `training.export.delta_report` writes it, one group per median."""
    groups = ("q", "k", "v", "o")
    return [
        {"group": g, "modules": 8, "median": m, "max": 2 * m, "flagged": m > 0.05}
        for g, m in zip(groups, medians, strict=False)
    ]


def _weights(storage: Storage, run_key: str, name: str = "adapter_model.safetensors") -> None:
    header = json.dumps({"__metadata__": {"hot_step_trigger": "band"}}).encode()
    storage.write_bytes(f"{run_key}/{name}", struct.pack("<Q", len(header)) + header)


def _dit_run(storage: Storage, run_key: str = RUN, **log: object) -> None:
    _weights(storage, run_key)
    storage.write_json(
        f"{run_key}/dit_train_log.json",
        {"final": True, "stop_reason": "epochs", "epochs_run": 2, **log},
    )


def _calibrated(storage: Storage, run_key: str, winner: dict | None, repoint: bool = True) -> None:
    """`<run>-calibrated/` as `calibration.bake.write_calibrated` leaves it."""
    folder = f"{run_key}-calibrated"
    storage.write_json(
        f"{folder}/hot_step_eval.json", {"format": "hot-step-eval-v1", "winner": winner}
    )
    for log in ("dit_train_log.json", "lm_train_log.json"):
        if storage.exists(f"{run_key}/{log}"):
            storage.copy(f"{run_key}/{log}", f"{folder}/{log}")
    if winner is not None:
        _weights(storage, folder if repoint else f"{folder}/baked")


@pytest.mark.parametrize(
    ("log", "verdict", "flagged"),
    [
        ({"delta_report": _report(0.008, 0.012, 0.004)}, "ΔW/W 1.2 % median, ok", ()),
        (
            {"delta_report": _report(0.02, 0.061, 0.07)},
            "ΔW/W 7.0 % median, above 5 % in k, v: may overpower the base",
            ("k", "v"),
        ),
        ({"delta_report": "skipped: out of GPU memory"}, "ΔW/W skipped: out of GPU memory", ()),
        ({"final": False}, "", ()),  # a log before `final`: no report yet
        ({"delta_report": [{"group": "q"}]}, "", ()),  # unreadable groups: nothing to say
        ({"delta_report": {"q": 0.01}}, "", ()),
        (None, "", ()),
    ],
)
def test_the_delta_verdict_reads_the_final_logs_report(log, verdict, flagged):
    assert adapter_runs.delta_verdict(log) == (verdict, flagged)


def test_a_baked_scale_scales_every_ratio():
    # the calibrated copy applies 0.5 × the run's ΔW: the flag goes with it
    log = {"delta_report": _report(0.02, 0.08)}
    assert adapter_runs.delta_verdict(log, scale=0.5) == ("ΔW/W 4.0 % median, ok", ())


@pytest.mark.parametrize(
    ("document", "own", "verdict"),
    [
        (
            {"winner": {"candidate": "epoch_40", "scale": 0.8, "score": 1.5}},
            False,
            "calibrated: epoch_40 ×0.8",
        ),
        ({"winner": {"candidate": "final", "scale": 1}}, True, "baked from final ×1"),
        ({"winner": None}, False, "calibrated: no candidate passed the guards"),
        ({"winner": {"candidate": "final"}}, False, ""),
        ({"format": "hot-step-eval-v1"}, False, ""),
        (None, False, ""),
    ],
)
def test_the_calibration_verdict_reads_its_report(document, own, verdict):
    assert adapter_runs.calibration_verdict(document, own) == verdict


def test_the_names_spelled_here_agree_with_their_writers():
    """`adapter_runs` spells them because their modules load torch."""
    from hotstep_ray.calibration import bake
    from hotstep_ray.training import export

    assert adapter_runs.DELTA_FLAG_RATIO == export.DELTA_FLAG_RATIO
    assert adapter_runs.CALIBRATION_FILE == bake.EVAL_FILE


def _rows(client) -> dict[str, dict]:
    return {a["id"]: a for a in client.get(f"{API}/adapters").json()["adapters"]}


def test_each_row_says_its_delta_and_calibration_and_dashes_stand_for_nothing(client, tmp_path):
    storage = Storage(tmp_path / "data")
    _dit_run(storage, delta_report=_report(0.02, 0.08))
    _calibrated(storage, RUN, {"candidate": "epoch_40", "scale": 0.5, "score": 1.5})
    quiet = RUN.replace("band", "quiet")
    _dit_run(storage, quiet)  # an export without the report, never calibrated
    _weights(storage, LM_RUN)
    storage.write_json(f"{LM_RUN}/lm_train_log.json", {"stop_reason": "epochs", "epochs_run": 4})
    _calibrated(storage, LM_RUN, None)  # no candidate passed
    _weights(storage, "adapters/dit-turbo/band", "lokr_weights.safetensors")  # legacy: no run

    rows = _rows(client)
    checks = {
        name.removeprefix("dit-turbo/").removeprefix("lm-06b/"): (
            row["deltaVerdict"],
            row["deltaFlagged"],
            row["calibration"],
        )
        for name, row in rows.items()
    }
    assert checks == {
        "band": ("", [], ""),
        "band/2026-01-03_10-00-00": (
            "ΔW/W 8.0 % median, above 5 % in k: may overpower the base",
            ["k"],
            "calibrated: epoch_40 ×0.5",
        ),
        "band/2026-01-03_10-00-00-calibrated": (
            "ΔW/W 4.0 % median, ok",
            [],
            "baked from epoch_40 ×0.5",
        ),
        "quiet/2026-01-03_10-00-00": ("", [], ""),
        "band/2026-01-01_10-00-00": ("", [], "calibrated: no candidate passed the guards"),
    }


def _ray_folder(storage: Storage, name: str) -> str:
    """What Ray Train leaves under `ray_results/<name>/`: a checkpoint and its own state."""
    storage.write_json(f"ray_results/{name}/checkpoint_000009/checkpoint.json", {"step": 9})
    storage.write_text(f"ray_results/{name}/experiment_state.json", "{}")
    return f"ray_results/{name}"


def _delete_removes_the_ray_folder_too(client, storage: Storage) -> None:
    _dit_run(storage)
    _weights(storage, LM_RUN)
    storage.write_json(f"{LM_RUN}/lm_train_log.json", {"stop_reason": "epochs", "epochs_run": 4})
    dit_ray = _ray_folder(storage, "adapters_dit-turbo_band_2026-01-03_10-00-00")
    lm_ray = _ray_folder(storage, "adapters_lm-06b_band_2026-01-01_10-00-00")
    other = _ray_folder(storage, "adapters_dit-turbo_band_2026-02-01_10-00-00")  # deleted before

    for run_key, ray_key in ((RUN, dit_ray), (LM_RUN, lm_ray)):
        gone = client.delete(f"{API}/adapters/{run_key.removeprefix('adapters/')}")
        assert gone.status_code == 200, gone.text
        assert list(storage.walk_files(run_key)) == [] and list(storage.walk_files(ray_key)) == []
    assert sorted(storage.walk_files("ray_results")) == sorted(storage.walk_files(other))
    assert _rows(client) == {}


def test_delete_removes_the_runs_ray_train_folder(client, tmp_path):
    _delete_removes_the_ray_folder_too(client, Storage(tmp_path / "data"))


def test_delete_removes_the_runs_ray_train_folder_on_an_s3_root(make_client, s3_root):
    root, options = s3_root
    client = make_client(data=root, storage_options=options)
    storage = client.app.state.studio.storage
    assert not storage.is_local
    _delete_removes_the_ray_folder_too(client, storage)


def test_two_artists_runs_of_one_second_keep_their_own_ray_folders(client, tmp_path):
    # Ray's folder is named after the whole run key, so deleting one run leaves the other's
    storage = Storage(tmp_path / "data")
    other_run = RUN.replace("band", "other")
    _dit_run(storage)
    _dit_run(storage, other_run)
    _ray_folder(storage, "adapters_dit-turbo_band_2026-01-03_10-00-00")
    kept = _ray_folder(storage, "adapters_dit-turbo_other_2026-01-03_10-00-00")
    assert client.delete(f"{API}/adapters/{RUN.removeprefix('adapters/')}").status_code == 200
    assert not storage.exists(RUN) and storage.exists(other_run)
    assert sorted(storage.list("ray_results")) == [kept]
