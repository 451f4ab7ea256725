"""Warm starts: which earlier adapter run `init_adapter="latest"` continues, for both trainers.

The newest FINISHED run of an artist under one base folder (`adapters/dit-turbo`,
`adapters/lm-06b`: one base model) with a given adapter type; a run that was killed or paused,
whose folder may hold a best-so-far export, never counts. Finished is read from the run's own
log: the DiT's `dit_train_log.json` (`dit_log.read_progress`'s rule), the LM's
`lm_train_log.json` (written once, when the run stopped). Reads JSON only (no tensors).
"""

from __future__ import annotations

from dataclasses import dataclass

from hotstep_ray.core import layout
from hotstep_ray.core.errors import HotstepError
from hotstep_ray.core.storage import Storage
from hotstep_ray.training import dit_log

ROOT = "adapters"
LM_LOG_FILE = "lm_train_log.json"  # the LM trainer's run log (`training.lm_save.LOG_FILE`)


@dataclass(frozen=True)
class TrainedRun:
    """An adapter folder as a trainer's warm start sees it: its type, whether its run finished,
    and what its training log says it kept."""

    key: str
    adapter_type: str  # lora | lokr (by its weights file)
    finished: bool  # its log says the run ended; a legacy folder (no log, no run stamp) counts
    epoch: int | None  # the epoch of the kept adapter (None: no training log)
    loss: float | None  # its loss (LM) or 5-epoch moving average (DiT)
    loss_name: str  # "loss" | "ma5"
    config: dict  # the log's resolved config ({} without a log)

    def describe(self) -> str:
        """`epoch 40, loss 0.6100`, or why there is nothing to say."""
        if self.epoch is None:
            return "no training log" if self.finished else "an unfinished run"
        shown = f"epoch {self.epoch}"
        if self.loss is not None:
            shown += f", {self.loss_name} {self.loss:.4f}"
        return shown if self.finished else f"{shown}, an unfinished run"


def _join(folder: str, name: str) -> str:
    return f"{folder}/{name}" if folder else name


def read_json_or_none(storage: Storage, key: str) -> dict | None:
    """The JSON object at `key`; None when it is missing, unreadable or not an object."""
    try:
        if not storage.exists(key):
            return None
        log = storage.read_json(key)
    except (HotstepError, ValueError, OSError):  # unreadable: as good as none
        return None
    return log if isinstance(log, dict) else None


def lm_stopped(log: dict | None) -> bool:
    """Whether an LM run has stopped, by its `lm_train_log.json` (None: none was read): the
    trainer writes that log once, when the run stops, naming why (`stop_reason`); an interrupted
    run leaves only its checkpoint. A stopped run with its weights is finished."""
    return bool(log and log.get("stop_reason"))


def trained_run(storage: Storage, key: str) -> TrainedRun | None:
    """The adapter in `key` (None when it holds no weights). Finished by its log: the DiT's
    `dit_train_log.json` is rewritten every epoch and only its final write ends the run
    (`dit_log.read_progress`; a `max_steps` pause is not an end); the LM writes
    `lm_train_log.json` once, when the run has stopped (an interrupted LM run leaves only its
    checkpoint, no weights). A run-stamped folder without either log is not known to be
    finished."""
    weights = layout.weights_key(storage, key)
    if weights is None:
        return None
    adapter_type = "lora" if weights.endswith(layout.ADAPTER_WEIGHT_FILES[0]) else "lokr"
    dit = read_json_or_none(storage, _join(key, dit_log.LOG_FILE))
    if dit is not None:
        progress = dit_log.RunProgress(
            run_key=key,
            final=bool(dit.get("final")),
            stop_reason=str(dit.get("stop_reason") or ""),
            epochs_run=int(dit.get("epochs_run") or 0),
            steps=int(dit.get("steps") or 0),
            job_id=str(dit.get("job") or ""),
        )
        finished = progress.state == "finished"
        loss = dit.get("saved_ma5")
        epoch = dit.get("saved_epoch")
        return TrainedRun(
            key, adapter_type, finished, epoch, loss, "ma5", dict(dit.get("config") or {})
        )
    lm = read_json_or_none(storage, _join(key, LM_LOG_FILE))
    if lm is not None:
        finished = lm_stopped(lm)
        return TrainedRun(
            key,
            adapter_type,
            finished,
            lm.get("saved_epoch"),
            lm.get("saved_loss"),
            "loss",
            dict(lm.get("config") or {}),
        )
    stamped = layout.is_run_stamp(key.rstrip("/").rsplit("/", 1)[-1])
    return TrainedRun(key, adapter_type, not stamped, None, None, "loss", {})


