"""`hotstep_ray.models.fsq_fast`: a reduced-precision pass 1 plus a float32 recheck of the windows
near an FSQ floor boundary gives exactly the float32 tokenizer's 5 Hz codes. CPU only, so pass 1
is bf16 autocast (TF32 needs CUDA); the tiny tokenizers are 64 wide, 1 pooler layer."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from diffusers.pipelines.ace_step import AceStepAudioTokenizer

from hotstep_ray.core.contracts import PreprocessOptions
from hotstep_ray.models import fsq_fast
from hotstep_ray.models.acestep_wrappers import tokenize_latents
from hotstep_ray.models.fsq_fast import (
    boundary_margin,
    fast_codes,
    reduced_precision,
    resolve_fast_pass,
    window_brackets,
)
from hotstep_ray.preprocess.encode import Encoder, apply_memory_cap, memory_cap_fraction
from hotstep_ray.preprocess.items import EncoderSettings
from hotstep_ray.preprocess.model_paths import resolve_models

# Level units. bf16 keeps 8 significant bits (2^-9 relative rounding); brackets reach ~8 level
# units, so one rounding is ~0.015 and the projection + 1 pooler layer stack a few of them: the
# worst window of a batch lands near 0.1 at most. 0.2 covers that (asserted below), on any CPU's
# bf16 kernels, while staying a small fraction of the 1-unit spacing of FSQ floors.
MARGIN = 0.2


def tiny_tokenizer(num_quantizers: int = 1, seed: int = 0) -> AceStepAudioTokenizer:
    """A random 64-wide tokenizer (diffusers' default init, seeded without touching the global
    generator)."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AceStepAudioTokenizer(
            hidden_size=64,
            intermediate_size=128,
            fsq_dim=64,
            fsq_input_num_quantizers=num_quantizers,
            num_attention_pooler_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            sliding_window=8,
        )
    return model.eval().requires_grad_(False)


@pytest.fixture(scope="module")
def tokenizer() -> AceStepAudioTokenizer:
    return tiny_tokenizer()


def latents(rows: int, frames: int, seed: int = 3) -> torch.Tensor:
    """[rows, frames, 64] N(0, 1) latents (the scale of VAE posterior samples)."""
    return torch.randn(rows, frames, 64, generator=torch.Generator().manual_seed(seed))


SILENCE = latents(1, 20, seed=99)  # [1, 20, 64]: distinct from zeros, so padding is visible


def fp32_codes(tokenizer, x: torch.Tensor) -> torch.Tensor:
    return tokenize_latents(tokenizer, x, SILENCE).indices


def test_bf16_pass_alone_changes_some_codes(tokenizer):
    """The premise: without the recheck, bf16 flips codes (so pass 2 is needed)."""
    x = latents(3, 400)
    found = fast_codes(tokenizer, x, SILENCE, "bf16", margin=0.0)
    assert found.rechecked == 0 and found.windows == 3 * 80
    assert int((found.indices != fp32_codes(tokenizer, x)).sum()) > 0


def test_recheck_gives_the_fp32_codes_without_recomputing_everything(tokenizer):
    x = latents(3, 400)
    fast = window_brackets(tokenizer, x, SILENCE, "bf16")  # [3, 80, 6]
    exact = window_brackets(tokenizer, x, SILENCE, "off")
    assert (
        0 < float((fast - exact).abs().max()) < MARGIN
    )  # the band covers pass 1's error, with room
    found = fast_codes(tokenizer, x, SILENCE, "bf16", margin=MARGIN)
    reference = fp32_codes(tokenizer, x)
    assert found.indices.dtype == reference.dtype == torch.int32
    assert found.indices.shape == reference.shape == (3, 80, 1)
    assert torch.equal(found.indices, reference)
    assert 0 < found.rechecked < found.windows == 240


