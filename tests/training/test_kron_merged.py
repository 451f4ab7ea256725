"""LoKR's merged forward (`SpeedOptions.kron_forward` "merged", `MergedKron`): one Linear on W + ΔW gives
the factored path's output and gradients, and steps aside where it does not apply."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from hotstep_ray.training import adapters, kron_kernels
from hotstep_ray.training.adapters import AdapterSpec
from hotstep_ray.training.speed import KRON_FORWARDS, SpeedOptions

LOKR = AdapterSpec(kind="lokr", rank=8, alpha=4, factor=4)  # full and low-rank w2, as test_adapters
# The toy inputs hold 12-128 tokens: let them take the merged path (the threshold has its own
# test below).
SHORT = SpeedOptions(kron_merged_min_tokens=1)


def _leaf(generator: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=generator, dtype=torch.float64, requires_grad=True)


@pytest.mark.parametrize("mix", ["gemm", "ordered"])  # _mix: matmul (CPU) or mix_rows (CUDA)
@pytest.mark.parametrize("w1_shape", [(5, 4), (3, 4), (4, 4)])  # a > c, a < c, a == c
def test_merged_kron_equals_base_plus_factored_path(w1_shape, mix):
    """float64: output and the gradients of x, bias, w1 and w2 equal F.linear + kron_linear's
    (so a difference is a formula, not rounding); the frozen weight gets none."""
    generator = torch.Generator().manual_seed(5)
    a, c = w1_shape
    b, d = 3, 6
    x, w1, w2, bias = (
        _leaf(generator, 2, 7, c * d),
        _leaf(generator, a, c),
        _leaf(generator, b, d),
        _leaf(generator, a * b),
    )
    weight = torch.randn(a * b, c * d, generator=generator, dtype=torch.float64)
    upstream = torch.randn(2, 7, a * b, generator=generator, dtype=torch.float64)
    leaves = [x, bias, w1, w2]

    merged = adapters.MergedKron.apply(x, weight, bias, w1, w2, 0.7, mix)
    got = torch.autograd.grad((merged * upstream).sum(), leaves)
    factored = F.linear(x, weight, bias) + adapters.kron_linear(x, w1, w2, 0.7, mix)
    want = torch.autograd.grad((factored * upstream).sum(), leaves)

    # float64 (2^-52): <= 24-term sums of O(1) products are ~1e-15 apart; a formula error is O(1)
    torch.testing.assert_close(merged, factored, rtol=1e-12, atol=1e-12)
    for name, g_got, g_want in zip(("x", "bias", "w1", "w2"), got, want, strict=True):
        assert g_got.abs().sum() > 0, name
        torch.testing.assert_close(g_got, g_want, rtol=1e-12, atol=1e-12, msg=name)  # float64
    with pytest.raises(NotImplementedError, match="frozen"):  # refused in the forward
        trained = weight.clone().requires_grad_(True)
        adapters.MergedKron.apply(x, trained, bias, w1, w2, 0.7, mix)


def _run(model, inputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    out = model(*inputs)
    out.square().mean().backward()
    grads = {key: p.grad.clone() for key, p in adapters.trainable_parameters(model)}
    model.zero_grad(set_to_none=True)
    return out.detach(), grads


@pytest.mark.parametrize(
    "spec",
    [LOKR, AdapterSpec(kind="lokr", rank=1, alpha=1, factor=4, decompose_both=True)],
    ids=["lokr", "low-rank-w1-and-w2"],
)
def test_merged_forward_gives_the_factored_model(
    merged_calls, make_toy, toy_inputs, randomize, spec
):
    """A toy model with LoKR in training mode, float32: the merged forward runs in every adapted
    Linear and gives the factored forward's output and adapter gradients (full and low-rank
    factors: autograd takes w1_a @ w1_b and w2_a @ w2_b outside MergedKron)."""
    if spec.decompose_both:
        shape = adapters.lokr_shape(64, 64, spec)
        assert not (shape.w1_full or shape.w2_full)
    model = adapters.inject(make_toy(0), spec, SHORT)
    randomize(model)
    model.train()
    calls = merged_calls
    results = {}
    for forward in KRON_FORWARDS:
        adapters.set_speed(model, replace(SHORT, kron_forward=forward))
        calls.clear()
        results[forward] = _run(model, toy_inputs)
        layers = len(list(adapters.tuner_layers(model)))
        assert len(calls) == (layers if forward == "merged" else 0), forward
    (out_f, grads_f), (out_m, grads_m) = results["factored"], results["merged"]
    # two float32 paths (W + ΔW rounded, one GEMM; base GEMM + factored delta): a few ulp of
    # max|out| per GEMM over K <= 128, two blocks deep; rtol 1e-5 ~ 84 ulp, atol near zero
    torch.testing.assert_close(out_m, out_f, rtol=1e-5, atol=1e-6)
    assert grads_m.keys() == grads_f.keys()
    for key, want in grads_f.items():
        assert want.abs().sum() > 0, key
        # the factor gradients sum many cancelling float32 terms: rtol 1e-4, atol near zero
        torch.testing.assert_close(grads_m[key], want, rtol=1e-4, atol=1e-6, msg=key)


def test_merged_forward_under_autocast_and_where_it_steps_aside(
    merged_calls, make_toy, toy_inputs, randomize
):
    """Under (CPU) bf16 autocast the merged Linear runs in bf16 and stays within bf16 rounding of
    the factored path; without autocast, mixed dtypes (a bf16 base, float32 factors) and rank
    dropout keep the factored path."""
    calls = merged_calls
    model = adapters.inject(make_toy(0), LOKR, SHORT)
    randomize(model)
    model.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out_m, grads_m = _run(model, toy_inputs)
    assert calls and {x.dtype for x in calls} == {torch.bfloat16}
    adapters.set_speed(model, replace(SHORT, kron_forward="factored"))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out_f, grads_f = _run(model, toy_inputs)
    # bf16 rounds W + ΔW (merged) or the two outputs (factored): each 2^-9 relative, through ~10
    # rounded ops; the bf16 factor gradients sum many cancelling terms: a few %
    assert (out_m.float() - out_f.float()).norm() <= 2e-2 * out_f.float().norm()
    for key, want in grads_f.items():
        assert (grads_m[key] - want).norm() <= 0.05 * want.norm(), key

    calls.clear()
    mixed = adapters.inject(make_toy(0), LOKR, SHORT)
    randomize(mixed)
    mixed.to(torch.bfloat16)
    for param in adapters.adapter_parameters(mixed).values():
        param.data = param.data.float()  # float32 masters on a bf16 base, no autocast
    mixed(*(t.to(torch.bfloat16) for t in toy_inputs))
    assert calls == []
    dropping = adapters.inject(make_toy(0), LOKR.model_copy(update={"dropout": 0.0}), SHORT)
    for _, layer in adapters.tuner_layers(dropping):
        layer.rank_dropout[adapters.ADAPTER_NAME] = 0.5
    dropping.train()
    dropping(*toy_inputs)
    assert calls == []
    trained_base = adapters.inject(make_toy(0), LOKR, SHORT)
    randomize(trained_base)
    for _, layer in adapters.tuner_layers(trained_base):
        layer.base_layer.weight.requires_grad_(True)  # MergedKron gives no weight gradient
    trained_base(*toy_inputs).square().mean().backward()
    assert calls == []
    assert all(
        layer.base_layer.weight.grad is not None for _, layer in adapters.tuner_layers(trained_base)
    )


def test_a_bf16_fit_with_the_merged_forward_tracks_float32_like_the_factored_one(
    merged_calls, make_toy
):
    """The merged forward rounds W + ΔW to bf16 where the factored one rounds the sum of the two
    outputs. Fitting a toy model's LoKR (bf16 base, float32 masters, bf16 autocast, AdamW, 60
    steps) to a fixed target, the merged run's losses stay as close to the float32 run's as the
    factored run's do (both measured ~2-3e-4 mean relative deviation)."""
    generator = torch.Generator().manual_seed(0)
    teacher = make_toy(1)
    x, context = (
        torch.randn(8, 16, 16, generator=generator),
        torch.randn(8, 5, 64, generator=generator),
    )
    with torch.no_grad():
        target = teacher(x, context)

    def fit(forward: str, bf16: bool) -> list[float]:
        model = adapters.inject(make_toy(0), LOKR, replace(SHORT, kron_forward=forward))
        if bf16:
            model.to(torch.bfloat16)
            for param in adapters.adapter_parameters(model).values():
                param.data = param.data.float()
        model.train()
        params = [p for _, p in adapters.trainable_parameters(model)]
        optimizer = torch.optim.AdamW(params, lr=3e-4)
        dtype = torch.bfloat16 if bf16 else torch.float32
        losses = []
        for _ in range(60):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                out = model(x.to(dtype), context.to(dtype))
            loss = (out.float() - target).square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return losses

    reference = fit("factored", bf16=False)
    assert merged_calls == []
    deviation = {
        forward: sum(abs(a - b) / b for a, b in zip(fit(forward, True), reference, strict=True))
        / len(reference)
        for forward in KRON_FORWARDS
    }
    print("mean relative loss deviation from float32:", deviation)  # docs/BENCHMARKS.md, -s
    assert merged_calls  # the merged run took the merged path
    assert reference[-1] < 0.9 * reference[0]  # the fit moves (a learning signal, not round-off)
    # bf16 against float32 over 60 AdamW steps: the mean relative loss deviation stays under
    # bf16's 2^-9 (2e-3); merged must track as well as factored, + ~2^-9/10 for its own rounding
    assert 0 < deviation["factored"] < 2e-3
    assert deviation["merged"] < 2 * deviation["factored"] + 2e-4, deviation


