"""`warm_start.latest_finished_run`: what both trainers' `init_adapter=latest` continues."""

from __future__ import annotations

import json

import torch
from safetensors.torch import save_file

from hotstep_ray.core.storage import Storage
from hotstep_ray.training import warm_start

BASE = "adapters/dit-turbo"
LM_BASE = "adapters/lm-06b"


def _run(root, key: str, kind: str = "lora", log: dict | None = None, name: str = "") -> str:
    """An adapter folder at `key` with `kind` weights and, when given, a training log `name`."""
    folder = root / key
    folder.mkdir(parents=True, exist_ok=True)
    weights = "adapter_model.safetensors" if kind == "lora" else "lokr_weights.safetensors"
    save_file({"w": torch.zeros(2)}, str(folder / weights))
    if log is not None:
        (folder / name).write_text(json.dumps(log))
    return key


def _dit(root, key: str, kind: str = "lora", **log) -> str:
    values = {"final": True, "stop_reason": "epochs", "saved_epoch": 7, "saved_ma5": 0.25}
    return _run(root, key, kind, {**values, **log}, "dit_train_log.json")


def _lm(root, key: str, kind: str = "lora", **log) -> str:
    values = {"stop_reason": "epochs", "saved_epoch": 3, "saved_loss": 0.5}
    return _run(root, key, kind, {**values, **log}, "lm_train_log.json")


def test_a_killed_or_paused_runs_export_is_never_latest(tmp_path) -> None:
    storage = Storage(tmp_path)
    done = _dit(tmp_path, f"{BASE}/band/2026-01-01_00-00-00")
    _dit(tmp_path, f"{BASE}/band/2026-01-02_00-00-00", final=False, stop_reason="")  # killed
    _dit(tmp_path, f"{BASE}/band/2026-01-03_00-00-00", stop_reason="max_steps")  # paused
    _run(tmp_path, f"{BASE}/band/2026-01-04_00-00-00")  # weights, no log: not known to be done
    _dit(tmp_path, f"{BASE}/band/2026-01-05_00-00-00-calibrated")  # calibration output
    found = warm_start.latest_finished_run(storage, BASE, "band", "lora")
    assert found is not None and found.key == done
    assert warm_start.warm_start_line(storage, found).endswith(f"{done}: epoch 7, ma5 0.2500")


def test_the_adapter_type_picks_the_run_and_none_means_any(tmp_path) -> None:
    storage = Storage(tmp_path)
    lora = _lm(tmp_path, f"{LM_BASE}/band/2026-01-01_00-00-00", "lora")
    lokr = _lm(tmp_path, f"{LM_BASE}/band/2026-01-02_00-00-00", "lokr")
    assert warm_start.latest_finished_run(storage, LM_BASE, "band", "lora").key == lora
    assert warm_start.latest_finished_run(storage, LM_BASE, "band", None).key == lokr
    # the run being trained is never its own start
    assert warm_start.latest_finished_run(storage, LM_BASE, "band", exclude=lokr).key == lora
    assert warm_start.latest_finished_run(storage, LM_BASE, "other", "lora") is None
    line = warm_start.fresh_start_line(LM_BASE, "band", "lokr")
    assert line.startswith("no earlier finished lokr run of band") and "starting fresh" in line


def test_an_lm_log_without_a_stop_is_unfinished_and_stamps_sort_by_time(tmp_path) -> None:
    storage = Storage(tmp_path)
    nine = _lm(tmp_path, f"{LM_BASE}/band/2026-01-01_00-00-00-9")
    ten = _lm(tmp_path, f"{LM_BASE}/band/2026-01-01_00-00-00-10")  # after -9, though "1" < "9"
    assert warm_start.latest_finished_run(storage, LM_BASE, "band").key == ten
    _lm(tmp_path, f"{LM_BASE}/band/2026-01-01_00-00-00-11", stop_reason="")
    assert warm_start.latest_finished_run(storage, LM_BASE, "band").key == ten
    assert nine != ten


def test_a_legacy_adapter_is_the_fallback(tmp_path) -> None:
    storage = Storage(tmp_path)
    legacy = _run(tmp_path, "adapters/crew", "lokr")  # a DiT adapter at the adapters root
    found = warm_start.latest_finished_run(storage, BASE, "crew", "lokr")
    assert found is not None and found.key == legacy and found.describe() == "no training log"
    assert warm_start.latest_finished_run(storage, BASE, "crew", "lora") is None
    assert warm_start.latest_finished_run(storage, LM_BASE, "crew") is None  # a DiT root folder
