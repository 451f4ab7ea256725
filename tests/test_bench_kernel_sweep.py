"""preprocess_bench's `--kernel-sweep`: a sweep report's fastest configurations go into the Oobleck
kernels' tables, per kernel and channel count, over all of that channel count's shapes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from hotstep_ray.models import oobleck_kernels

BENCH = Path(__file__).resolve().parents[1] / "bench" / "preprocess_bench.py"


@pytest.fixture
def bench(monkeypatch):
    spec = importlib.util.spec_from_file_location("preprocess_bench_under_test", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # the tables are module globals: restore them after the test
    monkeypatch.setattr(oobleck_kernels, "RESIDUAL_TILES", dict(oobleck_kernels.RESIDUAL_TILES))
    monkeypatch.setattr(
        oobleck_kernels, "SNAKE_NWC_CONFIGS", dict(oobleck_kernels.SNAKE_NWC_CONFIGS)
    )
    return module


def rows(*timed):
    return [{"cfg": list(cfg), "ms": ms} for cfg, ms in timed]


def test_the_lowest_total_over_a_channel_counts_shapes_wins(bench, tmp_path):
    a, b, c = (64, 128, 64, 4, 3), (128, 128, 64, 8, 3), (32, 128, 32, 4, 3)
    report = {
        "shapes": [
            # level 0 and level 1 of 128 channels: b is faster in total (0.7 + 0.6 < 1.0 + 0.5);
            # c is the fastest on one shape only, never timed on the other, so it cannot win
            {"kernel": "residual", "channels": 128, "results": rows((a, 1.0), (b, 0.7))},
            {"kernel": "residual", "channels": 128, "results": rows((a, 0.5), (b, 0.6), (c, 0.1))},
            {"kernel": "snake_nwc", "channels": 256, "results": rows(((8192, 16), 0.2), ((4096, 4), 0.3))},
        ]
    }  # fmt: skip
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(report))
    untouched = oobleck_kernels.RESIDUAL_TILES[256]
    chosen = bench.apply_kernel_sweep(str(path))
    assert chosen == {"residual_128": list(b), "snake_nwc_256": [8192, 16]}
    assert oobleck_kernels.RESIDUAL_TILES[128] == b
    assert oobleck_kernels.SNAKE_NWC_CONFIGS[256] == (8192, 16)
    assert oobleck_kernels.RESIDUAL_TILES[256] == untouched  # not in the report
