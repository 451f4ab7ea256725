"""What the device benchmarks share: the JSON report a run rewrites after every row (so a run cut
short keeps what it measured), nearest-rank percentiles, and the seeded 5 Hz codes both audition
benchmarks decode. Imported by the scripts beside it (`python bench/<script>.py` puts this folder
on the path first)."""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile `q` (0-100) of `values`."""
    ordered = sorted(values)
    rank = round(q / 100 * (len(ordered) - 1))
    return ordered[min(len(ordered) - 1, max(0, rank))]


def seeded_codes(seconds: float, seed: int) -> list[int]:
    """`seconds` of 5 Hz FSQ codes in [0, 64000), the same for a seed on every machine."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 64000, (int(seconds * 5),), generator=generator).tolist()


class JsonReport:
    """`report` written to `out` after every `record`ed row and every failed `attempt`;
    `before_write` refreshes fields known only as the run goes (the device, versions)."""

    def __init__(
        self, out: Path, report: dict[str, Any], before_write: Callable[[], None] | None = None
    ) -> None:
        self.out, self.report, self.before_write = out, report, before_write
        report.setdefault("rows", [])
        report.setdefault("errors", [])

    def write(self) -> None:
        if self.before_write is not None:
            self.before_write()
        self.out.write_text(json.dumps(self.report, indent=2, default=str) + "\n")

    def record(self, row: dict) -> None:
        self.report["rows"].append(row)
        print(json.dumps(row, default=str), flush=True)
        self.write()

    def attempt(self, name: str, fn: Callable[[], None]) -> None:
        """`fn()`, its failure recorded with its trace: one section failing never loses the
        others."""
        try:
            fn()
        except Exception as exc:
            self.report["errors"].append(
                {"section": name, "error": repr(exc), "trace": traceback.format_exc()}
            )
            print(f"[{name}] failed: {exc!r}", file=sys.stderr, flush=True)
            self.write()
