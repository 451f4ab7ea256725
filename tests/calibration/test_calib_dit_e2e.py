"""DiT calibration on the tiny DiT: the run's LoRA and one milestone x 2 scales, a tensor cache
whose latents are exactly one grid point's renders, latent Fréchet, the calibrated folder."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from hotstep_ray.audition.schemas import DitRequest
from hotstep_ray.calibration.dit_calibrate import (
    DitCalibrationConfig,
    DitWorker,
    calibrate_dit,
    dit_requests,
)
from hotstep_ray.calibration.prompts import song_prompts
from hotstep_ray.core import layout
from hotstep_ray.core.storage import Storage
from hotstep_ray.training import lm_data

RUN = "adapters/dit-turbo/crew/2026-02-03_04-05-06"
CACHE = "tensors/crew/turbo"
WINNER = ("epoch_2", 0.5)
CONFIG = DitCalibrationConfig(scales=(0.5, 1.0), seeds=4, duration_s=2.0)


@pytest.fixture(scope="module")
def audition(tmp_path_factory):
    from hotstep_ray.audition.dit_audition import DitAudition
    from hotstep_ray.models import tiny_tree
    from hotstep_ray.models.tiny_dit import write_tiny_dit

    root = tmp_path_factory.mktemp("calib-dit-checkpoints")
    write_tiny_dit(root / tiny_tree.DIT_DIR, variant="turbo", seed=0)
    tiny_tree.write_tiny_vae(root / tiny_tree.VAE_DIR, 1)
    tiny_tree.write_tiny_text_encoder(root / tiny_tree.TEXT_ENCODER_DIR, 2)
    return DitAudition.from_checkpoints(root, device="cpu")


def _export_lora(audition, storage: Storage, key: str, seed: int) -> None:
    from hotstep_ray.audition.planner import shared_copy
    from hotstep_ray.training import adapters
    from hotstep_ray.training.export import ACESTEP_OFFICIAL_NAMES, export_lora

    transformer = shared_copy(audition.models.transformer)
    spec = adapters.AdapterSpec(rank=4, targets=adapters.DIT_ATTENTION_TARGETS)
    adapters.inject(transformer, spec)
    generator = torch.Generator().manual_seed(seed)
    for param in adapters.adapter_parameters(transformer).values():
        param.data = 0.3 * torch.randn(param.shape, generator=generator)
    export_lora(transformer, storage, key, rename=ACESTEP_OFFICIAL_NAMES, trigger="crewx")


@pytest.fixture(scope="module")
def outcome(audition, tmp_path_factory):
    storage = Storage(tmp_path_factory.mktemp("calib-dit-data"))
    _export_lora(audition, storage, RUN, seed=1)
    _export_lora(audition, storage, f"{RUN}/milestones/{WINNER[0]}", seed=2)
    songs = lm_data.synthetic_songs(4, 3)
    lm_data.write_lm_codes(storage.local_path(f"{CACHE}/lm_codes.jsonl"), songs)
    prompts = song_prompts(songs, CONFIG.seeds, CONFIG.base_seed, "crewx")
    worker = DitWorker(audition, storage)
    adapter = worker.adapter(f"{RUN}/milestones/{WINNER[0]}")
    for prompt, fields in zip(prompts, dit_requests(prompts, CONFIG), strict=True):
        latents = worker.latents(DitRequest(**fields), adapter, WINNER[1])  # [50, 64]
        tensors = {
            "target_latents": latents,
            "context_latents": torch.zeros(latents.shape[0], 128),
            "encoder_hidden_states": torch.zeros(4, 8),
            "encoder_attention_mask": torch.ones(4),
        }
        save_file(tensors, str(storage.local_path(f"{CACHE}/{prompt.song}.safetensors")))
    log = {"config": {"dit_name": "acestep-v15-turbo", "tensors": CACHE, "trigger": "crewx"}}
    storage.write_json(f"{RUN}/dit_train_log.json", log)
    result = calibrate_dit(storage, RUN, worker=lambda: DitWorker(audition, storage), config=CONFIG)
    return storage, result


def test_the_grid_point_that_made_the_latents_wins(outcome):
    _, result = outcome
    rows = {(r["candidate"], r["scale"]): r for r in result.rows}
    assert len(rows) == 5 and rows[("base", 0.0)]["frames"] == 4 * 50
    assert (result.winner["candidate"], result.winner["scale"]) == WINNER
    # The winner re-renders the cached latents in this process (same worker code, batch 1). FD is
    # quadratic in a perturbation of full-rank fits (200 frames x 64 channels), so even a float32
    # re-render (~1e-6 of |latent| ~ 1) would land far below 1e-6, and the FD of identical fits
    # is float64 round-off (<~ 1e-8 at these magnitudes). Every other grid point renders other
    # latents: > 1e-3 keeps a wide gap above that floor.
    assert rows[WINNER]["frechet"] == pytest.approx(0.0, abs=1e-6)
    assert min(r["frechet"] for k, r in rows.items() if k != WINNER) > 1e-3


def test_dit_calibrated_folder(outcome):
    storage, result = outcome
    doc = storage.read_json(f"{RUN}-calibrated/hot_step_eval.json")
    assert doc["kind"] == "dit" and doc["dataset"]["frames"] == 200
    assert doc["trigger"] == {"word": "crewx", "position": "prepend"}
    assert doc["prompts"][0]["caption"].startswith("crewx, ")
    assert layout.has_weights(storage, result.folder.weights_key)
    artist = "adapters/dit-turbo/crew"
    assert layout.latest_run_dir(storage, artist, skip_calibrated=True) == RUN


def test_dit_holdout_loss_uses_fixed_draws_per_song(audition):
    from types import SimpleNamespace

    from hotstep_ray.training.dit_data import Song, TensorCache
    from hotstep_ray.training.dit_loss import LossConfig
    from hotstep_ray.training.holdout import HoldoutEval, dit_song_losses

    condition = audition._condition("crewx, calm", DitRequest(caption="x", duration=2))[0][0]
    generator = torch.Generator().manual_seed(0)
    songs = [
        Song(f"s{i}", torch.randn(60, 64, generator=generator), torch.zeros(60, 128),
             condition.detach(), torch.ones(condition.shape[0], dtype=torch.bool))
        for i in range(2)
    ]  # fmt: skip
    held = TensorCache(songs, torch.ones(64), "computed", {})
    loss = LossConfig("turbo", 0.0, -0.4, 1.0, 0.0, 1.0, "none", 5.0, 0.5, None)
    run = SimpleNamespace(
        models=audition.models,
        fit=SimpleNamespace(crop_frames=40),
        device=torch.device("cpu"),
        options=SimpleNamespace(seed=42),
        loss=loss,
        autocast=None,
        null_condition=audition.models.condition_encoder.null_condition_emb.detach(),
    )
    evaluator = HoldoutEval(dit_song_losses(run, held, draws=2), songs=2)
    first = evaluator(1, audition.models.transformer)
    # A finite, positive flow MSE (unit-variance targets: O(1)); the fixed draws make the second
    # call the same computation in this process, so equal exactly.
    assert first is not None and 0 < first < 100 and evaluator(2, run.models.transformer) == first
