"""The fast Oobleck path equals the diffusers modules it wraps (CPU, tiny VAE, float32)."""

from __future__ import annotations

import pytest
import torch

from hotstep_ray.models.oobleck_fast import (
    FastOobleck,
    FastResidualUnit,
    FastSnake1d,
    OobleckFastOptions,
    ShapeGraphs,
    convs_to_2d,
    fold_weight_norm,
    resolve_snake,
    swap_snakes,
    weight_norm_folded,
    weight_norm_left,
)
from hotstep_ray.models.oobleck_kernels import residual_triton_fits, snake_layout

# Bounds on max |fast - reference| / max |reference| (float32, both sides in this process, same
# weights, other conv algorithms: 2-D / nhwc kernels, fused GEMMs, and oneDNN's blocking for
# this CPU's SIMD width all change the summation order).
# A whole encoder or decoder: ~37 convs deep, sums of up to ~2,500 products (128 channels x
# kernels up to 20); random-walk round-off of such a stack is ~sqrt(n * depth) * 6e-8, about
# 1e-5 of the output scale, so 5e-5. The perturbations that show the checks' teeth land >= 1e-4.
STACK_RTOL = 5e-5
# One residual unit (16 channels, kernel 7, then a 1x1 conv): ~sqrt(112) * 6e-8 < 1e-6, so 1e-5.
UNIT_RTOL = 1e-5


@pytest.fixture(scope="module")
def vae_folder(tmp_path_factory):
    from hotstep_ray.models.tiny_tree import write_tiny_vae

    return write_tiny_vae(tmp_path_factory.mktemp("vae"))


@pytest.fixture
def fresh_vae(vae_folder):
    """A new tiny VAE per call (weight-norm modules cannot be deep-copied)."""
    return lambda: _load(vae_folder)


@pytest.fixture(scope="module")
def tiny_vae(vae_folder):
    return _load(vae_folder)


def _load(folder):
    from hotstep_ray.models.text_models import load_vae

    vae = load_vae(folder, device="cpu", dtype=torch.float32)
    # Non-trivial Snake parameters (the tiny tree may draw them near zero): the swap must
    # carry exp(alpha) and 1 / (exp(beta) + 1e-9) exactly.
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in vae.named_parameters():
            if name.endswith((".alpha", ".beta")):
                param.copy_(0.5 * torch.randn(param.shape, generator=generator))
    return vae.eval()


