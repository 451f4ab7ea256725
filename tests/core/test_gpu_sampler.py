"""The GPU-busy share of a stage, read from `nvidia-smi --loop`: here a stand-in script prints
what nvidia-smi prints for two GPUs, so the parsing, the per-sample grouping and the window
arithmetic are checked without a GPU."""

from __future__ import annotations

import time

from hotstep_ray.core.gpu_sampler import GpuSampler

# Periods of two GPUs each ("util, MiB"); one unreadable line as the driver sometimes gives. A
# period is recorded once the next one begins, so the fifth only closes the fourth.
FAKE = """#!/bin/sh
for row in "0, 100|0, 50" "35, 9000|0, 50" "[N/A], [N/A]|80, 20000" "0, 100|0, 60" \\
    "0, 100|0, 60"; do
  echo "$row" | tr '|' '\\n'
  sleep 0.4
done
sleep 30
"""


def test_busy_share_mean_and_peak_of_a_window(tmp_path):
    script = tmp_path / "nvidia-smi"
    script.write_text(FAKE)
    script.chmod(0o755)
    start = time.perf_counter()  # before the sampler starts: its first line counts
    with GpuSampler(binary=str(script)) as gpu:
        deadline = start + 10
        while time.perf_counter() < deadline and gpu.use(start, time.perf_counter()) is None:
            time.sleep(0.05)
        while time.perf_counter() < deadline:
            use = gpu.use(start, time.perf_counter())
            if use is not None and use.samples == 4:
                break
            time.sleep(0.05)
    assert use is not None and use.samples == 4
    # samples: busiest util 0, 35, 80, 0 -> busy 2 of 4, mean 28.75 %; peak memory 20000 MiB
    assert (use.busy, use.mean_util, use.peak_mib) == (0.5, 28.75, 20000.0)
    assert gpu.use(start - 100, start - 50) is None  # no sample in that window


def test_without_nvidia_smi_every_answer_is_none():
    with GpuSampler(binary="no-such-nvidia-smi-here") as gpu:
        assert not gpu.available
        assert gpu.use(0, time.perf_counter()) is None