def test_few_tokens_keep_the_factored_path(merged_calls, make_toy, randomize):
    """Below `kron_merged_min_tokens` rows (a decode step) the merged Linear would rebuild every
    weight per token: those calls take the factored path, longer inputs the merged one; both
    give the same output."""
    speed = SpeedOptions(kron_merged_min_tokens=64)
    calls = merged_calls
    model = adapters.inject(make_toy(0), LOKR, speed)
    randomize(model)
    generator = torch.Generator().manual_seed(2)
    context = torch.randn(1, 5, 64, generator=generator)
    for tokens, merged in ((1, False), (63, False), (64, True)):
        x = torch.randn(1, tokens, 16, generator=generator)
        calls.clear()
        with torch.no_grad():
            out = model(x, context)
            adapters.set_speed(model, replace(speed, kron_forward="factored"))
            want = model(x, context)
            adapters.set_speed(model, speed)
        assert (len(calls) > 0) == merged, tokens
        assert all(x.shape[:2] == (1, tokens) for x in calls)  # context-side Linears: 5 rows
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)  # float32 paths, as above


@pytest.mark.parametrize("w1_shape", [(5, 4), (3, 4), (4, 4)])  # a > c, a < c, a == c
def test_fused_pair_sums_and_mix_give_the_same_factor_grads(monkeypatch, w1_shape):
    """Where the backward takes `kron_kernels.pair_partials_mix` (one pass for w1's pair sums
    and w2's mix; CUDA only, forced here onto its torch fallback): the same w1 and w2 gradients
    as the factored path, mixing dy's rows when a >= c and x's when a < c."""
    sides = []
    real = kron_kernels.pair_partials_mix

    def spy(x, y, m, side):
        sides.append(side)
        return real(x, y, m, side)

    monkeypatch.setattr(adapters, "fuses_mix", lambda rows, cols, fused_mix: True)
    monkeypatch.setattr(kron_kernels, "pair_partials_mix", spy)
    generator = torch.Generator().manual_seed(6)
    a, c = w1_shape
    b, d = 3, 6
    x, w1, w2 = _leaf(generator, 2, 7, c * d), _leaf(generator, a, c), _leaf(generator, b, d)
    weight = torch.randn(a * b, c * d, generator=generator, dtype=torch.float64)
    upstream = torch.randn(2, 7, a * b, generator=generator, dtype=torch.float64)
    merged = adapters.MergedKron.apply(x, weight, None, w1, w2, 0.7)
    got = torch.autograd.grad((merged * upstream).sum(), [x, w1, w2])
    factored = F.linear(x, weight) + adapters.kron_linear(x, w1, w2, 0.7)
    want = torch.autograd.grad((factored * upstream).sum(), [x, w1, w2])
    assert sides == [2 if a < c else 1]
    for name, g_got, g_want in zip(("x", "w1", "w2"), got, want, strict=True):
        # the op's partials are float32 whatever the input (its schema): each per-token pair sum
        # rounded to float32 and 14 of them summed in float32, <~ 15·2^-24·Σ|terms|, and Σ|terms|
        # is several |w1 grad| where tokens cancel: 1e-5. x and w2 stay float64 (1e-12).
        tol = 1e-5 if name == "w1" else 1e-12
        torch.testing.assert_close(g_got, g_want, rtol=tol, atol=tol, msg=name)
    # only w2 trained (w1 frozen): the unfused path, no pair sums
    sides.clear()
    w1_frozen = w1.detach()
    merged = adapters.MergedKron.apply(x, weight, None, w1_frozen, w2, 0.7)
    torch.autograd.grad((merged * upstream).sum(), [w2])
    assert sides == []


def test_the_fused_backward_is_for_cuda_half_precision_only(monkeypatch):
    """Both the switch (on by default since the H200 measured it) and the kernel's own
    conditions."""
    assert SpeedOptions().fused_mix  # the default the thirteenth device run chose
    rows = torch.randn(5, 4, 8, dtype=torch.bfloat16)
    with monkeypatch.context() as patched:  # operands the kernel takes
        patched.setattr(kron_kernels, "kernel_applies", lambda x, y: True)
        assert adapters.fuses_mix(rows, rows, fused_mix=True)
        assert not adapters.fuses_mix(rows, rows, fused_mix=False)  # dit_bench --no-fused-mix
    assert not adapters.fuses_mix(rows, rows, fused_mix=True)  # CPU
    meta = torch.empty(5, 4, 8, dtype=torch.bfloat16, device="meta")
    assert not adapters.fuses_mix(meta, meta, fused_mix=True)