def run_order(key: str) -> tuple[str, int, str]:
    """Run folders by time: the stamp, then its collision suffix (`-2` ... `-99`, then a longer
    base-36 one), shorter first, so `-10` comes after `-9`."""
    name = key.rsplit("/", 1)[-1]
    width = len("YYYY-MM-DD_HH-MM-SS")
    stamp, suffix = name[:width], name[width:]
    return stamp, len(suffix), suffix


def run_folders(storage: Storage, artist_dir: str) -> list[str]:
    """The run-stamped folders of an artist, newest first; calibration output is not a run."""
    runs = [
        key
        for key in storage.list(artist_dir)
        if layout.is_run_stamp(name := key.rsplit("/", 1)[-1])
        and not name.endswith("-calibrated")
        and storage.is_dir(key)
    ]
    return sorted(runs, key=run_order, reverse=True)


def _legacy_folder(storage: Storage, base: str, artist: str) -> str | None:
    """A pre-run-folder adapter of `artist` for `base` (`layout.resolve_adapter`'s fallbacks):
    weights in the artist folder, then `adapters/lm/<artist>-<size>` or `adapters/<artist>`."""
    artist_dir = f"{base}/{artist}"
    if layout.has_weights(storage, artist_dir):
        return artist_dir
    folder = base.rsplit("/", 1)[-1]
    for size, size_folder in layout.LM_SIZE_FOLDERS.items():
        if folder == size_folder and layout.has_weights(storage, f"{ROOT}/lm/{artist}-{size}"):
            return f"{ROOT}/lm/{artist}-{size}"
    if folder.startswith("dit-") and layout.has_weights(storage, f"{ROOT}/{artist}"):
        return f"{ROOT}/{artist}"
    return None


def latest_finished_run(
    storage: Storage,
    base: str,
    artist: str,
    adapter_type: str | None = None,
    exclude: str = "",
) -> TrainedRun | None:
    """What `init_adapter="latest"` continues: the newest finished run of `artist` under `base`
    (`adapters/lm-06b`, `adapters/dit-turbo`: one base model) whose adapter is `adapter_type`
    (None: any), skipping `exclude` (the run being trained) and runs that were killed or
    paused; else a legacy adapter of that type; else None."""
    artist_dir = f"{base}/{layout.check_name(artist, 'artist')}"
    for key in run_folders(storage, artist_dir):
        if key == exclude:
            continue
        run = trained_run(storage, key)
        if run is not None and run.finished and adapter_type in (None, run.adapter_type):
            return run
    legacy = _legacy_folder(storage, base, artist)
    run = trained_run(storage, legacy) if legacy and legacy != exclude else None
    if run is not None and run.finished and adapter_type in (None, run.adapter_type):
        return run
    return None


def fresh_start_line(base: str, artist: str, adapter_type: str | None) -> str:
    """The line a run prints when `latest` finds nothing to continue."""
    kind = f"{adapter_type} " if adapter_type else ""
    return (
        f"no earlier finished {kind}run of {artist} under {base}/: starting fresh "
        "(init adapter latest)"
    )


def warm_start_line(storage: Storage, run: TrainedRun) -> str:
    """The line a run prints when it starts from an earlier adapter."""
    return f"warm start from {storage.url_of(run.key)}: {run.describe()}"
