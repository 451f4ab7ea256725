"""Stand-ins that tests send to `hotstep_ray.labeling.isolation`'s helper process.

The child unpickles them by module and name, and finds this module through the test run's
`sys.path` (the child gets it as PYTHONPATH). Stdlib imports only, so the child starts fast.
"""

from __future__ import annotations

import os
import re
import signal
from dataclasses import dataclass
from typing import Any


def child_pid(stage) -> int:
    return os.getpid()


def never_returns(stage) -> None:
    """Stuck in C code that holds the GIL, as Essentia's key extractor is on a NaN sample: the
    regex engine backtracking through 2^40 ways to split the a's never comes back by itself."""
    stage("key analysis")
    re.match(r"(a+)+$", "a" * 40 + "b")


def dies(stage) -> None:
    stage("tempo analysis")
    os.kill(os.getpid(), signal.SIGKILL)


def refuses(stage) -> None:
    raise ValueError("bad input")


@dataclass(frozen=True)
class HangingAnalyzer:
    """An `EssentiaAnalyzer` stand-in: the files in `hang_on` never finish their key analysis;
    every other file gets the same plausible analysis."""

    hang_on: tuple[str, ...] = ()
    time_limit_s: float = 1.0
    notes: tuple[str, ...] = ()  # what the analysis says it left out

    def analyze(self, storage: Any, key: str, stage) -> tuple[Any, dict[str, str]]:
        # Loaded already: the label job sends `analysis.analyze_file`, whose module the child
        # imports before the call's time limit starts.
        from hotstep_ray.labeling.analysis import AudioFeatures

        stage("decoding")
        if key in self.hang_on:
            never_returns(stage)
        features = AudioFeatures(
            3.0, bpm=120, bpm_raw=120.0, key="A", scale="major", key_strength=0.9, notes=self.notes
        )
        return features, {}

    def cached(self, record: Any, stamp: Any) -> None:
        return None
