"""How busy the GPUs were during each stage of a run, read from `nvidia-smi` once a second.

`nvidia-smi -l 1` keeps printing one line per GPU per second; a thread stamps each line with this
process's perf_counter clock, so a stage asks for the samples between its own start and end. A
sample counts as busy when any GPU's utilisation is above 0 % (the driver's "a kernel ran in the
last sample period"): the busy share says how much of a stage's wall time the GPU had work, the
mean utilisation how much of it. Without `nvidia-smi` (a CPU machine) every answer is None.
A period is recorded when the next one's first line arrives (its GPUs' lines come together), so
the newest second is missing until the one after it. Nothing here imports torch.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from dataclasses import dataclass

QUERY = "utilization.gpu,memory.used"


@dataclass(frozen=True)
class GpuUse:
    busy: float  # share of samples in which some GPU ran a kernel, 0..1
    mean_util: float  # mean over samples of the busiest GPU's utilisation, percent
    peak_mib: float  # the largest memory in use on one GPU, MiB
    samples: int


class GpuSampler:
    """`with GpuSampler() as gpu: ...; gpu.use(t0, t1)` (perf_counter seconds)."""

    def __init__(self, interval_s: int = 1, binary: str = "nvidia-smi") -> None:
        self.interval_s, self.binary = interval_s, shutil.which(binary)
        self.process: subprocess.Popen[str] | None = None
        self._samples: list[tuple[float, float, float]] = []  # (t, busiest util %, peak MiB)
        self._lock = threading.Lock()

    @property
    def available(self) -> bool:
        return self.binary is not None

    def __enter__(self) -> GpuSampler:
        if self.binary is None:
            return self
        command = [self.binary, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"]
        self.process = subprocess.Popen(
            [*command, f"--loop={self.interval_s}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        # One line per GPU per period; lines arriving within a few ms belong to one sample.
        pending: list[tuple[float, float]] = []
        last = 0.0
        for line in self.process.stdout:
            now = time.perf_counter()
            try:
                util, mib = (float(x) for x in line.split(","))
            except ValueError:
                continue  # "[N/A]" or a header: no reading this period
            if pending and now - last > 0.25:
                self._add(last, pending)
                pending = []
            pending.append((util, mib))
            last = now
        if pending:
            self._add(last, pending)

    def _add(self, at: float, gpus: list[tuple[float, float]]) -> None:
        with self._lock:
            self._samples.append((at, max(u for u, _ in gpus), max(m for _, m in gpus)))

    def use(self, start: float, end: float) -> GpuUse | None:
        """The samples taken between `start` and `end`; None without a GPU or a sample."""
        with self._lock:
            inside = [s for s in self._samples if start <= s[0] <= end]
        if not inside:
            return None
        return GpuUse(
            busy=sum(1 for _, util, _ in inside if util > 0) / len(inside),
            mean_util=sum(util for _, util, _ in inside) / len(inside),
            peak_mib=max(mib for _, _, mib in inside),
            samples=len(inside),
        )

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
