"""Codes -> audio: length, determinism, tiling, validation."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf
import torch

from hotstep_ray.audition.codes import codes_sha1, parse_codes, validate_codes
from hotstep_ray.audition.decode import TiledVaeDecoder
from hotstep_ray.audition.errors import TooLargeError, http_status
from hotstep_ray.core.errors import InputError

# Tiled, fast and whole decodes by the tiny VAE are one float32 function summed in other orders
# (conv lengths, folded weight norm, nhwc, another CPU's SIMD width). Its decoder (~37 convs:
# K = 64 x 7 in, then 8-channel convs of K <= 160) accumulates a random-walk round-off of
# u sqrt(Σ_l K_l / 2) ~ 2e-6 of its activations (u = eps_f32 / 2); the fast path also rounds each
# folded weight (u). Two such paths at the worst of ~3e5 samples: a few 1e-6 of the peak |audio|,
# under 1e-5, while a misplaced tile or a wrong fast-path fold misses by O(|audio|).
VAE_ROUNDOFF = 1e-5


def test_decode_is_a_48k_stereo_wav_of_codes_times_0_2_s(decoder):
    codes = [0, 17, 63999, 512, 40321, 7, 7]
    result = decoder.decode(codes)
    audio, rate = sf.read(io.BytesIO(result.audio), dtype="float32")
    assert rate == 48_000 and audio.shape == (len(codes) * 9600, 2)
    assert result.duration_s == pytest.approx(len(codes) * 0.2)  # sample count / rate: exact-ish
    assert result.codes_sha1 == codes_sha1(codes)
    tokens = "".join(f"<|audio_code_{c}|>" for c in codes)
    assert decoder.decode(tokens).audio == result.audio  # same codes, same bytes
    assert decoder.decode(",".join(map(str, codes))).audio == result.audio
    flac, rate = sf.read(io.BytesIO(decoder.decode(codes, "flac").audio))
    assert rate == 48_000 and flac.shape == audio.shape


def test_tiled_decode_equals_the_whole_decode(decoder):
    vae = decoder.vae.vae
    latents = torch.randn(1, 230, 64, generator=torch.Generator().manual_seed(0))
    whole = TiledVaeDecoder(vae, whole_max_frames=1000).decode(latents)
    tiled = TiledVaeDecoder(vae, tile_frames=64, overlap_frames=16, whole_max_frames=32)
    assert tiled.plan(230).tiles == 4
    scale = float(whole.abs().max())
    np.testing.assert_allclose(
        tiled.decode(latents).numpy(), whole.numpy(), rtol=0, atol=VAE_ROUNDOFF * scale
    )


def _whole_decode(tiny_tree, frames: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random latents [1, frames, 64] and their plain whole decode (the reference)."""
    from hotstep_ray.models.text_models import load_vae

    reference = load_vae(tiny_tree / "vae", device="cpu", dtype=torch.float32)
    latents = torch.randn(1, frames, 64, generator=torch.Generator().manual_seed(seed))
    return latents, TiledVaeDecoder(reference, whole_max_frames=1000, fast=False).decode(latents)


def test_fast_tiled_decode_equals_the_whole_reference_decode(tiny_tree):
    """The fast path (forced on the CPU: folded weight norm, precomputed Snake, nhwc convs,
    windows of exactly `tile_frames`) reproduces the plain whole decode."""
    from hotstep_ray.models.oobleck_fast import OobleckFastOptions
    from hotstep_ray.models.text_models import load_vae

    latents, whole = _whole_decode(tiny_tree, frames=150, seed=1)
    options = OobleckFastOptions(layout="nhwc")
    fast = TiledVaeDecoder(
        load_vae(tiny_tree / "vae", device="cpu", dtype=torch.float32),
        tile_frames=64,
        overlap_frames=16,
        tile_batch=2,
        whole_max_frames=32,
        fast=True,
        fast_options=options,
    )
    assert fast.describe()["fast"] and fast.describe()["layout"] == "nhwc"
    assert fast.plan(150).tiles == 4 and fast.plan(150).window_frames == 64
    audio = fast.decode(latents)
    assert audio.shape == whole.shape == (1, 2, 150 * 1920) and audio.dtype == torch.float32
    scale = whole.abs().max()
    assert float((audio - whole).abs().max() / scale) < VAE_ROUNDOFF
    with pytest.raises(ValueError, match="2 x overlap"):
        TiledVaeDecoder(fast.vae, tile_frames=64, overlap_frames=32, fast=False)


