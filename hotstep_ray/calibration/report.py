"""Events and the outcome shared by the LM and DiT calibrations.

Events (through the job's `EventLog`):
    progress  {done, total, phase: calibrate-lm | calibrate-dit}  as each work item finishes
    log       one line per finished item, the plan, the verdict
    metric    kind `eval`, one per scored row after generation: candidate, scale, score and the
              kind's parts (LM: marginal, transition, memorisation, length, eligible; DiT:
              frechet, eligible), `winner` true on the winning row, `path` = the adapter folder
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hotstep_ray.calibration.bake import CalibratedFolder
from hotstep_ray.calibration.grid import WorkItem, WorkResult
from hotstep_ray.calibration.ray_calibrate import ProgressFn
from hotstep_ray.calibration.runs import RunInfo
from hotstep_ray.core.events import EventLog, MetricEvent, ProgressEvent
from hotstep_ray.core.storage import Storage

_NOT_IN_EVENTS = ("key", "codes_sha1", "latents_sha1")


@dataclass
class CalibrationOutcome:
    run: RunInfo
    rows: list[dict[str, Any]]  # the base row first, then the grid
    winner: dict[str, Any] | None
    folder: CalibratedFolder
    document: dict[str, Any]  # hot_step_eval.json as written


def progress_reporter(events: EventLog | None, phase: str) -> ProgressFn | None:
    if events is None:
        return None

    def report(done: int, total: int, item: WorkItem, result: WorkResult) -> None:
        events.emit(ProgressEvent(done=done, total=total, phase=phase))
        label = "base" if item.is_base else f"{item.candidate} x{item.scale:g}"
        events.log(f"{phase}: {label} in {result.ms / 1000:.1f} s ({done}/{total})")

    return report


def emit_rows(
    events: EventLog | None, rows: Sequence[dict[str, Any]], winner: dict[str, Any] | None
) -> None:
    if events is None:
        return
    for row in rows:
        extra = {k: v for k, v in row.items() if k not in _NOT_IN_EVENTS}
        events.emit(
            MetricEvent(metric="eval", path=row["key"] or None, winner=row is winner, **extra)
        )


def winner_entry(row: dict[str, Any] | None) -> dict[str, Any] | None:
    if row is None:
        return None
    return {k: row[k] for k in ("candidate", "key", "scale", "score") if k in row}


def verdict(winner: dict[str, Any] | None, folder: CalibratedFolder, storage: Storage) -> str:
    if winner is None:
        return f"no candidate passed the guards; report at {storage.url_of(folder.eval_key)}"
    return (
        f"winner {winner['candidate']} x{winner['scale']:g} (score {winner['score']:.4f}) "
        f"baked into {storage.url_of(folder.weights_key)}"
    )
