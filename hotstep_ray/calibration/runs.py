"""A training run folder as calibration sees it: its kind, log, trigger and candidate adapters.

Milestone folder contract (what `training/lm.py` and `training/dit.py` write, `MILESTONE_DIR`):

    <run>/                          the run's kept adapter ("final": best or target epoch) and
                                    lm_train_log.json | dit_train_log.json
    <run>/milestones/<name>/        one complete adapter folder per kept milestone, the same format
                                    as the run's own (LoRA: adapter_config.json +
                                    adapter_model.safetensors; LoKR: lokr_weights.safetensors),
                                    trigger triple in the safetensors `__metadata__`
        <name> = loss_<v>           rung v of the loss ladder (`schedule.MilestoneTracker`)
               | epoch_<n>          a periodic milestone
    log["milestones"] = [{name, epoch, loss, path}]   epoch and loss of each (optional: a folder
                                    not in the log still counts; its name gives what it can)

A milestone folder without weights (an eviction in progress) is skipped. `<run>-calibrated`
folders are never calibrated again (they are outputs, and never a resume source).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from hotstep_ray.core import layout
from hotstep_ray.core.errors import InputError, StorageError
from hotstep_ray.core.storage import Storage

MILESTONE_DIR = layout.MILESTONE_DIR
CALIBRATED_SUFFIX = "-calibrated"
LM_LOG = "lm_train_log.json"
DIT_LOG = "dit_train_log.json"
CODES_FILE = "lm_codes.jsonl"
FINAL = "final"
RunKind = Literal["lm", "dit"]
_SIZE_OF_FOLDER = {folder: size for size, folder in layout.LM_SIZE_FOLDERS.items()}


@dataclass(frozen=True)
class Candidate:
    """One adapter folder to evaluate: the run's own ("final") or a milestone."""

    name: str
    key: str  # storage key of the adapter folder
    epoch: int | None = None
    loss: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "epoch": self.epoch, "loss": self.loss}


@dataclass(frozen=True)
class RunInfo:
    run_key: str
    kind: RunKind
    log: dict[str, Any]
    candidates: tuple[Candidate, ...]
    trigger: str = ""
    trigger_position: str = "prepend"
    lm_size: str = ""  # LM runs
    dit_name: str = ""  # DiT runs
    config: dict[str, Any] = field(default_factory=dict)  # log["config"]


def calibrated_key(run_key: str) -> str:
    """`<run>-calibrated`, next to the run."""
    return run_key.rstrip("/") + CALIBRATED_SUFFIX


def is_calibrated(run_key: str) -> bool:
    return run_key.rstrip("/").endswith(CALIBRATED_SUFFIX)


def resolve_run_key(storage: Storage, run_dir: str) -> str:
    """A run given as a storage key, or (local roots) as a path inside the storage root."""
    text = run_dir.strip().rstrip("/")
    path = Path(text)
    key = text
    if storage.is_local and (path.is_absolute() or not _is_dir(storage, text)) and path.exists():
        try:
            key = storage.key_of(str(path.resolve()))
        except StorageError as exc:
            raise InputError(f"{run_dir}: not inside the storage root {storage.url}") from exc
    if not key or not _is_dir(storage, key):
        raise InputError(f"{run_dir}: no such run folder under {storage.url}")
    return key


def _is_dir(storage: Storage, key: str) -> bool:
    try:
        return storage.is_dir(key)
    except StorageError:  # absolute or escaping the root
        return False


def run_kind(storage: Storage, run_key: str) -> RunKind:
    """lm for `adapters/lm-*/…` or a folder with lm_train_log.json; dit likewise."""
    parts = run_key.split("/")
    if len(parts) > 1 and parts[0] == "adapters":
        if parts[1] in _SIZE_OF_FOLDER:
            return "lm"
        if parts[1].startswith("dit-"):
            return "dit"
    if storage.exists(f"{run_key}/{LM_LOG}"):
        return "lm"
    if storage.exists(f"{run_key}/{DIT_LOG}"):
        return "dit"
    raise InputError(
        f"{storage.url_of(run_key)}: not an LM or DiT run (no adapters/lm-*|dit-* path, no log)"
    )


def _from_name(name: str) -> tuple[int | None, float | None]:
    if match := re.fullmatch(r"epoch_(\d+)", name):
        return int(match.group(1)), None
    if match := re.fullmatch(r"loss_([0-9.eE+-]+)", name):
        try:
            return None, float(match.group(1))
        except ValueError:
            return None, None
    return None, None


