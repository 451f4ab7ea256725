"""Contracts: defaults in one place, camelCase on the wire, unknown options refused."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from hotstep_ray.core.contracts import (
    LabelOptions,
    PreprocessOptions,
    Sample,
    TrainDitOptions,
    TrainLmOptions,
    schedule_steps,
)


def test_bare_request_gets_the_documented_defaults():
    lm = TrainLmOptions()
    assert (lm.lm_size, lm.adapter_type, lm.optimizer, lm.epochs, lm.grad_accum) == (
        "4B",
        "lokr",
        "muon",
        75,
        2,
    )
    # the LM recipe's stop and milestone defaults (issue 7), not the studio route's 0.1 / off
    assert (lm.target_loss, lm.milestone_step) == (4.0, 1.0)
    assert (lm.lokr_dim, lm.lokr_alpha, lm.lokr_factor, lm.learning_rate) == (128, 128, 6, 1e-4)
    dit = TrainDitOptions()
    assert dit.adapter_type == "lokr" and dit.lokr_dim == 512 and dit.grad_accum == 4
    assert (dit.crop_min_frames, dit.crop_max_frames, dit.cfg_ratio) == (375, 1250, 0.15)
    pre = PreprocessOptions()
    assert (pre.max_caption_tokens, pre.max_lyric_tokens, pre.vae_overlap_frames) == (512, 2048, 48)
    assert LabelOptions().merge_policy == "fill_missing"


def test_dit_fallbacks_follow_the_adapter_type():
    lokr, lora = TrainDitOptions(), TrainDitOptions(adapter_type="lora")
    assert (lokr.effective_learning_rate, lokr.effective_weight_decay) == (2e-3, 1e-3)
    assert (lora.effective_learning_rate, lora.effective_weight_decay) == (5e-4, 1e-2)
    assert (lokr.effective_loss_weighting, lora.effective_loss_weighting) == ("none", "flow_snr")
    assert TrainDitOptions(learning_rate=1e-3).effective_learning_rate == 1e-3
    assert TrainDitOptions(lokr_alpha=0).effective_lokr_alpha == 512


def test_wire_format_is_camel_case_and_accepts_both():
    opts = TrainDitOptions.model_validate({"adapterType": "lora", "crop_min_frames": 400})
    assert opts.adapter_type == "lora" and opts.crop_min_frames == 400
    wire = opts.to_json_dict()
    assert wire["adapterType"] == "lora" and "cropMinFrames" in wire


@pytest.mark.parametrize(
    "bad",
    [
        {"learningrate": 1e-4},  # typo: refused, not ignored
        {"epochs": 0},
        {"lokrFactor": 1},
        {"tMin": 0.6, "tMax": 0.5},
        {"cropMinFrames": 2000, "cropMaxFrames": 1000},
    ],
)
def test_bad_dit_options_are_refused(bad):
    with pytest.raises(ValidationError):
        TrainDitOptions.model_validate(bad)


def test_lm_max_len_is_auto_or_at_least_512():
    assert TrainLmOptions(max_len=0).max_len == 0
    with pytest.raises(ValidationError):
        TrainLmOptions(max_len=100)


def test_schedule_arithmetic_matches_the_seed_preview():
    # 12 samples, batch 1, GA 4 -> 3 steps/epoch; 500 epochs -> 1500; warmup max(50, 75) = 75
    assert schedule_steps(12, 500, 1, 4, 0.05) == (3, 1500, 75)
    # warmup floor of 50 steps, capped at half the run
    assert schedule_steps(4, 10, 1, 4, 0.05) == (1, 10, 5)
    assert schedule_steps(10, 100, 1, 1, 0.05) == (10, 1000, 50)


def test_sample_repeat_must_be_positive():
    base = dict(
        sample_id="0" * 16,
        rel_path="a.wav",
        audio_path="/a.wav",
        filename="a.wav",
        sidecar_path="/a.txt",
    )
    assert Sample(**base).repeat == 1
    with pytest.raises(ValidationError):
        Sample(**base, repeat=0)
