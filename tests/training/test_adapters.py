"""Adapter invariants on the toy transformer: LoRA and LoKR through one interface."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from hotstep_ray.core.contracts import TrainDitOptions, TrainLmOptions
from hotstep_ray.core.errors import InputError
from hotstep_ray.training import adapters
from hotstep_ray.training.adapters import AdapterSpec
from hotstep_ray.training.speed import KRON_MIXES, SpeedOptions

SPECS = {
    "lora": AdapterSpec(kind="lora", rank=4, alpha=8),
    # factor 4 on 64/128-wide layers: attention w1 [4,4] + full w2 [16,16] (alpha forced to 8),
    # MLP w2 low-rank [32,8]·[8,16] (alpha 4 kept): both LyCORIS cases at once.
    "lokr": AdapterSpec(kind="lokr", rank=8, alpha=4, factor=4),
}


# float32 kron_linear (two GEMM stages) against one GEMM over the materialised kron: each path
# rounds every output by a few ulp of max|out| per stage, whatever the reduction length K (error
# and max|out| both grow as sqrt(K)); 2e-6 ~ 34 x 2^-24 of max|out|. A formula error is O(1).
KRON_REL = 2e-6


@pytest.fixture(params=sorted(SPECS))
def spec(request: pytest.FixtureRequest) -> AdapterSpec:
    return SPECS[request.param]


def test_only_adapter_parameters_train(spec, make_toy, toy_inputs, randomize):
    model = adapters.inject(make_toy(0), spec)
    randomize(model)
    base_before = {
        n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad
    }
    trainable = adapters.trainable_parameters(model)
    assert trainable and all(".lora_" in n or ".lokr_" in n for n, _ in trainable)
    assert {id(p) for _, p in trainable} == {id(p) for p in model.parameters() if p.requires_grad}
    optimizer = torch.optim.SGD([p for _, p in trainable], lr=0.1)
    adapter_before = adapters.adapter_state_dict(model)
    model.train()
    model(*toy_inputs).square().mean().backward()
    optimizer.step()
    for name, param in model.named_parameters():
        if name in base_before:
            assert param.grad is None and torch.equal(param, base_before[name]), name
    after = adapters.adapter_state_dict(model)
    assert any(not torch.equal(after[k], adapter_before[k]) for k in after)


def test_untrained_adapter_is_exactly_the_base(spec, make_toy, toy_inputs):
    expected = make_toy(0)(*toy_inputs)
    model = adapters.inject(make_toy(0), spec)
    assert torch.equal(model(*toy_inputs), expected)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a − b| relative to max |b| (float32 rounding of O(10) outputs is ~1e-6 absolute)."""
    return ((a - b).abs().max() / b.abs().max()).item()


def test_kron_linear_matches_materialised_kron():
    generator = torch.Generator().manual_seed(0)
    w1 = torch.randn(5, 4, generator=generator)  # [a, c]
    w2 = torch.randn(7, 6, generator=generator)  # [b, d]
    x = torch.randn(3, 11, 4 * 6, generator=generator)
    reference = F.linear(x, torch.kron(w1, w2) * 0.5)
    assert _rel(adapters.kron_linear(x, w1, w2, 0.5), reference) <= KRON_REL
    w2_a, w2_b = torch.randn(7, 3, generator=generator), torch.randn(3, 6, generator=generator)
    reference = F.linear(x, torch.kron(w1, w2_a @ w2_b))
    assert _rel(adapters.kron_linear(x, w1, (w2_a, w2_b)), reference) <= KRON_REL