def find_candidates(
    storage: Storage, run_key: str, log: dict[str, Any] | None = None, include_final: bool = True
) -> list[Candidate]:
    """The run's own adapter (when it holds weights) then every milestone folder, by name."""
    log = log or {}
    found: list[Candidate] = []
    if include_final and layout.has_weights(storage, run_key):
        epoch = log.get("saved_epoch") or None
        loss = log.get("saved_loss", log.get("saved_ma5"))
        found.append(Candidate(FINAL, run_key, epoch, loss))
    listed = {str(m.get("name")): m for m in log.get("milestones") or [] if isinstance(m, dict)}
    for key in storage.list(f"{run_key}/{MILESTONE_DIR}"):
        name = key.rsplit("/", 1)[-1]
        if name.startswith(".") or not storage.is_dir(key) or not layout.has_weights(storage, key):
            continue
        epoch, loss = _from_name(name)
        if name in listed:
            epoch = listed[name].get("epoch", epoch)
            loss = listed[name].get("loss", loss)
        found.append(Candidate(name, key, epoch, loss))
    return found


def _read_log(storage: Storage, run_key: str, kind: RunKind) -> dict[str, Any]:
    key = f"{run_key}/{LM_LOG if kind == 'lm' else DIT_LOG}"
    if not storage.exists(key):
        return {}
    log = storage.read_json(key)
    return log if isinstance(log, dict) else {}


def _trigger(
    storage: Storage, run: str, candidates: list[Candidate], config: dict
) -> tuple[str, str]:
    """The run's trigger: its log config, else the first embedded trigger among candidates."""
    word = str(config.get("trigger") or "")
    position = str(config.get("trigger_position") or "prepend")
    if word:
        return word, position
    from hotstep_ray.training.export import read_trigger

    for candidate in candidates:
        meta = read_trigger(storage, candidate.key)
        if meta.get("hot_step_trigger"):
            return meta["hot_step_trigger"], meta.get("hot_step_trigger_position", "prepend")
    return "", position


def read_run(storage: Storage, run_key: str, include_final: bool = True) -> RunInfo:
    """Everything calibration needs to know about a run folder."""
    if is_calibrated(run_key):
        raise InputError(f"{run_key}: already a calibrated folder; calibrate the run it came from")
    kind = run_kind(storage, run_key)
    log = _read_log(storage, run_key, kind)
    config = log.get("config") if isinstance(log.get("config"), dict) else {}
    candidates = find_candidates(storage, run_key, log, include_final)
    if not candidates:
        raise InputError(f"{storage.url_of(run_key)}: no adapter weights in the run or milestones")
    trigger, position = _trigger(storage, run_key, candidates, config)
    lm_size = dit_name = ""
    if kind == "lm":
        parts = run_key.split("/")
        lm_size = str(config.get("lm_size") or "")
        if not lm_size and len(parts) > 1 and parts[1] in _SIZE_OF_FOLDER:
            lm_size = _SIZE_OF_FOLDER[parts[1]]
    else:
        dit_name = str(config.get("dit_name") or "")
    return RunInfo(
        run_key=run_key,
        kind=kind,
        log=log,
        candidates=tuple(candidates),
        trigger=trigger,
        trigger_position=position,
        lm_size=lm_size,
        dit_name=dit_name,
        config=config,
    )


def _key_from(storage: Storage, value: str) -> str:
    """A log's location (a key, a path or URL under the root) as a storage key."""
    if not value:
        return ""
    if "://" in value or value.startswith("/"):
        try:
            return storage.key_of(value)
        except StorageError:
            return ""
    return value


def codes_key(storage: Storage, run: RunInfo, override: str = "") -> str:
    """The dataset's `lm_codes.jsonl`: `override`, else the LM log's `codes`, else
    `<tensors>/lm_codes.jsonl` of the DiT log's tensor cache."""
    key = override or _key_from(storage, str(run.config.get("codes") or ""))
    if not key and run.config.get("tensors"):
        key = f"{_key_from(storage, str(run.config['tensors']))}/{CODES_FILE}"
    if not key:
        raise InputError(f"{run.run_key}: the run log names no dataset codes; pass --codes KEY")
    if not storage.exists(key):
        raise InputError(f"{storage.url_of(key)}: missing (pass --codes KEY)")
    return key


def tensors_key(storage: Storage, run: RunInfo, override: str = "") -> str:
    """The DiT run's tensor cache folder (`tensors/<slug>/<variant>`)."""
    key = override or _key_from(storage, str(run.config.get("tensors") or ""))
    if not key or not storage.is_dir(key):
        raise InputError(f"{run.run_key}: no tensor cache found; pass --tensors KEY")
    return key
