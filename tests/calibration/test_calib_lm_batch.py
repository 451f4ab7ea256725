"""The LM calibration worker decodes an item's requests in batches (`max_batch`) or one at a
time (`max_batch=1`, the sequential path): the same requests, the same code counts, one receipt
per request either way."""

from __future__ import annotations

import pytest

from hotstep_ray.audition.codes import codes_sha1
from hotstep_ray.audition.schemas import LmSampling
from hotstep_ray.calibration.grid import WorkItem
from hotstep_ray.calibration.lm_calibrate import (
    DEFAULT_MAX_BATCH,
    LmCalibrationConfig,
    LmWorker,
    lm_requests,
)
from hotstep_ray.calibration.prompts import song_prompts
from hotstep_ray.core.storage import Storage
from hotstep_ray.training import lm_data

pytestmark = pytest.mark.slow  # LM decodes of every grid point, batched and one by one
LORA = "adapters/lm-06b/batch/2026-01-01_00-00-00"


def _requests(duration_s: float | None, seeds: int) -> tuple[dict, ...]:
    config = LmCalibrationConfig(
        seeds=seeds, duration_s=duration_s, sampling=LmSampling(top_k=8, max_cot_tokens=16)
    )
    prompts = song_prompts(lm_data.synthetic_songs(3, 10), config.seeds, config.base_seed)
    return tuple(lm_requests(prompts, config))


@pytest.fixture
def calls(planner, monkeypatch) -> list:
    """What the worker asked the planner for: ("one", 1) per generate, ("batch", n) per batch."""
    log: list = []
    generate, generate_batch = planner.generate, planner.generate_batch

    def one(request, adapter=None):
        log.append(("one", 1))
        return generate(request, adapter)

    def batch(requests, adapter=None):
        log.append(("batch", len(requests)))
        return generate_batch(requests, adapter)

    monkeypatch.setattr(planner, "generate", one)
    monkeypatch.setattr(planner, "generate_batch", batch)
    return log


def test_the_default_batches_four_requests():
    assert LmCalibrationConfig().max_batch == DEFAULT_MAX_BATCH == 4
    with pytest.raises(ValueError):
        LmCalibrationConfig(max_batch=0)


def test_batched_and_sequential_items_give_the_same_counts(planner, calls, tmp_path):
    """Durations left to the LM: phase 1 runs per request (inside the batched path too), then
    phase 2 decodes 4 + 1 requests together; the sequential path generates them one by one."""
    item = WorkItem(0, "base", "", 0.0, _requests(None, 5))
    storage = Storage(tmp_path)
    batched = LmWorker(planner, storage, max_batch=4)(item)
    assert calls == [("batch", 4), ("batch", 1)]
    calls.clear()
    sequential = LmWorker(planner, storage, max_batch=1)(item)
    assert calls == [("one", 1)] * 5
    assert [len(c) for c in batched.outputs] == [len(c) for c in sequential.outputs]
    for result in (batched, sequential):
        assert result.receipts == [codes_sha1(c) for c in result.outputs]
        assert result.index == 0 and result.ms > 0


def test_a_batched_adapter_item(planner, calls, tmp_path, lm_tree, write_lm_lora):
    write_lm_lora(lm_tree, tmp_path / LORA, seed=5)
    item = WorkItem(1, "lora", LORA, 0.5, _requests(2, 3))
    worker = LmWorker(planner, Storage(tmp_path), max_batch=2)
    result = worker(item)
    assert calls == [("batch", 2), ("batch", 1)]
    assert [len(c) for c in result.outputs] == [10, 10, 10]
    assert len(set(result.receipts)) == 3  # one receipt per request, seeds differ
    loaded = worker.adapter(LORA)
    assert loaded.scale == 0.5 and (4, 0) in loaded.steppers  # 2 requests x [cond, uncond]


def test_calibration_workers_keep_adapters_unmerged(monkeypatch):
    """A sweep would hold a merged weight copy per candidate; its workers ask for none."""
    from hotstep_ray.audition.planner import PlannerLM
    from hotstep_ray.calibration.lm_calibrate import LmWorkerSpec

    seen: dict = {}

    def from_checkpoints(checkpoints, **options):
        seen.update(options)
        raise RuntimeError("stop here")

    monkeypatch.setattr(PlannerLM, "from_checkpoints", staticmethod(from_checkpoints))
    with pytest.raises(RuntimeError, match="stop here"):
        LmWorkerSpec(checkpoints="ckpt", data="data", lm="lm-0.6B")()
    assert seen["merge_adapters"] == "off" and seen["decode_mode"] == "auto"
