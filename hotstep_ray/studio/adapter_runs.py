"""The state of every trained adapter's run, read from its JSON files alone (no torch): what
`hotstep-ray adapters list` prints and the studio's adapters list shows.

A DiT run is finished, paused at a step, training while its job is alive, or interrupted (killed:
its adapter is the best one exported before that). An LM run is finished, unfinished (a
checkpoint, no adapter yet), training (the job its checkpoint names is alive), or unexported
(trained without the export stage).

Each row also says what the run's own files tell of its adapter: the ΔW/W report a finished DiT
run's log holds (an LM log has none) and the calibration baked into `<run>-calibrated/`.

The studio also hands out an adapter's folder as a zip and deletes it (with the folder Ray Train
kept for a `--ray` run): both only for an id the listing shows, so a request can never name a key
outside `<root>/adapters` and `<root>/ray_results`.
"""

from __future__ import annotations

import contextlib
import re
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from hotstep_ray.calibration.runs import calibrated_key, is_calibrated
from hotstep_ray.core import layout
from hotstep_ray.core.errors import HotstepError, InputError
from hotstep_ray.core.storage import Storage
from hotstep_ray.studio.errors import ConflictError, NotFoundError
from hotstep_ray.training.dit_log import LOG_FILE as DIT_LOG_FILE
from hotstep_ray.training.warm_start import (  # written once, when the run stops
    LM_LOG_FILE,
    lm_stopped,
    read_json_or_none,
)

if TYPE_CHECKING:
    from fastapi import APIRouter

    from hotstep_ray.audition.catalogue import AdapterEntry
    from hotstep_ray.studio.context import Studio

# The LM checkpoint's commit point, spelled here because `training.checkpoint` loads torch and
# listing adapters must not (a test checks it agrees with `checkpoint.MANIFEST`).
LM_CHECKPOINT_MANIFEST = f"{layout.RUN_CHECKPOINT_DIR}/checkpoint.json"
# Spelled here for the same reason (their modules load torch; a test checks they agree): the
# ΔW/W median past which `training.export` flags a group, and the calibration's report
# (`calibration.bake.EVAL_FILE`).
DELTA_FLAG_RATIO = 0.05
CALIBRATION_FILE = "hot_step_eval.json"
# Read size while zipping: large enough for few object-store GETs, small enough to stream.
ZIP_CHUNK_BYTES = 1 << 20
_UNSAFE_FILENAME = re.compile(r"[^A-Za-z0-9._-]+")


def with_status(storage: Storage, kind: str = "") -> list[tuple[AdapterEntry, str, str]]:
    """Every adapter under `<root>/adapters` (and each LM run with state but no adapter yet), by
    id, with its run's (state, text) (`run_status`); `kind` lm or dit keeps those only."""
    found = sorted(entries(storage), key=lambda e: e.id)
    return [(e, *run_status(storage, e)) for e in found if not kind or e.kind == kind]


def entries(storage: Storage) -> list[AdapterEntry]:
    """Every adapter under `<root>/adapters`, and each LM run with state but no adapter yet."""
    from hotstep_ray.audition.catalogue import list_adapters

    return [*list_adapters(storage), *unexported_lm_runs(storage)]


def to_json(storage: Storage, rows: list[tuple[AdapterEntry, str, str]]) -> list[dict[str, Any]]:
    """`with_status`'s rows as `adapters list --json` prints them (and the studio serves them),
    each with its `checks`: `deltaVerdict`, `deltaFlagged` and `calibration`."""
    return [
        {**e.to_json_dict(), "status": state, "statusDetail": text, **checks(storage, e).to_json()}
        for e, state, text in rows
    ]


