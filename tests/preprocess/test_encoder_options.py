"""Run options reach the encoder; GPU encoder processes start with our allocator configuration."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from hotstep_ray.core.contracts import PreprocessOptions
from hotstep_ray.preprocess.items import ALLOC_ENV, ENCODER_ALLOC_CONF, allocator_env
from hotstep_ray.preprocess.ray_pipeline import encoder_remote_args
from hotstep_ray.preprocess.stages import encoder_settings


def test_codes_and_memory_options_reach_the_encoder_settings():
    default = encoder_settings(PreprocessOptions())
    assert (default.codes_fast_pass, default.codes_recheck_margin, default.memory_cap_gib) == (
        "auto",
        0.02,
        0.0,
    )
    chosen = PreprocessOptions(
        codes_fast_pass="off", codes_recheck_margin=0.1, gpu_memory_cap_gib=6
    )
    settings = encoder_settings(chosen)
    assert (settings.codes_fast_pass, settings.codes_recheck_margin, settings.memory_cap_gib) == (
        "off",
        0.1,
        6.0,
    )
    with pytest.raises(ValidationError):
        PreprocessOptions(codes_fast_pass="bf16")  # a test-only pass: not a run option
    with pytest.raises(ValidationError):
        PreprocessOptions(codes_recheck_margin=-0.1)


def test_gpu_encoders_start_with_expandable_segments_unless_the_user_chose(monkeypatch):
    monkeypatch.delenv(ALLOC_ENV, raising=False)
    assert allocator_env() == {ALLOC_ENV: ENCODER_ALLOC_CONF}
    assert encoder_remote_args(0.25) == {
        "runtime_env": {"env_vars": {ALLOC_ENV: "expandable_segments:True"}}
    }
    assert encoder_remote_args(0) == {}  # CPU actors: nothing to configure
    monkeypatch.setenv(ALLOC_ENV, "max_split_size_mb:256")
    assert allocator_env() == {} and encoder_remote_args(1) == {}
    # the newer, device-neutral name is the user's choice too (ours would override it)
    monkeypatch.delenv(ALLOC_ENV)
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:256")
    assert allocator_env() == {} and encoder_remote_args(1) == {}