@pytest.mark.parametrize("frames", [7, 13, 203, 4])
def test_odd_lengths_and_several_rows_match_fp32(tokenizer, frames):
    """T not a multiple of 5: the last window is completed with silence frames, as in
    `tokenize_latents` (zeros instead would give other codes there)."""
    x = latents(4, frames, seed=frames)
    found = fast_codes(tokenizer, x, SILENCE, "bf16", margin=MARGIN)
    windows = -(-frames // 5)
    assert found.windows == 4 * windows
    assert 0 <= found.rechecked <= found.windows
    assert torch.equal(found.indices, fp32_codes(tokenizer, x))


@pytest.mark.parametrize("chunk", [0, 7])  # one recheck call, or chunks of 7 windows
def test_several_calls_share_one_recheck(tokenizer, chunk):
    """`fast_codes_many`: calls of different shapes, pass 1 each, one gathered recheck (in
    chunks or not): every call's codes are the float32 ones and its own recheck count is the
    one `fast_codes` finds for it alone."""
    groups = [latents(2, 203, seed=5), latents(3, 60, seed=6), latents(1, 12, seed=7)]
    found = fsq_fast.fast_codes_many(
        tokenizer, groups, SILENCE, "bf16", margin=MARGIN, recheck_windows=chunk
    )
    assert [f.windows for f in found] == [2 * 41, 3 * 12, 1 * 3]
    for x, many in zip(groups, found, strict=True):
        alone = fast_codes(tokenizer, x, SILENCE, "bf16", margin=MARGIN)
        assert many.indices.dtype == torch.int32 and many.indices.shape == alone.indices.shape
        assert torch.equal(many.indices, fp32_codes(tokenizer, x))
        assert many.rechecked == alone.rechecked
    assert sum(f.rechecked for f in found) > 7  # the chunked case did take several chunks


def test_brackets_see_the_silence_padding(tokenizer):
    """The padded window's brackets follow `silence_latent`, not zeros."""
    x = latents(1, 7)
    with_silence = window_brackets(tokenizer, x, SILENCE, "off")
    with_zeros = window_brackets(tokenizer, x, torch.zeros_like(SILENCE), "off")
    assert torch.equal(with_silence[:, 0], with_zeros[:, 0])  # full window: no padding
    assert not torch.equal(with_silence[:, 1], with_zeros[:, 1])  # 2 frames + 3 padding


def test_off_is_the_plain_fp32_path(tokenizer):
    x = latents(2, 36)
    found = fast_codes(tokenizer, x, SILENCE, "off", margin=MARGIN)
    assert (found.windows, found.rechecked) == (2 * 8, 0)
    assert torch.equal(found.indices, fp32_codes(tokenizer, x))


def test_residual_quantizers_skip_the_fast_pass():
    """num_quantizers != 1: a margin on the first level bounds nothing, all float32."""
    model = tiny_tokenizer(num_quantizers=2, seed=1)
    x = latents(2, 50)
    found = fast_codes(model, x, SILENCE, "bf16", margin=0.0)
    assert found.rechecked == found.windows == 20
    assert torch.equal(found.indices, fp32_codes(model, x))


def test_boundary_margin_is_the_distance_to_the_nearest_integer():
    brackets = torch.tensor([[0.5, 3.98, 2.3], [7.5, 1.5, 4.5]])  # [2 windows, 3 dims]
    # 3.98 is not a float32 number: 4 - float32(3.98) is 0.02 to ~1 ulp of 4 (2.4e-7); 1e-6 is
    # a few of those, and picking the wrong dim or boundary is off by >= 0.28
    assert torch.allclose(boundary_margin(brackets), torch.tensor([0.02, 0.5]), atol=1e-6)


def test_nan_windows_are_rechecked(tokenizer, monkeypatch):
    """A NaN margin fails `margin >= band`, so the window goes to float32."""
    real = fsq_fast.boundary_margin
    monkeypatch.setattr(
        fsq_fast, "boundary_margin", lambda b: real(b).index_fill(-1, torch.tensor([0]), torch.nan)
    )
    found = fast_codes(tokenizer, latents(2, 50), SILENCE, "bf16", margin=0.0)
    assert found.rechecked == 2  # window 0 of each row


def test_tf32_context_sets_and_restores_the_precision_even_on_errors():
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    with pytest.raises(RuntimeError, match="inside"):
        with reduced_precision("tf32", torch.device("cpu")):
            assert matmul.fp32_precision == "tf32"
            raise RuntimeError("inside")
    assert matmul.fp32_precision == before
    with pytest.raises(ValueError, match="tf32 or bf16"):
        with reduced_precision("fp16", torch.device("cpu")):
            pass


def test_resolve_fast_pass():
    assert resolve_fast_pass("auto", torch.device("cpu")) == "off"
    assert resolve_fast_pass("auto", torch.device("cuda", 0)) == "tf32"
    assert resolve_fast_pass("bf16", torch.device("cpu")) == "bf16"
    with pytest.raises(ValueError, match="needs a CUDA device"):
        resolve_fast_pass("tf32", torch.device("cpu"))
    with pytest.raises(ValueError, match="fp16"):
        resolve_fast_pass("fp16", torch.device("cpu"))


# --------------------------------------------------------------------------- settings


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("codes_fast_pass", "fp16", "codes_fast_pass must be one of"),
        ("codes_recheck_margin", -0.01, "codes_recheck_margin must be"),
        ("codes_recheck_margin", float("nan"), "codes_recheck_margin must be"),
        ("codes_frames_per_call", 0, "codes_frames_per_call must be >= 1"),
        ("memory_cap_gib", -1.0, "memory_cap_gib must be"),
        ("memory_cap_gib", float("inf"), "memory_cap_gib must be"),
    ],
)
def test_settings_refuse_bad_values(field, value, message):
    with pytest.raises(ValueError, match=message):
        EncoderSettings(**{field: value})