def run_status(storage: Storage, entry: AdapterEntry) -> tuple[str, str]:
    """(state, text) of a run: a DiT's by its `dit_train_log.json` (finished, paused at a step,
    training while its job is alive, or interrupted at an epoch: killed, the adapter is a
    best-so-far export), an LM's by `lm_run_status`; ("", "") when unknown (a legacy adapter,
    no log)."""
    from hotstep_ray.audition.catalogue import ROOT
    from hotstep_ray.training.dit_log import read_progress

    if entry.legacy:
        return "", ""
    if entry.kind == "lm":
        return lm_run_status(storage, f"{ROOT}/{entry.id}", exported=bool(entry.weights))
    progress = read_progress(storage, f"{ROOT}/{entry.id}")
    if progress is None:
        return "", ""
    if progress.state == "finished":
        return "finished", "finished"
    if progress.state == "paused":
        return "paused", f"paused at step {progress.steps}"
    if _job_alive(storage, progress.job_id):
        return "training", f"training (epoch {progress.epochs_run})"
    return "interrupted", f"interrupted at epoch {progress.epochs_run}"


def _job_alive(storage: Storage, job_id: str) -> bool:
    """Whether the job's record says it runs, read through its heartbeat (a killed one: no)."""
    from hotstep_ray.studio.records import read_summary

    if not job_id:
        return False
    with contextlib.suppress(HotstepError, ValueError):
        return read_summary(storage, job_id).status in ("queued", "running")
    return False


@dataclass(frozen=True)
class LmRunProgress:
    """How far an LM run folder got, by its JSON alone (no torch)."""

    stopped: bool  # `lm_train_log.json` says the run stopped (a stop reason: it is trained)
    epochs_run: int  # from that log, else the checkpoint's
    checkpoint: bool  # `checkpoint/` holds resumable state (committed: its manifest is there)
    # the job that wrote the checkpoint, when its config names it (`job`, as the DiT log does)
    job_id: str
    adapter_type: str  # lora | lokr by the checkpoint's identity ("" unknown)


def read_lm_progress(storage: Storage, run_key: str) -> LmRunProgress | None:
    """The run's progress from its log and checkpoint manifest; None when it has neither."""
    log = read_json_or_none(storage, f"{run_key}/{LM_LOG_FILE}")
    manifest = read_json_or_none(storage, f"{run_key}/{LM_CHECKPOINT_MANIFEST}")
    if log is None and manifest is None:
        return None
    config = (manifest or {}).get("config")
    config = config if isinstance(config, dict) else {}
    identity = config.get("identity")
    # the log's count once the run stopped, else the epoch the checkpoint holds
    epochs = log.get("epochs_run") if log is not None else (manifest or {}).get("epoch")
    try:
        epochs = int(epochs or 0)
    except (TypeError, ValueError):
        epochs = 0
    return LmRunProgress(
        stopped=lm_stopped(log),  # the warm start's rule (`warm_start.trained_run`)
        epochs_run=epochs,
        checkpoint=manifest is not None,
        job_id=str(config.get("job") or ""),
        adapter_type=str(identity.get("kind") or "") if isinstance(identity, dict) else "",
    )


def lm_run_status(storage: Storage, run_key: str, exported: bool) -> tuple[str, str]:
    """(state, text) of an LM run folder (`exported`: it holds adapter weights). The trainer
    writes `lm_train_log.json` once, when the run stops, after the export, and deletes the
    checkpoint after that: stopped with weights is finished (even with a checkpoint a kill left
    behind); a checkpoint without that is unfinished (killed, or training while the job it names
    is alive), or unexported when the run stopped but the export stage did not run; ("", "") for
    a folder with neither log nor checkpoint."""
    progress = read_lm_progress(storage, run_key)
    if progress is None:
        return "", ""
    if progress.stopped and exported:
        return "finished", "finished"
    if not progress.checkpoint:
        return "", ""  # a log without weights or state: nothing this run can continue from
    if progress.stopped:
        return "unexported", f"trained {progress.epochs_run} epochs, not exported"
    if _job_alive(storage, progress.job_id):
        return "training", f"training (epoch {progress.epochs_run})"
    return "unfinished", f"unfinished at epoch {progress.epochs_run}"


def _stamp_time(run: str) -> str:
    try:
        return datetime.strptime("-".join(run.split("-")[:5]), layout.RUN_STAMP_FORMAT).isoformat()
    except ValueError:
        return ""