def test_kron_forward_and_grads_match_peft_materialised_path(make_toy, randomize):
    model = adapters.inject(make_toy(0), SPECS["lokr"])
    randomize(model)
    for path, layer in adapters.tuner_layers(model):
        x = torch.randn(2, 3, layer.in_features, requires_grad=True)
        fast = layer._get_delta_activations(adapters.ADAPTER_NAME, x)
        slow = F.linear(x, layer.get_delta_weight(adapters.ADAPTER_NAME))
        assert _rel(fast, slow) <= KRON_REL, path
        params = [p for p in layer.parameters() if p.requires_grad]
        grads_fast = torch.autograd.grad(fast.square().sum(), params)
        grads_slow = torch.autograd.grad(slow.square().sum(), params)
        for g_fast, g_slow in zip(grads_fast, grads_slow, strict=True):
            # float32: the factor gradients reduce <= 6 x 128 terms in two orders, a few ulp of
            # |g| each; rtol 1e-5 ~ 84 x 2^-23, atol for elements whose terms cancel
            assert torch.allclose(g_fast, g_slow, rtol=1e-5, atol=1e-6), path


@pytest.mark.parametrize(
    ("in_f", "out_f", "rank", "alpha", "factor", "both"),
    [(64, 64, 8, 4, 4, False), (64, 128, 8, 4, 4, False), (64, 128, 2, 3, 4, True),
     (2560, 2560, 512, 512, 6, True), (2560, 6144, 16, 8, -1, False)],
)  # fmt: skip
def test_lokr_shapes_and_scale_follow_lycoris(in_f, out_f, rank, alpha, factor, both):
    from lycoris.modules.lokr import LokrModule

    linear = torch.nn.Linear(in_f, out_f, device="meta")
    reference = LokrModule(
        "x", linear, 1.0, lora_dim=rank, alpha=alpha, factor=factor, decompose_both=both
    )
    spec = AdapterSpec(kind="lokr", rank=rank, alpha=alpha, factor=factor, decompose_both=both)
    shape = adapters.lokr_shape(in_f, out_f, spec)
    w1 = (shape.out_l, shape.in_m)
    w2 = (shape.out_k, shape.in_n)
    if reference.use_w1:
        assert shape.w1_full and tuple(reference.lokr_w1.shape) == w1
    else:
        assert not shape.w1_full
        assert (reference.lokr_w1_a.shape[0], reference.lokr_w1_b.shape[1]) == w1
    if reference.use_w2:
        assert shape.w2_full and tuple(reference.lokr_w2.shape) == w2
    else:
        assert not shape.w2_full
        assert (reference.lokr_w2_a.shape[0], reference.lokr_w2_b.shape[1]) == w2
    # Python floats on both sides: a few ulp of float64 (approx's default rel 1e-6)
    assert adapters.lokr_alpha(shape, spec) / rank == pytest.approx(reference.scale)


def test_state_round_trip_gives_identical_outputs(spec, make_toy, toy_inputs, randomize):
    trained = adapters.inject(make_toy(0), spec)
    randomize(trained)
    state = adapters.adapter_state_dict(trained)
    fresh = adapters.inject(make_toy(0), spec)
    adapters.load_adapter_state(fresh, state)
    assert torch.equal(fresh(*toy_inputs), trained(*toy_inputs))
    with pytest.raises(InputError, match="missing"):
        adapters.load_adapter_state(fresh, dict(list(state.items())[1:]))


def test_zero_scale_and_disabled_adapter_equal_the_base(spec, make_toy, toy_inputs, randomize):
    base = make_toy(0)(*toy_inputs)
    model = adapters.inject(make_toy(0), spec)
    randomize(model)
    adapted = model(*toy_inputs)
    assert not torch.allclose(adapted, base)  # the ΔW·x term, orders above float32 round-off
    adapters.set_scale(model, 0.0)
    assert torch.equal(model(*toy_inputs), base)
    adapters.set_scale(model, 1.0)
    assert torch.equal(model(*toy_inputs), adapted)
    adapters.set_enabled(model, False)
    assert torch.equal(model(*toy_inputs), base)
    adapters.set_enabled(model, True)
    assert torch.equal(model(*toy_inputs), adapted)
    assert all(p.requires_grad for _, p in adapters.trainable_parameters(model))


