"""`EncoderSettings.release_cache_between_stages`: on CUDA, `Encoder.encode` returns the caching
allocator's unused blocks after the VAE and after the codes stage; off, or on the CPU, never.

No GPU here: `torch.cuda.empty_cache` is replaced by a recorder, and where a test needs CUDA
the release helper alone is told the device is CUDA while every stage still runs on the CPU."""

from __future__ import annotations

import os
from dataclasses import asdict, replace

import pytest
import torch

from hotstep_ray.core.contracts import PreprocessOptions
from hotstep_ray.preprocess import encode as encode_module
from hotstep_ray.preprocess.encode import Encoder, release_cached_blocks
from hotstep_ray.preprocess.items import (
    EncodedSample,
    EncodeItem,
    EncoderSettings,
    allocator_env,
    expandable_segments_active,
    resolve_release,
)
from hotstep_ray.preprocess.model_paths import resolve_models
from hotstep_ray.preprocess.stages import encoder_settings

HOP = 1920  # audio samples per 25 Hz latent frame at 48 kHz


@pytest.fixture(scope="module")
def encoder(tiny_ckpt) -> Encoder:
    return Encoder.load(resolve_models(tiny_ckpt, PreprocessOptions()), EncoderSettings(), "cpu")


def with_release(encoder: Encoder, on: bool) -> Encoder:
    """The same models (already folded) under `release_cache_between_stages=on`."""
    settings = replace(encoder.settings, release_cache_between_stages=on)
    parts = (encoder.vae, encoder.text_encoder, encoder.tokenizer, encoder.dit)
    return Encoder(*parts, settings, encoder.device, encoder.dtype)


def songs() -> list[EncodeItem]:
    """Two short songs of different lengths (5 and 8 frames), one with a genre variant (a second
    conditions call, which must not add a release)."""
    generator = torch.Generator().manual_seed(11)
    audio = [0.3 * torch.randn(2, frames * HOP, generator=generator) for frames in (5, 8)]
    return [
        EncodeItem("a", audio[0], "warm synth pads", "[verse]\nla la", genre_prompt="synthwave"),
        EncodeItem("b", audio[1], "dry acoustic guitar", "[instrumental]"),
    ]


@pytest.fixture
def events(monkeypatch) -> list[str]:
    """What ran, in order: "release" per `torch.cuda.empty_cache` call (recorded, not run)."""
    log: list[str] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: log.append("release"))
    return log


@pytest.fixture
def pretend_cuda(monkeypatch) -> list[torch.device]:
    """The release helper sees a CUDA device (the devices it was given are recorded)."""
    given: list[torch.device] = []
    real = encode_module.release_cached_blocks

    def on_cuda(device: torch.device) -> bool:
        given.append(device)
        return real(torch.device("cuda"))

    monkeypatch.setattr(encode_module, "release_cached_blocks", on_cuda)
    return given


def trace_stages(encoder: Encoder, log: list[str], monkeypatch) -> None:
    """Log each stage call of this encoder into `log`, next to the releases."""
    for name in ("latents", "conditions", "codes"):
        stage = getattr(encoder, name)

        def traced(*args, _stage=stage, _name=name):
            log.append(_name)
            return _stage(*args)

        monkeypatch.setattr(encoder, name, traced)


def test_release_helper_empties_the_cache_on_cuda_only(events) -> None:
    assert release_cached_blocks(torch.device("cuda", 0)) is True
    assert events == ["release"]
    assert release_cached_blocks(torch.device("cpu")) is False
    assert events == ["release"]  # the CPU has no allocator cache to return


def test_encode_releases_after_the_vae_and_codes_stages_on_cuda(
    encoder, events, pretend_cuda, monkeypatch
) -> None:
    on = with_release(encoder, True)
    trace_stages(on, events, monkeypatch)
    on.encode(songs())
    # The caption and genre conditions are launched while the VAE's queued work runs, before
    # the release after it, and share the allocator's blocks: no release between them.
    assert events == ["latents", "conditions", "conditions", "release", "codes", "release"]
    assert pretend_cuda == [torch.device("cpu")] * 2  # the encoder's own device, asked twice
    on.encode(songs()[1:])
    assert events.count("release") == 4  # two per batch, whatever its size


def test_encode_never_releases_when_off(encoder, events, pretend_cuda) -> None:
    with_release(encoder, False).encode(songs())
    assert events == [] and pretend_cuda == []


def test_encode_never_releases_on_the_cpu(encoder, events) -> None:
    on = with_release(encoder, True)
    assert on.settings.release_cache_between_stages and on.device.type == "cpu"
    on.encode(songs())
    assert events == []


def test_outputs_are_identical_with_release_on_and_off(encoder, events, pretend_cuda) -> None:
    released = with_release(encoder, True).encode(songs())
    kept = with_release(encoder, False).encode(songs())
    assert events.count("release") == 2  # the "on" run did take the release path
    assert len(released) == len(kept) == 2
    for a, b in zip(released, kept, strict=True):
        assert isinstance(a, EncodedSample) and a.sample_id == b.sample_id
        for field in (
            "target_latents",
            "context_latents",
            "encoder_hidden_states",
            "audio_codes",
        ):
            # exact: releasing the cache changes no computation (same process, same kernels)
            assert torch.equal(getattr(a, field), getattr(b, field)), (a.sample_id, field)
        assert (a.s_text, a.s_lyric, a.s_text_genre) == (b.s_text, b.s_lyric, b.s_text_genre)
        assert (a.genre_hidden_states is None) == (b.genre_hidden_states is None)
        if a.genre_hidden_states is not None:
            assert torch.equal(a.genre_hidden_states, b.genre_hidden_states)
    assert released[0].genre_hidden_states is not None  # the genre path was compared too


def test_real_runs_release_unless_expandable_segments(tiny_ckpt, monkeypatch) -> None:
    """The run and the Ray actors build settings from the run options (the actors through a
    dict): the release is "auto" there without any option and survives the round trip; auto
    releases unless the allocator runs expandable segments (what GPU encoder processes start
    with), and an explicit choice wins either way."""
    settings = encoder_settings(PreprocessOptions())
    assert settings.release_cache_between_stages is None
    assert EncoderSettings(**asdict(settings)) == settings
    off = replace(settings, release_cache_between_stages=False)
    assert EncoderSettings(**asdict(off)).release_cache_between_stages is False

    assert resolve_release(None, {}) is True
    assert resolve_release(None, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}) is False
    assert resolve_release(None, {"PYTORCH_ALLOC_CONF": "max_split_size_mb:64"}) is True
    assert resolve_release(True, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}) is True
    assert resolve_release(False, {}) is False
    mixed = "max_split_size_mb:128, expandable_segments:true"
    assert expandable_segments_active({"PYTORCH_CUDA_ALLOC_CONF": mixed})
    assert not expandable_segments_active({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"})
    # what GPU encoder processes get from `allocator_env`
    assert expandable_segments_active(allocator_env()) or "PYTORCH_CUDA_ALLOC_CONF" in os.environ

    # the encoder resolves it once, from its own process's environment
    models = resolve_models(tiny_ckpt, PreprocessOptions())
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    assert Encoder.load(models, settings, "cpu").release_cache is False
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    assert Encoder.load(models, settings, "cpu").release_cache is True