def unexported_lm_runs(storage: Storage) -> list[AdapterEntry]:
    """LM run folders with resumable state but no adapter yet (an unfinished or unexported run),
    which the catalogue, listing weights, leaves out: as entries without weights or size."""
    from hotstep_ray.audition.catalogue import ROOT, AdapterEntry, resolve_trigger

    def dirs(key: str) -> list[str]:
        names = (k for k in storage.list(key) if not k.rsplit("/", 1)[-1].startswith("."))
        return [k for k in names if storage.is_dir(k)]

    found = []
    for size, folder in layout.LM_SIZE_FOLDERS.items():
        base_key = f"{ROOT}/{folder}"
        if not storage.is_dir(base_key):
            continue
        for artist_key in dirs(base_key):
            for run_key in dirs(artist_key):
                run = run_key.rsplit("/", 1)[-1]
                if not layout.is_run_stamp(run) or layout.has_weights(storage, run_key):
                    continue
                progress = read_lm_progress(storage, run_key)
                if progress is None or not progress.checkpoint:
                    continue
                entry = AdapterEntry(
                    id=run_key.removeprefix(f"{ROOT}/"),
                    kind="lm",
                    base_folder=folder,
                    base=size,
                    artist=artist_key.rsplit("/", 1)[-1],
                    run=run,
                    legacy=False,
                    format=progress.adapter_type or "?",
                    weights="",
                    size_bytes=0,
                    trained_at=_stamp_time(run),
                    trigger=resolve_trigger(storage, run_key),  # the folder's word, as a run's
                )
                found.append(entry)
    return found


# -- what the run's files say of its adapter: ΔW/W and calibration -------------------------------
@dataclass(frozen=True)
class Checks:
    """One line each, "" where the run's files say nothing (a legacy adapter, an LM's ΔW)."""

    delta: str  # `delta_verdict`
    flagged: tuple[str, ...]  # the projection groups past DELTA_FLAG_RATIO
    calibration: str  # `calibration_verdict`

    def to_json(self) -> dict[str, Any]:
        return {
            "deltaVerdict": self.delta,
            "deltaFlagged": list(self.flagged),
            "calibration": self.calibration,
        }


def delta_verdict(log: dict | None, scale: float = 1.0) -> tuple[str, tuple[str, ...]]:
    """(line, flagged groups) from the `delta_report` of a DiT log's final write: per projection
    group the median and max of ‖ΔW‖_F / ‖W‖_F (`training.export.delta_report`). The line gives the
    largest group median, the figure the 5 % flag judges, then "ok" or the groups past it. `scale`
    is a calibrated copy's baked scale: its ΔW is scale × the run's, and so is every ratio."""
    report = (log or {}).get("delta_report")
    if isinstance(report, str):
        return f"ΔW/W {report}", ()  # the trainer's reason for not measuring it
    if not isinstance(report, list):
        return "", ()
    medians = {
        str(group.get("group")): float(group["median"]) * scale
        for group in report
        if isinstance(group, dict) and isinstance(group.get("median"), int | float)
    }
    if not medians:
        return "", ()
    line = f"ΔW/W {max(medians.values()) * 100:.1f} % median"
    flagged = tuple(name for name, median in medians.items() if median > DELTA_FLAG_RATIO)
    if not flagged:
        return f"{line}, ok", ()
    past = f"above {DELTA_FLAG_RATIO * 100:g} % in {', '.join(flagged)}"
    return f"{line}, {past}: may overpower the base", flagged


def calibration_verdict(document: dict | None, own: bool = False) -> str:
    """One line from a calibration's `hot_step_eval.json`: the candidate and scale it baked, or
    that none passed its guards; `own`: the row is the calibrated copy itself. "" without one."""
    if document is None or "winner" not in document:
        return ""
    winner = document["winner"]
    if not isinstance(winner, dict):
        return "calibrated: no candidate passed the guards"
    scale = _baked_scale(document)
    if scale is None:
        return ""
    baked = f"{winner.get('candidate') or '?'} ×{scale:g}"
    return f"baked from {baked}" if own else f"calibrated: {baked}"


def _baked_scale(document: dict | None) -> float | None:
    try:
        return float(((document or {}).get("winner") or {})["scale"])
    except (KeyError, TypeError, ValueError):
        return None


