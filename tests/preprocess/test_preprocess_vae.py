"""Tiled VAE encode/decode: the window plan, and tiled == untiled.

The equality test uses a narrow Oobleck (8 channels, 4-d latents): the same strides, kernels and
dilations as the real VAE, hence the same receptive field (~6 latent frames each side for the
encoder, ~7 for the decoder), at 1/200 of the tiny VAE's CPU cost."""

from __future__ import annotations

import pytest
import torch
from diffusers import AutoencoderOobleck

from hotstep_ray.preprocess.audio_prep import HOP_SAMPLES
from hotstep_ray.preprocess.vae_tiles import Window, decode_latents, encode_moments, plan_windows


@pytest.mark.parametrize(
    ("frames", "chunk", "overlap"),
    [(10, 384, 48), (384, 384, 48), (385, 384, 48), (6000, 384, 48), (1000, 100, 0), (97, 64, 31)],
)
@pytest.mark.parametrize("tail_step", [0, 64, 7])
def test_window_plan_covers_the_song_with_context(
    frames: int, chunk: int, overlap: int, tail_step: int
) -> None:
    windows = plan_windows(frames, chunk, overlap, tail_step)
    assert windows[0].keep_start == 0 and windows[-1].keep_stop == frames
    for before, after in zip(windows, windows[1:], strict=False):
        assert before.keep_stop == after.keep_start  # cores abut: every frame exactly once
    for w in windows[:-1]:
        assert w.stop - w.start == chunk  # equal lengths batch together
    tail = windows[-1].stop - windows[-1].start
    if tail_step == 0 or len(windows) == 1:
        assert tail == min(chunk, frames)
    else:  # a multiple of the step, or the full chunk
        assert tail == chunk or tail % tail_step == 0
    for w in windows:
        assert 0 <= w.start <= w.keep_start < w.keep_stop <= w.stop <= frames
        # >= overlap frames of real context inside the window, unless at the song's edge
        assert w.keep_start - w.start >= overlap or w.start == 0
        assert w.stop - w.keep_stop >= overlap or w.stop == frames


def test_short_tail_window_saves_the_reencoded_frames() -> None:
    """240 s (6000 frames) in 1536-frame windows: a full-chunk tail re-encodes 1680 frames, a
    tail cut to its core + left context (rounded to 64) only 400."""
    full = plan_windows(6000, 1536, 48)
    short = plan_windows(6000, 1536, 48, tail_step=64)
    assert sum(w.stop - w.start for w in full) == 7680
    assert sum(w.stop - w.start for w in short) == 6400
    assert short[-1] == Window(5744, 6000, 5808, 6000)


def test_window_plan_refuses_overlap_eating_the_chunk() -> None:
    with pytest.raises(ValueError, match="twice the overlap"):
        plan_windows(100, 64, 32)


def narrow_vae() -> AutoencoderOobleck:
    torch.manual_seed(0)
    vae = AutoencoderOobleck(
        encoder_hidden_size=8,
        downsampling_ratios=[2, 4, 4, 6, 10],  # 1920 samples per frame, as the real one
        channel_multiples=[1, 1, 1, 1, 1],
        decoder_channels=8,
        decoder_input_channels=4,
    )
    return vae.eval()


def test_tiled_encode_equals_untiled_and_decode_length() -> None:
    vae = narrow_vae()
    frames = 20
    generator = torch.Generator().manual_seed(0)
    audio = 0.3 * torch.randn(2, frames * HOP_SAMPLES + 700, generator=generator)  # 700 dropped
    assert len(plan_windows(frames, 16, 6)) == 2
    ((tiled_mean, tiled_std),) = encode_moments(vae, [audio], chunk=16, overlap=6)
    ((mean, std),) = encode_moments(vae, [audio], chunk=10_000, overlap=0)
    assert mean.shape == (frames, 4)
    # Bound: float rounding only (overlap 6 covers the receptive field). Both sides run here,
    # convs over other lengths summing in another order: ~37 convs of <= 160-term sums on
    # moments of size <= 1 give a few 1e-6 of round-off, so 2e-5; a window even one frame
    # short of the encoder's reach is off by orders of magnitude more ...
    torch.testing.assert_close(tiled_mean, mean, atol=2e-5, rtol=0)
    torch.testing.assert_close(tiled_std, std, atol=2e-5, rtol=0)
    # ... also with a short tail window (26 frames: a 14-frame tail instead of the full 16)
    longer = 0.3 * torch.randn(2, 26 * HOP_SAMPLES, generator=generator)
    assert plan_windows(26, 16, 6, tail_step=2)[-1] == Window(12, 26, 18, 26)
    ((tail_mean, _),) = encode_moments(vae, [longer], chunk=16, overlap=6, tail_step=2)
    ((whole_mean, _),) = encode_moments(vae, [longer], chunk=10_000, overlap=0)
    torch.testing.assert_close(tail_mean, whole_mean, atol=2e-5, rtol=0)
    # ... and the check has teeth: an overlap of 2 frames does not.
    ((short_mean, _),) = encode_moments(vae, [audio], chunk=16, overlap=2)
    assert (short_mean - mean).abs().max() > 100 * 2e-5
    audio_out = decode_latents(vae, mean, chunk=18, overlap=8)  # decoder reach: ~7 frames
    assert audio_out.shape == (2, frames * HOP_SAMPLES)
    whole = decode_latents(vae, mean, chunk=64, overlap=0)
    # The same float32 round-off on audio of size ~0.2 is ~1e-6, so 5e-6: tight enough that a
    # decode window a frame or two short of the decoder's reach fails too.
    torch.testing.assert_close(audio_out, whole, atol=5e-6, rtol=0)


