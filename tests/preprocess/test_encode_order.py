"""`Encoder.encode_tensors` queues the VAE's work and launches the conditions behind it before it
reads anything back: the outputs are the stages' own, run one by one, and a NaN latent is still
refused, naming its sample, before any codes run."""

from __future__ import annotations

import pytest
import torch

from hotstep_ray.core.contracts import PreprocessOptions
from hotstep_ray.preprocess.encode import Encoder
from hotstep_ray.preprocess.items import EncodeItem, EncoderSettings
from hotstep_ray.preprocess.model_paths import resolve_models

HOP = 1920  # audio samples per 25 Hz latent frame at 48 kHz


@pytest.fixture(scope="module")
def encoder(tiny_ckpt) -> Encoder:
    return Encoder.load(resolve_models(tiny_ckpt, PreprocessOptions()), EncoderSettings(), "cpu")


def songs() -> list[EncodeItem]:
    generator = torch.Generator().manual_seed(5)
    audio = [0.3 * torch.randn(2, frames * HOP, generator=generator) for frames in (6, 9)]
    return [
        EncodeItem("a", audio[0], "warm synth pads", "[verse]\nla la", genre_prompt="synthwave"),
        EncodeItem("b", audio[1], "dry acoustic guitar", "[instrumental]"),
    ]


def test_a_batch_equals_its_stages_run_one_by_one(encoder) -> None:
    items = songs()
    latents, conds, genre, codes = encoder.encode_tensors(items)
    want_latents = encoder.latents(items)
    want_conds = encoder.conditions(
        [i.caption_prompt for i in items], [i.lyric_prompt for i in items]
    )
    want_genre = encoder.conditions([items[0].genre_prompt], [items[0].lyric_prompt])
    want_codes = encoder.codes(want_latents)
    # exact: the same calls on the same batches in this process, so the same kernels and sums
    for got, want in zip(latents, want_latents, strict=True):
        assert torch.equal(got, want)
    for got, want in zip(codes, want_codes, strict=True):
        assert torch.equal(got, want)
    assert set(genre) == {0}  # only the first song has a genre prompt
    for got, want in zip([*conds, genre[0]], [*want_conds, *want_genre], strict=True):
        states, text_count, lyric_count = got
        assert torch.equal(states, want[0]) and (text_count, lyric_count) == want[1:]
        # every row is cut to its valid tokens: text + lyric + the one timbre token
        assert states.shape[0] == text_count + lyric_count + 1
        assert not states.requires_grad


def test_encode_hands_back_cpu_copies_of_the_batch_tensors(encoder) -> None:
    items = songs()
    samples = encoder.encode(items)
    latents, conds, genre, codes = encoder.encode_tensors(items)
    silence = encoder.dit.silence_latent
    for index, sample in enumerate(samples):
        assert sample.sample_id == items[index].sample_id
        assert torch.equal(sample.target_latents, latents[index])
        assert torch.equal(sample.encoder_hidden_states, conds[index][0])
        assert torch.equal(sample.audio_codes, codes[index])
        assert (sample.s_text, sample.s_lyric) == conds[index][1:]
        frames = latents[index].shape[0]
        assert sample.context_latents.shape == (frames, 128)
        assert torch.equal(sample.context_latents[:, :64], silence[:frames])
        assert bool((sample.context_latents[:, 64:] == 1).all())
        for tensor in (sample.target_latents, sample.encoder_hidden_states, sample.audio_codes):
            assert tensor.device.type == "cpu"
    assert torch.equal(samples[0].genre_hidden_states, genre[0][0])
    assert samples[0].s_text_genre == genre[0][1] and samples[1].genre_hidden_states is None


def test_nan_latents_are_refused_after_the_conditions_and_before_the_codes(
    encoder, monkeypatch
) -> None:
    ran: list[str] = []
    latents, conditions, codes = encoder.latents, encoder.conditions, encoder.codes

    def poisoned(items):
        ran.append("latents")
        out = latents(items)
        out[1][3, 7] = float("nan")  # the second song
        return out

    monkeypatch.setattr(encoder, "latents", poisoned)
    monkeypatch.setattr(
        encoder, "conditions", lambda *a: ran.append("conditions") or conditions(*a)
    )
    monkeypatch.setattr(encoder, "codes", lambda *a: ran.append("codes") or codes(*a))
    with pytest.raises(FloatingPointError, match="^b: VAE latents contain NaN or Inf"):
        encoder.encode(songs())
    assert ran == ["latents", "conditions", "conditions"]  # captions, genre; no codes
    # a benchmark's unchecked run goes through
    monkeypatch.setattr(encoder, "codes", codes)
    found, _, _, _ = encoder.encode_tensors(songs(), check_finite=False)
    assert bool(torch.isnan(found[1]).any())