def test_merge_equals_unmerged_forward(spec, make_toy, toy_inputs, randomize):
    model = adapters.inject(make_toy(0), spec)
    randomize(model)
    weights = {p: adapters.base_weight(m).clone() for p, m in adapters.tuner_layers(model)}
    unmerged = model(*toy_inputs)
    adapters.merge(model)
    # float32: W + ΔW rounded once, then one GEMM, against base GEMM + delta path: a few ulp of
    # |out| (O(1)) per GEMM over K <= 128, two blocks deep: ~1e-6, inside 1e-5 + 1e-5·|out|
    torch.testing.assert_close(model(*toy_inputs), unmerged, rtol=1e-5, atol=1e-5)
    with pytest.raises(InputError, match="merged"):
        adapters.set_scale(model, 0.5)
    adapters.unmerge(model)
    for path, layer in adapters.tuner_layers(model):
        # (W + ΔW) - ΔW: two roundings of |W| < 1, ~1e-7; float32 defaults (atol 1e-5) ≪ |ΔW|
        torch.testing.assert_close(adapters.base_weight(layer), weights[path])


def test_delta_weights_are_scaled_products(make_toy, randomize):
    model = adapters.inject(make_toy(0), SPECS["lora"])
    randomize(model)
    state = adapters.adapter_state_dict(model)
    deltas = adapters.delta_weights(model)
    path = "layers.1.mlp.down_proj"
    expected = state[f"{path}.lora_B.weight"] @ state[f"{path}.lora_A.weight"] * (8 / 4)
    torch.testing.assert_close(deltas[path], expected)  # one rank-4 GEMM: float32 defaults
    assert deltas[path].shape == (64, 128)


def test_targets_and_layer_selection(make_toy):
    paths = adapters.resolve_targets(make_toy(0), AdapterSpec())
    assert len(paths) == 2 * 11 and "layers.0.self_attn.to_out.0" in paths
    only_1 = adapters.resolve_targets(make_toy(0), AdapterSpec(layers_to_train=(1,)))
    assert len(only_1) == 11 and all(p.startswith("layers.1.") for p in only_1)
    regex = adapters.resolve_targets(make_toy(0), AdapterSpec(layers_to_train=r"\.cross_attn\."))
    assert len(regex) == 8 and all(".cross_attn." in p for p in regex)
    with pytest.raises(InputError, match="no module"):
        adapters.resolve_targets(make_toy(0), AdapterSpec(targets=("nope",)))
    with pytest.raises(InputError, match="not Linear"):
        adapters.resolve_targets(make_toy(0), AdapterSpec(targets=("mlp",)))
    model = adapters.inject(make_toy(0), AdapterSpec(layers_to_train=(0,)))
    assert {p.split(".")[1] for p, _ in adapters.tuner_layers(model)} == {"0"}
    with pytest.raises(InputError, match="already"):
        adapters.inject(model, AdapterSpec())


def test_spec_from_route_options():
    dit = AdapterSpec.from_options(TrainDitOptions())
    assert (dit.kind, dit.rank, dit.alpha, dit.factor, dit.decompose_both) == (
        "lokr", 512, 512, 6, True,
    )  # fmt: skip
    assert dit.targets == adapters.DIT_ATTENTION_TARGETS + adapters.MLP_TARGETS
    lora = AdapterSpec.from_options(TrainDitOptions(adapter_type="lora", target_mlp=False))
    assert (lora.rank, lora.alpha, lora.targets) == (128, 256, adapters.DIT_ATTENTION_TARGETS)
    lm = AdapterSpec.from_options(TrainLmOptions())
    assert lm.targets[:4] == adapters.LM_ATTENTION_TARGETS and lm.rank == 128
    with pytest.raises(ValueError):
        AdapterSpec(kind="lokr", dropout=0.1)


