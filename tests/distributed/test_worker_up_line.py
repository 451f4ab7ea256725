"""The line a Ray Train worker logs on coming up splits its wait at its process's start."""

from __future__ import annotations

import re
import time

import psutil

from hotstep_ray.distributed.runtime import worker_up_line


def test_the_wait_is_split_at_the_process_start():
    submitted = psutil.Process().create_time() - 5.0  # the process started 5 s after submitting
    before = time.time()
    waited, placed, rest = map(float, re.findall(r"\d+\.\d", worker_up_line(submitted)))
    assert placed == 5.0  # printed to 0.1 s: exact for a 5.0 s gap
    assert waited >= round(before - submitted, 1) - 0.05  # up to the line's own rounding
    assert abs(waited - placed - rest) <= 0.1 + 1e-9  # the parts add up, to two roundings