def checks(storage: Storage, entry: AdapterEntry) -> Checks:
    """A row's `Checks`: the ΔW/W of a DiT run's log, and the calibration of the run (its
    `<run>-calibrated/`) or, for that calibrated copy, its own."""
    if entry.legacy:
        return Checks("", (), "")
    folder = folder_key(entry)
    own = is_calibrated(folder)
    report = f"{folder if own else calibrated_key(folder)}/{CALIBRATION_FILE}"
    document = read_json_or_none(storage, report)
    calibration = calibration_verdict(document, own)
    # a calibrated copy's log is the run's, measured before the scale was baked in
    scale = _baked_scale(document) if own else 1.0
    if entry.kind != "dit" or scale is None:
        return Checks("", (), calibration)
    delta, flagged = delta_verdict(read_json_or_none(storage, f"{folder}/{DIT_LOG_FILE}"), scale)
    return Checks(delta, flagged, calibration)


# -- one adapter: find, download, delete ----------------------------------------------------
def find(storage: Storage, adapter_id: str) -> tuple[AdapterEntry, str, str]:
    """The listing's row of `adapter_id` (`with_status`'s shape); NotFoundError when the listing
    has no such id. Matching listed ids, not building a key, is what keeps `../` and friends
    out; only this row's run state is read."""
    for entry in entries(storage):
        if entry.id == adapter_id:
            return (entry, *run_status(storage, entry))
    raise NotFoundError(f"no adapter {adapter_id!r}")


def folder_key(entry: AdapterEntry) -> str:
    from hotstep_ray.audition.catalogue import ROOT

    return f"{ROOT}/{entry.id}"


def _own_children(storage: Storage, folder: str) -> list[str]:
    """The keys directly in an adapter's folder that are its own: a legacy artist folder (weights
    beside the run folders) also holds that artist's runs, each an adapter of its own."""
    return [
        key
        for key in storage.list(folder)
        if not (layout.is_run_stamp(key.rsplit("/", 1)[-1]) and storage.is_dir(key))
    ]


def _left_out(name: str) -> bool:
    # hidden names are half-written temp files (`.tmp-*.part`); `.bak` is the original a
    # trigger stamp replaced (the listing's size leaves it out too)
    return name.startswith(".") or name.endswith(".bak")


def export_files(storage: Storage, entry: AdapterEntry) -> list[tuple[str, str]]:
    """(name in the zip, storage key) of every file a download holds, sorted: the weights, their
    configs, logs, `diffusers_names/` and `milestones/`; not the resumable `checkpoint/`."""
    folder = folder_key(entry)
    found = []
    for child in _own_children(storage, folder):
        # the resumable state: no use to anyone loading the adapter, as large as it again
        if child.rsplit("/", 1)[-1] == layout.RUN_CHECKPOINT_DIR:
            continue
        for key in storage.walk_files(child) if storage.is_dir(child) else [child]:
            name = key.removeprefix(f"{folder}/")
            if not any(_left_out(part) for part in name.split("/")):
                found.append((name, key))
    return sorted(found)


def download_name(entry: AdapterEntry) -> str:
    """A file name a musician can tell apart: artist first, then the base and the run."""
    base = "" if entry.base_folder == "lm" else entry.base_folder  # legacy: the artist has it
    name = "-".join(part for part in (entry.artist, base, entry.run) if part)
    return _UNSAFE_FILENAME.sub("_", name).strip("._") or "adapter"


def _zip_time(storage: Storage, key: str) -> tuple[int, int, int, int, int, int]:
    seconds = storage.mtime_ns(key) / 1e9
    stamp = time.localtime(seconds)[:6] if seconds else (1980, 1, 1, 0, 0, 0)
    return max(stamp, (1980, 1, 1, 0, 0, 0))  # zip cannot say anything before 1980