def test_settings_defaults():
    settings = EncoderSettings()
    assert settings.codes_fast_pass == "auto"
    assert settings.codes_recheck_margin == 0.02
    assert settings.codes_frames_per_call == 6000
    assert settings.memory_cap_gib == 0.0


def test_memory_cap_fraction():
    total = 16 * 2**30
    assert memory_cap_fraction(0, total) is None
    assert memory_cap_fraction(4, total) == 0.25
    assert memory_cap_fraction(16, total) == 1.0
    with pytest.raises(ValueError, match="exceeds the device's 16.0 GiB"):
        memory_cap_fraction(16.5, total)
    with pytest.raises(ValueError, match=">= 0"):
        memory_cap_fraction(-1, total)


class _Props:
    total_memory = 8 * 2**30


def test_memory_cap_is_set_on_cuda_only(monkeypatch):
    calls: list[tuple[float, torch.device]] = []
    monkeypatch.setattr(
        torch.cuda, "set_per_process_memory_fraction", lambda f, d=None: calls.append((f, d))
    )
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: _Props())
    assert apply_memory_cap(2.0, torch.device("cpu")) is None
    assert apply_memory_cap(0.0, torch.device("cuda", 0)) is None
    assert calls == []
    assert apply_memory_cap(2.0, torch.device("cuda", 1)) == 0.25
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert apply_memory_cap(2.0, torch.device("cuda")) == 0.25  # a bare "cuda": the current one
    assert calls == [(0.25, 1), (0.25, 0)]  # torch wants an index


# --------------------------------------------------------------------------- Encoder.codes


@pytest.fixture(scope="module")
def encoder(tiny_ckpt) -> Encoder:
    settings = EncoderSettings(codes_recheck_margin=MARGIN)
    return Encoder.load(resolve_models(tiny_ckpt, PreprocessOptions()), settings, "cpu")


def variant(encoder: Encoder, **changes) -> Encoder:
    """The same models under changed settings."""
    parts = (encoder.vae, encoder.text_encoder, encoder.tokenizer, encoder.dit)
    return Encoder(*parts, replace(encoder.settings, **changes), encoder.device, encoder.dtype)


def test_encoder_codes_bf16_equal_off(encoder):
    """Songs of two lengths (two groups; the 203-frame pair split across calls by a small
    `codes_frames_per_call`): the bf16 fast pass gives the "off" codes, and its counts add up."""
    encoder = variant(encoder, codes_frames_per_call=250)  # the variants below keep it
    songs = [latents(1, frames, seed=i)[0] for i, frames in enumerate((203, 203, 96))]
    assert encoder.codes_fast_pass == "off"  # "auto" on the CPU
    plain = encoder.codes(songs)
    assert encoder.last_codes_stats == {"fast_pass": "off", "windows": 41 + 41 + 20, "rechecked": 0}
    fast = variant(encoder, codes_fast_pass="bf16")
    found = fast.codes(songs)
    stats = fast.last_codes_stats
    assert (stats["fast_pass"], stats["windows"]) == ("bf16", 102)
    assert 0 < stats["rechecked"] < 102
    assert [c.dtype for c in found] == [torch.int64] * 3
    assert [c.shape[0] for c in found] == [41, 41, 20]
    assert all(torch.equal(a, b) for a, b in zip(found, plain, strict=True))
    unchecked = variant(encoder, codes_fast_pass="bf16", codes_recheck_margin=0.0).codes(songs)
    assert any(not torch.equal(a, b) for a, b in zip(unchecked, plain, strict=True))
    # The per-call override (the bench's float32 reference) leaves the settings alone.
    reference = fast.codes(songs, fast_pass="off")
    assert all(torch.equal(a, b) for a, b in zip(reference, plain, strict=True))
    assert fast.last_codes_stats["fast_pass"] == "off" and fast.codes_fast_pass == "bf16"


def test_encoder_refuses_tf32_off_cuda(encoder):
    with pytest.raises(ValueError, match="needs a CUDA device"):
        variant(encoder, codes_fast_pass="tf32")