@pytest.mark.parametrize(
    ("codes", "error", "message"),
    [
        ([64000], InputError, "64000 at position 0 is outside"),
        ([3, -1], InputError, "-1 at position 1 is outside"),
        ([], InputError, "empty"),
        ([1] * 3001, TooLargeError, "600 s"),
        ("<|audio_code_5|>oops", InputError, "'oops'"),
        ("1, 2, x3", InputError, "'x3' is not an integer"),
        ([1, True], InputError, "is not an integer"),
    ],
)
def test_bad_codes_name_the_problem(decoder, codes, error, message):
    with pytest.raises(error, match=message):
        decoder.decode(codes)


def test_parse_and_status_mapping():
    assert parse_codes("<|audio_code_1|> <|audio_code_22|>") == [1, 22]
    assert parse_codes("4 5,6") == [4, 5, 6]
    validate_codes([0, 63999])
    assert http_status(TooLargeError("x")) == 413 and http_status(InputError("x")) == 400


def test_decode_cli_writes_the_wav(tiny_tree, tmp_path):
    from typer.testing import CliRunner

    from hotstep_ray.cli import audition_cmd

    codes = tmp_path / "codes.txt"
    codes.write_text("<|audio_code_3|><|audio_code_9|><|audio_code_27|>\n")
    out = tmp_path / "x.wav"
    args = ["decode", str(codes), "--checkpoints", str(tiny_tree), "--out", str(out)]
    result = CliRunner().invoke(audition_cmd.app, [*args, "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert sf.info(str(out)).frames == 3 * 9600
    bad = tmp_path / "bad.txt"
    bad.write_text("64000")
    failed = CliRunner().invoke(
        audition_cmd.app, ["decode", str(bad), "--checkpoints", str(tiny_tree)]
    )
    assert failed.exit_code == 2 and "outside the codebook" in failed.output


def test_pcm16_wav_is_a_standard_16_bit_wav():
    import io
    import wave

    from hotstep_ray.audition.decode import pcm16_wav

    audio = torch.tensor([[0.0, 0.5, -1.5, 1.0], [0.25, -0.25, 2.0, -1.0]])  # [C, T], clipped
    data = pcm16_wav(audio, sample_rate_hz=48000)
    with wave.open(io.BytesIO(data)) as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (2, 2, 48000)
        frames = np.frombuffer(wav.readframes(4), dtype="<i2").reshape(4, 2)
    want = np.array([[0, 8192], [16384, -8192], [-32767, 32767], [32767, -32767]])
    assert np.array_equal(frames, want) and len(data) == 44 + 4 * 2 * 2


def test_the_fast_paths_last_window_holds_only_the_tail(tiny_tree):
    """The last window is its core plus `overlap` of left context, rounded up to `tail_step`
    (not a whole tile); windows of one length decode together; the result still equals the
    whole decode. At the defaults a 240 s song decodes 6272 frames for its 6000, not 6912."""
    from hotstep_ray.models.text_models import load_vae

    latents, whole = _whole_decode(tiny_tree, frames=250, seed=2)
    fast = TiledVaeDecoder(
        load_vae(tiny_tree / "vae", device="cpu", dtype=torch.float32),
        tile_frames=128,
        overlap_frames=16,
        tile_batch=2,
        tail_step=32,
        fast=True,
    )
    shapes = []
    run = fast._decode
    fast._decode = lambda z: shapes.append(tuple(z.shape)) or run(z)
    audio = fast.decode(latents)
    # [0,128) [96,224) together, then the 58 new frames + 16 of context -> 64
    assert shapes == [(2, 64, 128), (1, 64, 64)]
    assert float((audio - whole).abs().max() / whole.abs().max()) < VAE_ROUNDOFF
    default = TiledVaeDecoder(load_vae(tiny_tree / "vae", device="cpu"), fast=True)
    windows = default._windows(6000)
    assert len(windows) == 9 == default.plan(6000).tiles
    assert sum(w.stop - w.start for w in windows) == 8 * 768 + 128