@pytest.mark.parametrize("factored_w2", [False, True])
@pytest.mark.parametrize(
    "w1_shape", [(5, 4), (3, 4)]
)  # a > c: w2 first; a <= c: "ordered" w1 first
def test_pointwise_kron_mixes_give_the_gemm_path_values_and_gradients(factored_w2, w1_shape):
    """The "pointwise" and "ordered" w1 mixes (KronMix) against the GEMM path: same output and
    the same gradients for x, w1 and w2, float64 (so any difference is a formula, not
    rounding)."""
    generator = torch.Generator().manual_seed(4)

    def leaf(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64, requires_grad=True)

    a, c = w1_shape
    x, w1 = leaf(2, 7, c * 6), leaf(a, c)
    w2 = (leaf(3, 2), leaf(2, 6)) if factored_w2 else leaf(3, 6)
    weights = [w1, *(w2 if factored_w2 else (w2,))]
    upstream = torch.randn(2, 7, a * 3, generator=generator, dtype=torch.float64)
    results = {}
    for mode in KRON_MIXES:
        y = adapters.kron_linear(x, w1, w2, 0.7, mode)
        grads = torch.autograd.grad((y * upstream).sum(), [x, *weights])
        results[mode] = (y.detach(), grads)
    y_gemm, g_gemm = results.pop("gemm")
    reference = F.linear(x.detach(), torch.kron(w1, w2[0] @ w2[1] if factored_w2 else w2) * 0.7)
    # float64 (2^-52 ~ 2.2e-16): <= 24-term sums of O(1) products are ~1e-15 off, 1e-12 is
    # ~1000x that; a formula error is O(1)
    torch.testing.assert_close(y_gemm, reference.detach(), rtol=1e-12, atol=1e-12)
    assert set(results) == {"pointwise", "ordered"}
    for y_mode, g_mode in results.values():
        torch.testing.assert_close(y_mode, y_gemm, rtol=1e-12, atol=1e-12)  # float64, as above
        for got, want in zip(g_mode, g_gemm, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)  # float64, as above


def test_factored_lokr_under_autocast_keeps_the_autocast_dtype(
    monkeypatch, make_toy, toy_inputs, randomize
):
    """The factored path under (CPU) bf16 autocast: the w1 mix sees bf16 activations and
    factors, not float32 copies (peft's rule, measured slower on the H200); the output and the
    float32 masters' gradients stay within bf16 rounding of the float32 run's."""
    seen: list[torch.dtype] = []
    mix = adapters.KronMix.apply

    def recording(h, w1):
        seen.append(h.dtype)
        assert w1.dtype == h.dtype
        return mix(h, w1)

    monkeypatch.setattr(adapters.KronMix, "apply", staticmethod(recording))
    speed = SpeedOptions(kron_mix="ordered", kron_forward="factored")  # the path with the w1 mix
    model = adapters.inject(make_toy(0), SPECS["lokr"], speed)
    randomize(model)
    model.train()
    results = {}
    for autocast in (False, True):
        seen.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = model(*toy_inputs).float()
        out.square().mean().backward()
        grads = {n: p.grad.clone() for n, p in adapters.trainable_parameters(model)}
        model.zero_grad(set_to_none=True)
        assert seen, "no LoKR layer ran the w1 mix"
        assert set(seen) == {torch.bfloat16 if autocast else torch.float32}, autocast
        assert all(g.dtype == torch.float32 for g in grads.values())  # the masters' grads
        results[autocast] = (out.detach(), grads)
    (out_f, grads_f), (out_b, grads_b) = results[False], results[True]
    # bf16 (2^-8 relative per rounding) through ~10 rounded ops: a few 2^-8 of max|out|, and
    # not the float32 run itself
    assert 0 < _rel(out_b, out_f) < 2e-2
    for key, want in grads_f.items():
        # the factor gradients sum many cancelling bf16-rounded terms: a few % of max|grad|
        assert _rel(grads_b[key], want) < 0.05, key


def test_auto_kron_mix_is_ordered_on_cuda_and_gemm_elsewhere():
    """The measured choices: "ordered" for CUDA tensors (H200 2B step 214 vs 276 ms), the GEMM
    mix on the CPU (its fewer ops are faster there); an explicit mode wins everywhere."""
    assert SpeedOptions().kron_mix == "auto"
    assert adapters.kron_mix(torch.zeros(2, 8)) == "gemm"
    assert adapters.kron_mix(torch.zeros(2, 8, device="meta")) == "gemm"
    cuda_like = SimpleNamespace(is_cuda=True)  # all kron_mix reads of its input (no GPU here)
    assert adapters.kron_mix(cuda_like) == "ordered"
    assert adapters.kron_mix(cuda_like, "pointwise") == "pointwise"