def _latents(frames: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(1, 64, frames, generator=torch.Generator().manual_seed(seed))


def test_weight_norm_folding_is_exact(fresh_vae):
    vae = fresh_vae()
    z = _latents(6)
    with torch.no_grad():
        want = vae.decoder(z)
        assert fold_weight_norm(vae) > 50  # every conv of encoder and decoder
        assert fold_weight_norm(vae) == 0  # idempotent
        got = vae.decoder(z)
    assert not any("weight_g" in name for name, _ in vae.named_parameters())
    # exact: the fold stores what the hook computed (same torch._weight_norm, this process)
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_new_style_weight_norm_parametrization_folds():
    from torch.nn.utils.parametrizations import weight_norm

    conv = weight_norm(torch.nn.Conv1d(3, 4, 5))
    x = torch.randn(2, 3, 20)
    with torch.no_grad():
        want = conv(x)
        assert fold_weight_norm(conv) == 1
        # the folded weight is the parametrization's own output, so exact in practice; 1e-6 is
        # a few float32 ulps of these O(1) outputs, far below an unfolded or lost weight
        torch.testing.assert_close(conv(x), want, atol=1e-6, rtol=0)
    assert not hasattr(conv, "parametrizations")


def test_fast_snake_is_bit_identical_to_diffusers_in_float32(tiny_vae):
    reference = tiny_vae.decoder.block[0].snake1
    fast = FastSnake1d(reference, "torch")
    x = 4 * torch.randn(2, reference.alpha.shape[1], 33)
    with torch.no_grad():
        # exact: the same elementwise ops on the same values in this process (exp and the
        # reciprocal only moved to build time)
        torch.testing.assert_close(fast(x), reference(x), atol=0, rtol=0)
        # [B, C, 1, T] (the nhwc layout) broadcasts the same parameters
        four_d = fast(x.unsqueeze(2).contiguous(memory_format=torch.channels_last))
    torch.testing.assert_close(four_d.squeeze(2), reference(x), atol=0, rtol=0)
    with pytest.raises(ValueError, match="snake impl"):
        FastSnake1d(reference, "cuda-magic")


@pytest.mark.parametrize("layout", ["ncw", "nhwc"])
def test_fast_decode_and_encode_equal_the_reference(tiny_vae, fresh_vae, layout):
    reference = tiny_vae
    fast = FastOobleck(fresh_vae(), OobleckFastOptions(layout=layout))
    assert fast.describe()["layout"] == layout
    assert fast.snake_impl == "torch" and not fast.uses_graphs  # CPU: gated off
    z = _latents(7)
    audio = 0.3 * torch.randn(2, 2, 5 * 1920, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want_audio = reference.decoder(z)
        want_moments = reference.encoder(audio)
        # float32 rounding only (2-D convs sum in another order): STACK_RTOL
        assert _relative_error(fast.decode(z), want_audio) < STACK_RTOL
        assert _relative_error(fast.encode(audio), want_moments) < STACK_RTOL
        # the VAE's own API keeps working after the in-place preparation
        assert _relative_error(fast.vae.decode(z).sample, want_audio) < STACK_RTOL
        assert fast.decode(z).shape == (1, 2, 7 * 1920)
        # preparing an already prepared VAE again is harmless (no double wrapping)
        again = FastOobleck(fast.vae, OobleckFastOptions(layout=layout))
        assert _relative_error(again.decode(z), want_audio) < STACK_RTOL
        # and the check has teeth: a perturbed Snake parameter is caught
        if layout == "ncw":
            fast.vae.decoder.block[0].snake1.inv_beta.mul_(1.01)
            assert _relative_error(fast.decode(z), want_audio) > 1e-4


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max())


def test_device_gating_and_option_validation():
    cpu = torch.device("cpu")
    assert resolve_snake("auto", cpu) == "torch"
    assert resolve_snake("triton", cpu) == "torch"  # no Triton off CUDA
    with pytest.raises(ValueError, match="snake impl"):
        resolve_snake("fast", cpu)
    with pytest.raises(ValueError):
        OobleckFastOptions(layout="nchw")
    with pytest.raises(ValueError):
        OobleckFastOptions(tile_frames=1)  # unknown fields are refused


def test_snake_kernel_layout_reads_channels_from_memory_order():
    x = torch.zeros(2, 5, 1, 7)
    assert snake_layout(x) == (5, 7)  # NCW: channel = (i // T) % C
    assert snake_layout(x.contiguous(memory_format=torch.channels_last)) == (5, 1)
    assert snake_layout(x[:, :, 0]) == (5, 7)
    assert snake_layout(torch.zeros(2, 7, 5).transpose(1, 2)) is None  # strided: made dense


def test_shape_graphs_capture_policy_without_a_gpu(monkeypatch):
    """The capture bookkeeping (CPU stand-in for the CUDA graph): shapes are captured on their
    n-th call, at most `max_graphs` of them, a failed capture runs eagerly from then on."""
    calls: list[tuple] = []
    captured: list[tuple] = []

    def fn(x):
        calls.append(tuple(x.shape))
        return x * 2

    graphs = ShapeGraphs(fn, max_graphs=2, capture_after=2)

    def fake_capture(key, x):
        if key[0] == (3,):
            raise RuntimeError("capture not supported")
        captured.append(key[0])
        graphs.graphs[key] = (_Replay(), x.clone(), x.clone() * 2)

    monkeypatch.setattr(graphs, "_capture", fake_capture)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    one = torch.ones(1)
    assert graphs(one).tolist() == [2.0] and captured == []  # first sight: eager
    assert graphs(one).tolist() == [2.0] and captured == [(1,)]  # second: captured + replayed
    graphs(torch.ones(2)), graphs(torch.ones(2))
    assert captured == [(1,), (2,)]
    graphs(torch.ones(3)), graphs(torch.ones(3))  # the cap: more shapes stay eager
    assert captured == [(1,), (2,)] and calls[-1] == (3,)
    assert graphs(one).tolist() == [2.0]  # replay returns a fresh tensor of the output


class _Replay:
    def replay(self) -> None:
        pass


# ----------------------------------------------------------------------------- residual units

RESIDUAL_UNITS = 30  # 5 blocks x 3 residual units, in the encoder and in the decoder
# conv biases moved into the Snake / unit after them: each unit's conv1 (30), the decoder's
# conv1 and 5 conv_t1, the encoder's conv1 and 5 block conv1 (12)
FOLDED_BIASES = RESIDUAL_UNITS + 12


def _count_reference_units(vae) -> int:
    return sum(type(m).__name__ == "OobleckResidualUnit" for m in vae.modules())


@pytest.mark.parametrize("fuse", [True, False])
def test_fused_residual_units_equal_the_reference(tiny_vae, fresh_vae, fuse):
    """nhwc + torch Snake on the CPU: the fused units (1x1 conv + bias + residual as one GEMM,
    conv biases moved into the next Snake / unit) give the diffusers encode and decode."""
    assert _count_reference_units(tiny_vae) == RESIDUAL_UNITS
    fast = FastOobleck(fresh_vae(), OobleckFastOptions(snake="torch", fuse_residual=fuse))
    info = fast.describe()
    assert info["layout"] == "nhwc"
    assert info["residuals_fused"] == (RESIDUAL_UNITS if fuse else 0)
    assert info["conv_biases_folded"] == (FOLDED_BIASES if fuse else 0)
    assert info["residual_impl"] == ("torch" if fuse else None)  # CPU: no Triton kernel
    assert _count_reference_units(fast.vae) == (0 if fuse else RESIDUAL_UNITS)
    z = _latents(5, seed=4)
    audio = 0.3 * torch.randn(2, 2, 4 * 1920, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert _relative_error(fast.decode(z), tiny_vae.decoder(z)) < STACK_RTOL
        assert _relative_error(fast.encode(audio), tiny_vae.encoder(audio)) < STACK_RTOL
        if fuse:  # preparing again neither fuses twice nor moves a bias twice
            again = FastOobleck(fast.vae, OobleckFastOptions(snake="torch"))
            assert again.describe()["residuals_fused"] == RESIDUAL_UNITS
            assert again.describe()["conv_biases_folded"] == FOLDED_BIASES
            assert _relative_error(again.decode(z), tiny_vae.decoder(z)) < STACK_RTOL
            # the check has teeth: a wrong folded bias in one unit is caught
            fast.vae.decoder.inner.block[0].res_unit1.bias.add_(0.05)
            assert _relative_error(fast.decode(z), tiny_vae.decoder(z)) > 1e-4


def test_ncw_layout_leaves_residual_units_alone(fresh_vae):
    fast = FastOobleck(fresh_vae(), OobleckFastOptions(layout="ncw"))
    assert fast.describe()["residuals_fused"] == 0
    assert fast.describe()["conv_biases_folded"] == 0


def _prepared_unit(reference):
    """A copy of a diffusers OobleckResidualUnit run through the FastOobleck preparation."""
    from diffusers.models.autoencoders.autoencoder_oobleck import OobleckResidualUnit

    unit = OobleckResidualUnit(reference.conv1.in_channels, reference.conv1.dilation[0])
    unit.load_state_dict(reference.state_dict())
    unit.conv1.padding = reference.conv1.padding
    fold_weight_norm(unit)
    swap_snakes(unit, "torch")
    convs_to_2d(unit)
    return FastResidualUnit(unit, "triton")  # "triton" off CUDA: the torch path


@pytest.mark.parametrize("padding", [9, 0])  # 0: conv1 shortens T, the residual is cropped
def test_fast_residual_unit_equals_diffusers_unit(padding):
    from diffusers.models.autoencoders.autoencoder_oobleck import OobleckResidualUnit

    torch.manual_seed(0)
    reference = OobleckResidualUnit(16, dilation=3).eval()
    with torch.no_grad():
        for name, param in reference.named_parameters():
            if name.endswith((".alpha", ".beta", "bias")):
                param.copy_(0.5 * torch.randn(param.shape))
    reference.conv1.padding = (padding,)
    fast = _prepared_unit(reference)
    x = torch.randn(3, 16, 50)
    with torch.no_grad():
        want = reference(x)
        got = fast(x.unsqueeze(2).contiguous(memory_format=torch.channels_last))
        # a conv's bias moved in: unit(x + b) with the conv run bias-free
        shift = torch.randn(16)
        want_shifted = reference(x + shift.view(1, -1, 1))
        fast.add_input_shift(shift)
        got_shifted = fast(x.unsqueeze(2).contiguous(memory_format=torch.channels_last))
    assert want.shape[-1] == 50 - (18 - 2 * padding)  # the crop case really crops
    assert got.is_contiguous(memory_format=torch.channels_last)  # the next conv sees NHWC
    assert _relative_error(got.squeeze(2), want) < UNIT_RTOL
    assert _relative_error(got_shifted.squeeze(2), want_shifted) < UNIT_RTOL
    with pytest.raises(ValueError, match="nhwc"):
        fast(x)


def test_fast_residual_unit_needs_the_prepared_modules():
    from diffusers.models.autoencoders.autoencoder_oobleck import OobleckResidualUnit

    unit = OobleckResidualUnit(8, dilation=1)
    with pytest.raises(ValueError, match="swap_snakes"):
        FastResidualUnit(unit)
    fold_weight_norm(unit)
    swap_snakes(unit, "torch")
    with pytest.raises(ValueError, match="convs_to_2d"):
        FastResidualUnit(unit)


def test_triton_residual_kernel_is_gated_to_cuda_half_precision():
    x = torch.zeros(1, 128, 1, 10).contiguous(memory_format=torch.channels_last)
    assert not residual_triton_fits(x, x)  # CPU tensors run the torch path
    assert not residual_triton_fits(x.bfloat16(), x.bfloat16())


def test_weight_norm_count_survives_an_earlier_fold(fresh_vae):
    """diffusers (0.42) builds Oobleck with old-style weight-norm hooks; a caller that folds
    before FastOobleck (the preprocessing Encoder does) must not read as "0 folded"."""
    vae = fresh_vae()
    assert weight_norm_left(vae) > 50
    first = fold_weight_norm(vae)
    assert first > 50 and weight_norm_left(vae) == 0
    fast = FastOobleck(vae, OobleckFastOptions(layout="ncw"))
    assert fast.describe()["weight_norm_folded"] == first == weight_norm_folded(vae)
    assert fast.describe()["weight_norm_left"] == 0
