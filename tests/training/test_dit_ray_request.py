"""What a DiT job asks Ray for: the per-worker VRAM_GB in its ScalingConfig is the VRAM model's
prediction for the real model size, song length and fixed choices (no cluster; the trainer is
replaced by a recorder)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from test_dit_support import fast_options, write_cache

from hotstep_ray.core.storage import Storage
from hotstep_ray.models.full_configs import DIT_CONFIGS
from hotstep_ray.training import dit, ray_dit


@pytest.fixture
def full_size_folders(tmp_path):
    """Checkpoint roots holding only the real 2B / XL config.json (the request reads no weights)."""
    roots = {}
    for name, config in DIT_CONFIGS.items():
        folder = tmp_path / f"ckpt-{name}" / "turbo"
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps(config))
        roots[name] = folder.parent
    return roots


def _request(storage: Storage, root, **overrides) -> float:
    settings = dit.DitSettings(checkpoints_dir=str(root))
    gb, _ = ray_dit.vram_request_gb(fast_options(**overrides), settings, storage, "band")
    return gb


def test_the_request_follows_model_size_crop_and_reserve(tmp_path, full_size_folders) -> None:
    storage = Storage(tmp_path / "data")
    write_cache(storage, frames=(40, 64, 6000), condition_lengths=(8, 12, 10))
    small = _request(storage, full_size_folders["2b"], crop_frames=750, batch=1)
    assert small == int(small) and 6 <= small <= 24  # 2B weights ~4.5 GB + 2 GB reserve + crop
    long_crop = _request(storage, full_size_folders["2b"], crop_frames=6000, batch=1)
    assert long_crop > small  # a fixed full-song crop is not shrunk by the fit
    assert _request(storage, full_size_folders["xl"], crop_frames=750, batch=1) > small
    no_reserve = _request(
        storage, full_size_folders["2b"], crop_frames=750, batch=1, vram_reserve_mb=0
    )
    assert small - no_reserve in (2, 3)  # the 2048 MB reserve, rounded up to whole GB


def test_scaling_config_asks_for_the_predicted_vram(tmp_path, full_size_folders, monkeypatch):
    import ray.train.torch

    storage = Storage(tmp_path / "data")
    write_cache(storage)
    settings = dit.DitSettings(checkpoints_dir=str(full_size_folders["2b"]))
    options = fast_options(crop_frames=750, batch=1)
    predicted, _ = ray_dit.vram_request_gb(options, settings, storage, "band")
    seen = {}

    class Recorder:
        def __init__(self, _loop, **kwargs):
            seen.update(kwargs)

        def fit(self):
            return SimpleNamespace(metrics={"step": 0}, checkpoint=None)

    monkeypatch.setattr(ray.train.torch, "TorchTrainer", Recorder)
    monkeypatch.setattr(ray_dit, "check_placement", lambda _ray, _gb: True)  # VRAM_GB declared
    result = ray_dit.train_dit_on_ray(options, storage, "band", settings, use_gpu=False)
    scaling = seen["scaling_config"]
    assert scaling.resources_per_worker == {"CPU": 1, ray_dit.VRAM_RESOURCE: predicted}
    assert result.vram_gb == predicted and scaling.num_workers == 1
    assert seen["run_config"].failure_config.max_failures == 2
    ray_dit.train_dit_on_ray(options, storage, "band", settings, use_gpu=False, vram_gb=40)
    assert seen["scaling_config"].resources_per_worker[ray_dit.VRAM_RESOURCE] == 40
    # On GPUs a one-worker job asks for the share of the card its memory takes (one 150 GB card
    # here), so an LM run can train beside it; two workers take whole cards.
    import ray

    card = {"Alive": True, "Resources": {"GPU": 1.0, ray_dit.VRAM_RESOURCE: 150.0}}
    monkeypatch.setattr(ray, "nodes", lambda: [card])
    ray_dit.train_dit_on_ray(options, storage, "band", settings, use_gpu=True, vram_gb=30)
    assert seen["scaling_config"].resources_per_worker == {"GPU": 0.2, ray_dit.VRAM_RESOURCE: 30}
    ray_dit.train_dit_on_ray(
        options, storage, "band", settings, use_gpu=True, vram_gb=30, num_workers=2
    )
    assert seen["scaling_config"].resources_per_worker["GPU"] == 1.0