def test_fast_encode_equals_the_plain_encode() -> None:
    """`encode_moments` through the fast path (forced on the CPU, nhwc convs) matches the
    plain diffusers encoder; a FastOobleck of another VAE is refused."""
    from hotstep_ray.models.oobleck_fast import FastOobleck, OobleckFastOptions

    plain, fast_vae = narrow_vae(), narrow_vae()
    fast = FastOobleck(fast_vae, OobleckFastOptions(layout="nhwc"))
    generator = torch.Generator().manual_seed(2)
    audios = [0.3 * torch.randn(2, n * HOP_SAMPLES, generator=generator) for n in (20, 9)]
    want = encode_moments(plain, audios, chunk=16, overlap=6, batch_frames=32)
    got = encode_moments(fast_vae, audios, chunk=16, overlap=6, batch_frames=32, fast=fast)
    for (mean, std), (fast_mean, fast_std) in zip(want, got, strict=True):
        # float32 round-off of nhwc vs ncw convs: the tiled-encode bound above
        torch.testing.assert_close(fast_mean, mean, atol=2e-5, rtol=0)
        torch.testing.assert_close(fast_std, std, atol=2e-5, rtol=0)
    with pytest.raises(ValueError, match="another VAE"):
        encode_moments(plain, audios, chunk=16, overlap=6, fast=fast)


def test_staged_uploads_send_each_song_once_just_before_it_is_needed(monkeypatch) -> None:
    """`SongUploads(staged=True)` on CUDA, with the CUDA calls replaced by recorders (no GPU
    here): nothing crosses up front, a song crosses on its first `get` only, converted to the VAE
    dtype, on the side stream, and the compute stream waits for it before using it. Off CUDA
    the flag changes nothing."""
    from hotstep_ray.preprocess import vae_tiles

    log: list[tuple] = []

    class FakeStream:
        def __init__(self, *_device: object, name: str = "side") -> None:
            self.name = name

        def wait_stream(self, other: FakeStream) -> None:
            log.append(("wait", self.name, other.name))

    main = FakeStream(name="main")
    current = [main]

    class OnStream:
        def __init__(self, stream: FakeStream) -> None:
            self.stream = stream

        def __enter__(self) -> None:
            current.append(self.stream)

        def __exit__(self, *_: object) -> None:
            current.pop()

    real_empty, real_copy = torch.empty, torch.Tensor.copy_

    def empty(*shape, device=None, pin_memory=False, **kwargs):  # CPU stand-ins
        return real_empty(*shape, **kwargs)

    def copy_(self, src, non_blocking=False):
        log.append(("copy", current[-1].name, src.dtype, self.dtype))
        return real_copy(self, src)

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: main)
    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "stream", OnStream)
    monkeypatch.setattr(torch, "empty", empty)
    monkeypatch.setattr(torch.Tensor, "copy_", copy_)
    monkeypatch.setattr(
        torch.Tensor, "record_stream", lambda self, s: log.append(("record", s.name))
    )
    generator = torch.Generator().manual_seed(4)
    audios = [torch.randn(2, 50, generator=generator) for _ in range(3)]
    uploads = vae_tiles.SongUploads(audios, torch.device("cuda"), torch.bfloat16, staged=True)
    assert log == [("wait", "side", "main")]  # the side stream starts after queued work
    log.clear()
    song = uploads.get(1)
    assert torch.equal(song, audios[1].to(torch.bfloat16))
    assert log == [
        ("copy", "main", torch.float32, torch.bfloat16),  # the CPU conversion, pinned buffer
        ("copy", "side", torch.bfloat16, torch.bfloat16),  # the host -> device copy
        ("record", "side"),
        ("wait", "main", "side"),  # the compute stream waits before it reads the song
    ]
    log.clear()
    assert uploads.get(1) is song and log == []  # sent once
    assert torch.equal(uploads.get(0), audios[0].to(torch.bfloat16)) and len(log) == 4
    monkeypatch.undo()
    plain = vae_tiles.SongUploads(audios, torch.device("cpu"), torch.float32, staged=True)
    assert not plain.staged and plain.get(2) is not None and torch.equal(plain.get(2), audios[2])
