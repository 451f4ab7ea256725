"""The MM3 VRAM request (`mm3/vram.py`) against the H200 bench and the seed's ceiling, and the
`mm3 train-dit --ray` wiring (Ray itself: test_mm3_ray.py)."""

from __future__ import annotations

import json

import pytest
import torch
from diffusers import MiniMaxMusic3Transformer1DModel
from typer.testing import CliRunner

from hotstep_ray.mm3 import ray_train, vram
from hotstep_ray.mm3.tiny import TINY_DIT
from hotstep_ray.mm3.train import Mm3TrainOptions

RELEASE = {}  # the released DiT config: every key at its diffusers default


@pytest.mark.parametrize("config", [RELEASE, TINY_DIT])
def test_parameter_counts_match_the_diffusers_model(config):
    with torch.device("meta"):
        model = MiniMaxMusic3Transformer1DModel(**config)
    full = dict(model.config)
    shape = vram.dit_shape(full)
    assert vram.dit_params(shape, full["fourier_embedding_dim"]) == sum(
        p.numel() for p in model.parameters()
    )
    assert config or vram.dit_params(shape) == 2_431_905_920  # mm3.md §1.3
    assert config or vram.lora_params(shape, 32) == 52_113_408  # the bench's trainable count


@pytest.mark.parametrize(
    ("crop", "checkpointing", "measured_gib"),
    [(689, False, 8.10), (1378, False, 10.96), (689, True, 5.59), (1378, True, 5.64)],
)
def test_estimate_tracks_the_h200_bench_and_stays_under_the_seed(crop, checkpointing, measured_gib):
    peak = vram.peak_bytes(RELEASE, rank=32, crop_latents=crop, checkpointing=checkpointing)
    # The estimate is plain Python arithmetic on the config (no tensor kernels: the same on any
    # CPU); the band is against the H200 bench's recorded peaks, the documented reference.
    assert measured_gib <= peak / vram.GIB <= 1.07 * measured_gib  # never under, at most +7 %
    assert peak < vram.SEED_PEAK_GB[crop] * vram.GB  # f32 + materialised attention is the ceiling


def test_request_adds_the_reserve_and_grows_with_crop_batch_and_dtype():
    base = Mm3TrainOptions()
    assert vram.request_gb(RELEASE, base) == 11  # 8.77 GB peak + 2.05 GB reserve, rounded up
    assert vram.request_gb(RELEASE, base.model_copy(update={"vram_reserve_mb": 0})) == 9
    assert vram.request_gb(RELEASE, base.model_copy(update={"batch": 4})) > 20
    assert vram.request_gb(RELEASE, base.model_copy(update={"dtype": "float32"})) >= 16
    assert vram.request_gb(RELEASE, base.model_copy(update={"gradient_checkpointing": True})) < 11


def test_cli_ray_flag_sends_the_options_to_the_ray_job(monkeypatch, tmp_path, mm3_checkpoints):
    from hotstep_ray.cli.main import app
    from hotstep_ray.distributed import runtime

    calls = {}

    def fake_job(options, storage, slug, checkpoints, **kwargs):
        calls.update(options=options, slug=slug, checkpoints=checkpoints, **kwargs)
        predicted = ray_train.predicted_vram_gb(options, checkpoints)
        calls["predicted"] = predicted
        return ray_train.RayMm3Result(
            "adapters/mm3-dit/band/r", "run", predicted, {}, None, {"lora": "a/b.safetensors"}
        )

    monkeypatch.setattr(ray_train, "train_mm3_on_ray", fake_job)
    monkeypatch.setattr(runtime, "ensure_ray", lambda address=None, **_: None)
    args = ["mm3", "train-dit", "band", "--data", str(tmp_path / "data"), "--json"]
    args += ["--checkpoints", str(mm3_checkpoints), "--ray", "--steps", "7", "--max-failures", "3"]
    outcome = CliRunner().invoke(app, args)
    assert outcome.exit_code == 0, outcome.output
    assert calls["options"].steps == 7 and calls["slug"] == "band"
    assert calls["max_failures"] == 3 and calls["vram_gb"] is None and calls["job_id"]
    assert calls["predicted"] == 3  # tiny DiT: ~0 GB of model + the 2048 MB reserve
    printed = json.loads(outcome.output[outcome.output.index("{") :])
    assert printed["lora"].endswith("a/b.safetensors")
