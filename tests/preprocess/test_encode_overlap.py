"""`EncoderSettings.overlap_conditions`: the caption / lyric conditions run in a worker thread
beside the VAE, with the same outputs, real concurrency, errors raised in the caller and the
worker always joined. Off by default (measured slower on an H200); "auto" turns it on on CUDA
from an encoder's second batch."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
import torch

from hotstep_ray.preprocess.encode import Encoder
from hotstep_ray.preprocess.items import EncodedSample, EncodeItem, EncoderSettings
from hotstep_ray.preprocess.model_paths import resolve_models
from hotstep_ray.preprocess.plan import PreprocessRunOptions

HOP = 1920  # audio samples per 25 Hz latent frame at 48 kHz


@pytest.fixture(scope="module")
def encoder(tiny_ckpt) -> Encoder:
    return Encoder.load(resolve_models(tiny_ckpt, PreprocessRunOptions()), EncoderSettings(), "cpu")


def with_overlap(encoder: Encoder, overlap: bool | None) -> Encoder:
    settings = replace(encoder.settings, overlap_conditions=overlap)
    parts = (encoder.vae, encoder.text_encoder, encoder.tokenizer, encoder.dit)
    return Encoder(*parts, settings, encoder.device, encoder.dtype)


def songs() -> list[EncodeItem]:
    generator = torch.Generator().manual_seed(5)
    audio = [0.3 * torch.randn(2, frames * HOP, generator=generator) for frames in (6, 9)]
    return [
        EncodeItem("a", audio[0], "warm synth pads", "[verse]\nla la", genre_prompt="synthwave"),
        EncodeItem("b", audio[1], "dry acoustic guitar", "[instrumental]"),
    ]


def test_overlapped_batches_equal_sequential_ones(encoder) -> None:
    overlapped = with_overlap(encoder, True)
    sequential = with_overlap(encoder, False)
    assert overlapped.overlaps_now() and not sequential.overlaps_now()
    got, want = overlapped.encode(songs()), sequential.encode(songs())
    assert len(got) == len(want) == 2
    for a, b in zip(got, want, strict=True):
        assert isinstance(a, EncodedSample) and a.sample_id == b.sample_id
        for field in ("target_latents", "encoder_hidden_states", "audio_codes"):
            assert torch.equal(getattr(a, field), getattr(b, field)), (a.sample_id, field)
        # the worker thread ran under no_grad too (grad mode is per thread)
        assert not a.encoder_hidden_states.requires_grad
        assert (a.s_text, a.s_lyric, a.s_text_genre) == (b.s_text, b.s_lyric, b.s_text_genre)
    assert got[0].genre_hidden_states is not None
    assert torch.equal(got[0].genre_hidden_states, want[0].genre_hidden_states)
    assert got[1].genre_hidden_states is None


def test_conditions_run_in_a_worker_while_the_vae_runs(encoder, monkeypatch) -> None:
    """The VAE stage waits until the conditions have started: without real concurrency it would
    time out. The conditions ran on another thread, the VAE on the caller's."""
    on = with_overlap(encoder, True)
    started, threads = threading.Event(), {}
    latents, conditions = on.latents, on.conditions

    def traced_conditions(*args):
        threads.setdefault("conditions", threading.current_thread())
        started.set()
        return conditions(*args)

    def traced_latents(items):
        threads["latents"] = threading.current_thread()
        assert started.wait(timeout=30), "the conditions never ran beside the VAE"
        return latents(items)

    monkeypatch.setattr(on, "conditions", traced_conditions)
    monkeypatch.setattr(on, "latents", traced_latents)
    on.encode(songs())
    assert threads["latents"] is threading.current_thread()
    assert threads["conditions"] is not threading.current_thread()
    assert not threads["conditions"].is_alive()  # joined before encode went on


def test_a_failing_side_raises_in_the_caller_and_the_worker_is_joined(
    encoder, monkeypatch
) -> None:
    on = with_overlap(encoder, True)
    workers: list[threading.Thread] = []

    def broken_conditions(*args):
        workers.append(threading.current_thread())
        raise ValueError("tokenizer exploded")

    monkeypatch.setattr(on, "conditions", broken_conditions)
    with pytest.raises(ValueError, match="tokenizer exploded"):
        on.encode(songs())
    assert workers and not workers[0].is_alive()

    # the VAE side failing: its error wins, and the worker still finished first
    on = with_overlap(encoder, True)
    finished = threading.Event()
    conditions = on.conditions

    def slow_conditions(*args):
        out = conditions(*args)
        finished.set()
        return out

    def nan_latents(items):
        return [torch.full((6, 64), float("nan")) for _ in items]

    monkeypatch.setattr(on, "conditions", slow_conditions)
    monkeypatch.setattr(on, "latents", nan_latents)
    with pytest.raises(FloatingPointError, match="a: VAE latents contain NaN"):
        on.encode(songs())
    assert finished.is_set()
    assert on.batches_done == 0  # a failed batch does not count

    def raising_latents(items):
        raise RuntimeError("out of memory")

    on = with_overlap(encoder, True)
    finished.clear()
    monkeypatch.setattr(on, "conditions", slow_conditions)
    monkeypatch.setattr(on, "latents", raising_latents)
    with pytest.raises(RuntimeError, match="out of memory"):
        on.encode(songs())
    assert finished.is_set()


def test_auto_overlaps_on_cuda_from_the_second_batch(encoder) -> None:
    assert EncoderSettings().overlap_conditions is False  # the default: never
    auto = with_overlap(encoder, None)
    assert auto.settings.overlap_conditions is None
    assert not auto.overlaps_now()  # the CPU: never by default
    auto.encode(songs()[:1])
    assert auto.batches_done == 1 and not auto.overlaps_now()
    auto.device = torch.device("cuda")  # only the decision is asked; nothing runs there
    auto.batches_done = 0
    assert not auto.overlaps_now()  # the first batch autotunes and captures undisturbed
    auto.batches_done = 1
    assert auto.overlaps_now()
    never = with_overlap(encoder, False)
    never.device, never.batches_done = torch.device("cuda"), 3
    assert not never.overlaps_now()
