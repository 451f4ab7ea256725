"""The calibration grid: (candidate x scale) work items, their results, and the winner rule.

A work item is one grid point with every prompt of the run (the same requests, seeds included,
for every point), so all points are scored on identical inputs. Item 0 is always the base model
(no adapter): the reference row and the length guard's denominator. Items are candidate-major so
a worker that caches the last adapter loads each one once.

Winner: among the eligible rows (every guard passed, finite score), the lowest score; ties go to
the scale nearest 1.0, then to the earlier candidate (the run's own adapter before milestones).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hotstep_ray.calibration.runs import Candidate
from hotstep_ray.core.errors import InputError

BASE = "base"
DEFAULT_SCALES: tuple[float, ...] = (0.5, 0.75, 1.0, 1.25)
DEFAULT_SEEDS = 4  # generations (LM) or renders (DiT) per grid point
DEFAULT_BASE_SEED = 1234  # the seed of generation 0; then +1 each
MAX_SCALE = 2.0  # the audition API's lm_adapter_scale / dit_adapter_scale ceiling


@dataclass(frozen=True)
class WorkItem:
    index: int
    candidate: str  # BASE or a candidate name
    key: str  # adapter folder storage key; "" = the base model
    scale: float  # adapter scale multiplier (0 for the base row)
    requests: tuple[dict[str, Any], ...]  # request fields (LmRequest / DitRequest), seeds fixed

    @property
    def is_base(self) -> bool:
        return not self.key


@dataclass
class WorkResult:
    index: int
    outputs: list[Any]  # per request: LM codes (list[int]) or DiT LatentStats
    receipts: list[str] = field(default_factory=list)  # per request: sha1 of the output
    ms: float = 0.0  # wall clock of the whole item


Worker = Callable[[WorkItem], WorkResult]
WorkerFactory = Callable[[], Worker]


def parse_scales(value: str | Iterable[float]) -> tuple[float, ...]:
    """ "0.5,0.75,1.0" (or numbers) -> a de-duplicated tuple; each in (0, 2]."""
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",") if p.strip()]
        try:
            numbers = [float(p) for p in parts]
        except ValueError as exc:
            raise InputError(f"scales {value!r}: expected comma-separated numbers") from exc
    else:
        numbers = [float(v) for v in value]
    if not numbers:
        raise InputError("at least one scale is needed")
    for scale in numbers:
        if not (0 < scale <= MAX_SCALE) or not math.isfinite(scale):
            raise InputError(f"scale {scale:g}: must be in (0, {MAX_SCALE:g}]")
    return tuple(dict.fromkeys(numbers))


def plan_items(
    candidates: Sequence[Candidate], scales: Sequence[float], requests: Sequence[dict[str, Any]]
) -> list[WorkItem]:
    """Base row, then every candidate x scale (candidate-major)."""
    if not requests:
        raise InputError("no prompts to evaluate with")
    fixed = tuple(dict(r) for r in requests)
    items = [WorkItem(0, BASE, "", 0.0, fixed)]
    for candidate in candidates:
        for scale in scales:
            items.append(WorkItem(len(items), candidate.name, candidate.key, float(scale), fixed))
    return items


def pick_winner(rows: Sequence[dict[str, Any]], order: Sequence[str] = ()) -> dict[str, Any] | None:
    """The eligible row with the lowest `score` (see the module docstring); None when none is."""
    rank = {name: i for i, name in enumerate(order)}
    eligible = [
        r for r in rows if r.get("eligible") and r["candidate"] != BASE and _finite(r["score"])
    ]
    if not eligible:
        return None
    return min(
        eligible,
        key=lambda r: (r["score"], abs(r["scale"] - 1.0), rank.get(r["candidate"], len(rank))),
    )


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)