class _Chunks:
    """A write-only sink for `zipfile`: it has no `seek`/`tell`, so zipfile writes each member's
    sizes after its data (a data descriptor) instead of seeking back, and the zip can be sent
    while it is written."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def flush(self) -> None:
        pass

    def take(self) -> bytes:
        out = b"".join(self._parts)
        self._parts.clear()
        return out


def zip_stream(storage: Storage, files: list[tuple[str, str]]) -> Iterator[bytes]:
    """A zip of `files` (`export_files`), stored uncompressed (safetensors do not shrink), in
    pieces of about `ZIP_CHUNK_BYTES`: memory stays flat however large the adapter is."""
    sink = _Chunks()
    with zipfile.ZipFile(sink, "w", zipfile.ZIP_STORED) as archive:
        for name, key in files:
            info = zipfile.ZipInfo(name, date_time=_zip_time(storage, key))
            info.compress_type = zipfile.ZIP_STORED
            info.external_attr = 0o644 << 16
            info.file_size = storage.size(key)  # zipfile picks zip64 by it, before any data
            with storage.open(key) as source, archive.open(info, "w") as target:
                while chunk := source.read(ZIP_CHUNK_BYTES):
                    target.write(chunk)
                    yield sink.take()
            yield sink.take()  # the member's data descriptor (and an empty file's header)
    yield sink.take()  # the central directory


def ray_results_key(entry: AdapterEntry) -> str:
    """Ray Train's folder of the run (`--ray`: its checkpoints and results), whether or not one
    was written; "" for a legacy adapter."""
    return "" if entry.legacy else layout.ray_run_dir(folder_key(entry))


def delete(storage: Storage, entry: AdapterEntry, state: str) -> list[str]:
    """Remove the adapter's folder (in a legacy artist folder: its own files, not the runs
    beside them) and the folder Ray Train kept for its run; the keys removed. ConflictError while
    its run trains, since the trainer would write them again."""
    if state == "training":
        raise ConflictError(f"adapter {entry.id!r} is still training: cancel its job first")
    removed = []
    # Ray's first: the run folder is what lists the adapter, so a failure leaves it to delete again
    ray_key = ray_results_key(entry)
    if ray_key and storage.exists(ray_key):
        storage.delete(ray_key, recursive=True)
        removed.append(ray_key)
    folder = folder_key(entry)
    own = _own_children(storage, folder)
    if len(own) == len(storage.list(folder)):
        storage.delete(folder, recursive=True)
        return [*removed, folder]
    for key in own:
        storage.delete(key, recursive=True)
    return [*removed, *own]


def router(studio: Studio) -> APIRouter:
    """`GET /adapters[?kind=lm|dit]`: `{"adapters": [...]}`, each as `adapters list --json`;
    `GET /adapters/{id}/download`: its folder as a zip; `DELETE /adapters/{id}`: removes it
    and Ray Train's folder of its run (`delete`)."""
    from fastapi import APIRouter, Query  # here: `adapters list` imports this module too
    from fastapi.responses import StreamingResponse

    api = APIRouter()

    @api.get("/adapters")
    def list_route(kind: str = Query("", description="lm or dit; empty: both")) -> dict[str, Any]:
        if kind not in ("", "lm", "dit"):
            raise InputError(f"kind must be lm or dit, got {kind!r}")
        return {"adapters": to_json(studio.storage, with_status(studio.storage, kind))}

    # `:path`: an id is `<base>/<artist>/<run>`, slashes and all
    @api.get("/adapters/{adapter_id:path}/download")
    def download_route(adapter_id: str) -> StreamingResponse:
        entry, _, _ = find(studio.storage, adapter_id)
        if not entry.weights:
            raise ConflictError(f"adapter {adapter_id!r} has no exported weights yet")
        # listed before the response starts, so a missing adapter is a 404, not a cut-off zip
        files = export_files(studio.storage, entry)
        disposition = f'attachment; filename="{download_name(entry)}.zip"'
        return StreamingResponse(
            zip_stream(studio.storage, files),  # a plain iterator: Starlette reads it in a thread
            media_type="application/zip",
            headers={"Content-Disposition": disposition},
        )

    @api.delete("/adapters/{adapter_id:path}")
    def delete_route(adapter_id: str) -> dict[str, Any]:
        entry, state, _ = find(studio.storage, adapter_id)
        delete(studio.storage, entry, state)
        return {"ok": True, "id": entry.id}

    return api
