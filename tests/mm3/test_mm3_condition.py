"""Conditioning: plain-nearest resample (trap 7), caption from <stem>.mm3.txt only, caption
hygiene (trap 6), teacher forcing == the reference rollout's frames (trap 4), seams recorded."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from diffusers.modular_pipelines.minimax_music3 import encoders

from hotstep_ray.core.storage import Storage
from hotstep_ray.mm3 import checkpoint as ckpt
from hotstep_ray.mm3 import latent_length
from hotstep_ray.mm3.aligned import teacher_forced_hiddens
from hotstep_ray.mm3.condition import (
    INSTRUMENTAL,
    Mm3CaptionError,
    encode_span,
    prompt_text,
    read_caption,
    resample_nearest,
    rollout,
    sampled_condition,
    split_lyrics,
    tokenize,
)
from hotstep_ray.mm3.preprocess import load_condition_models

CAPTION = "## Global Metadata\n- **Genre**: synth-pop, 120 BPM\n\nVocal Details\n"
LYRICS = "[verse]\nneon lights\n[chorus]\nla la\n"


@pytest.fixture(scope="module")
def models(mm3_checkpoints):
    paths = ckpt.Mm3Paths.find(mm3_checkpoints)
    return load_condition_models(paths, torch.device("cpu"), torch.float32)


def test_condition_resample_is_plain_nearest():
    frames, length = 200, latent_length(200)
    assert length == 689
    features = torch.arange(frames, dtype=torch.float32).repeat(3, 1)  # [3, 200]: value = index
    out = resample_nearest(features, length)
    source = torch.floor(torch.arange(length) * (frames / length)).long()
    assert torch.equal(out[0].long(), source)
    exact = F.interpolate(features[None], size=length, mode="nearest-exact")[0]
    assert (exact != out).any(dim=0).sum() == 100  # nearest-exact would move 100 of 689


def test_encode_span_equals_the_condition_encoder_on_a_window(models):
    hiddens = torch.randn(200, 8 * 16)
    reference = models.condition_encoder(hiddens[None])[0]  # the module's own resample
    ours = encode_span(models.condition_encoder, hiddens, 689)
    # The same encoder call on the same [1, 200, 128] input in this process, then a gather: equal
    # but for round-off; plain vs "nearest-exact" resampling would move 100 columns by O(1).
    assert torch.allclose(ours, reference, atol=1e-6)


def test_caption_comes_from_the_mm3_file_never_the_ace_caption(tmp_path):
    source = Storage(tmp_path)
    source.write_text("song.txt", "caption: an ACE caption\n")
    with pytest.raises(Mm3CaptionError, match=r"song\.mm3\.txt"):
        read_caption(source, "song.wav")
    source.write_bytes("song.mm3.txt", "\ufeff".encode() + CAPTION.encode())
    assert read_caption(source, "song.wav") == CAPTION  # BOM dropped, text as written
    source.write_text("blank.mm3.txt", " \n\n")
    with pytest.raises(Mm3CaptionError, match="empty"):
        read_caption(source, "blank.flac")


def test_caption_hygiene_and_prompt_ids(models):
    text = prompt_text(CAPTION, LYRICS)
    # Caption lines via splitlines(): markdown stripped, no blank line, no trailing newline.
    assert (
        "<|caption_start|>Global Metadata\nGenre: synth-pop, 120 BPM\nVocal Details<|caption_end|>"
        in text
    )
    # Lyrics via split("\n"): the trailing newline of the lyrics is kept, as the reference does.
    assert "<|lyrics_start|>[start]\n[verse]\nneon lights\n[chorus]\nla la\n<|lyrics_end|>" in text
    ids = tokenize(models, CAPTION, LYRICS)
    assert models.tokenizer.decode(ids[0]) == text
    assert (ids[1, 1:-2] == 151654).all() and ids[1, 0] == ids[0, 0]  # audio-CFG row


def test_lyrics_split_into_segments_by_lines():
    # split("\n") keeps the empty piece after a trailing newline: 5 lines, shares of 2 and 3.
    assert split_lyrics("a\nb\nc\nd\n", 2) == ["a\nb", "c\nd\n"]
    assert split_lyrics("[verse]\nla", 3) == ["[verse]", INSTRUMENTAL, "la"]
    assert split_lyrics("la", 1) == ["la"]


def test_teacher_forcing_reproduces_the_reference_rollout(models, monkeypatch):
    # Record the codes of every AR iteration (iteration 0 included: the warm-up row), then
    # replay them: the frames must equal the rollout's, which pins the one-frame offset (trap 4).
    recorded = []
    original = encoders._generate_depth_codes

    def record(*args, **kwargs):
        codes, hidden = original(*args, **kwargs)
        recorded.append(codes[0].clone())
        return codes, hidden

    monkeypatch.setattr(encoders, "_generate_depth_codes", record)
    frames = rollout(models, CAPTION, LYRICS, frames=6, seed=7)
    monkeypatch.undo()
    codes = torch.stack(recorded)
    assert codes.shape == (frames.shape[0] + 1, 8)
    replay = teacher_forced_hiddens(models, CAPTION, LYRICS, codes)
    # One parallel pass against the rollout's cached one-token steps: other kernels and orders.
    # The frames are RMS-normed float32 hidden states (RMS 1 over 16 features, so |h| <~ 4) of a
    # 2-layer, 16-wide LM, reductions over <= 32 features or the ~1e2 prompt tokens: round-off
    # ~u sqrt(Σ K) |h| <~ 6e-6 (u = eps_f32 / 2), inside atol + rtol |h| >= 1e-5.
    assert torch.allclose(replay, frames.float(), atol=1e-5)
    shifted = teacher_forced_hiddens(models, CAPTION, LYRICS, codes[1:])  # warm-up row dropped
    # The one-frame offset changes the frames far past that round-off (1e-3: 100x above it).
    assert not torch.allclose(shifted, frames[1:].float(), atol=1e-3)


def test_sampled_rollouts_record_their_seams(models):
    # 0.6 s of song in 0.2 s segments: 3 rollouts of 5 frames, seeds 11, 12, 13.
    cond = sampled_condition(models, CAPTION, LYRICS, duration_s=0.6, seed=11, segment_s=0.2)
    assert cond.frames_wanted == [5, 5, 5]
    assert cond.span_starts == [0, latent_length(5), latent_length(10)]
    assert cond.span_ends[:2] == [latent_length(5), latent_length(10)]
    assert cond.condition.shape == (latent_length(15), 32)
    assert cond.condition.dtype == torch.float16
    again = sampled_condition(models, CAPTION, LYRICS, duration_s=0.6, seed=11, segment_s=0.2)
    assert torch.equal(cond.condition, again.condition)  # seeded: reproducible
