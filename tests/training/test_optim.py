"""Hybrid Muon: the per-parameter split, the update against a float64 reference, the LR, and the
shape buckets (one batched Newton–Schulz each) against the per-parameter loop."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from hotstep_ray.training import adapters, optim
from hotstep_ray.training.adapters import AdapterSpec
from hotstep_ray.training.schedule import LrSchedule

NS = (3.4445, -4.7750, 2.0315)
# Five float32 Newton–Schulz steps are 15 GEMMs (K <= 64), each rounding by ~sqrt(K)·2^-24, so
# an orthogonalised update is ~2e-6 of its max|entry| off the float64 one; two float32 paths on
# different kernels (bmm / mm) may differ by twice that: 1e-5 leaves room. Bugs are O(1e-2).
NS_F32_REL = 1e-5


def reference_muon(param, grads, *, lr, weight_decay, momentum=0.95, nesterov=True, steps=5):
    """Newton–Schulz momentum in float64, written from the algorithm (not from torch's code).
    Returns the parameter after each step."""
    p = param.double().clone()
    buf = torch.zeros_like(p)
    rows, cols = p.shape
    history = []
    for grad in grads:
        g = grad.double()
        buf = momentum * buf + (1 - momentum) * g
        u = (1 - momentum) * g + momentum * buf if nesterov else buf
        x = u.T if rows > cols else u
        x = x / max(x.norm().item(), 1e-7)
        a, b, c = NS
        for _ in range(steps):
            gram = x @ x.T
            x = a * x + (b * gram + c * gram @ gram) @ x
        x = x.T if rows > cols else x
        p = p * (1 - lr * weight_decay) - lr * math.sqrt(max(1.0, rows / cols)) * x
        history.append(p.clone())
    return history


def test_muon_update_matches_float64_reference():
    generator = torch.Generator().manual_seed(0)
    # Per-slab norms differ, also WITHIN a bucket: three [24, 40] and three tall [40, 24] slabs
    # at ×8/×1/×⅛ catch a Frobenius norm taken over the bucket instead of per slab.
    shapes = [(24, 40), (48, 20), (32, 32)] + [(24, 40)] * 2 + [(40, 24)] * 3
    scales = [8.0, 1.0, 0.125] + [1.0, 0.125] + [8.0, 1.0, 0.125]
    params = [torch.nn.Parameter(torch.randn(s, generator=generator)) for s in shapes]
    grads = [
        [torch.randn(s, generator=generator) * k for _ in range(4)]
        for s, k in zip(shapes, scales, strict=True)
    ]
    start = [p.detach().clone() for p in params]
    muon = optim.Muon(params, lr=0.5, weight_decay=0.01, momentum=0.95)
    ours = [[] for _ in params]
    for step in range(4):
        for p, g in zip(params, grads, strict=True):
            p.grad = g[step].clone()
        muon.step()
        for history, p in zip(ours, params, strict=True):
            history.append(p.detach().clone())
    for p0, g, history in zip(start, grads, ours, strict=True):
        reference = reference_muon(p0, g, lr=0.5, weight_decay=0.01)
        before = p0.double()
        for got, want in zip(history, reference, strict=True):
            # Compare the UPDATE (|Δp| ~ 0.1), not the parameter, so 1e-4 means something.
            # float32 NS: ~2e-6 of |Δp| per step over 4 steps, a few 1e-6; a bucket norm is O(0.1)
            error = ((got.double() - before) - (want - before)).abs().max().item()
            assert error < 1e-4, error
            before = want


def test_orthogonalised_update_is_semi_orthogonal():
    grad = torch.randn(32, 48, generator=torch.Generator().manual_seed(1))
    ortho = optim.newton_schulz(grad, NS, 5, 1e-7)
    singular = torch.linalg.svdvals(ortho.double())
    assert singular.min() > 0.5 and singular.max() < 1.5  # the coefficients' designed range


def test_bfloat16_mode_reproduces_torch_muon_bit_for_bit():
    generator = torch.Generator().manual_seed(2)
    shapes = [(24, 40), (24, 40), (24, 40), (40, 24)]  # a bucket's worth: bf16 stays per-parameter
    init = [torch.randn(s, generator=generator) for s in shapes]
    grads = [[torch.randn(s, generator=generator) for s in shapes] for _ in range(3)]
    ours = [torch.nn.Parameter(x.clone()) for x in init]
    theirs = [torch.nn.Parameter(x.clone()) for x in init]
    opt_ours = optim.Muon(ours, lr=0.02, ns_precision="bfloat16")
    opt_theirs = torch.optim.Muon(theirs, lr=0.02)
    for step_grads in grads:
        for p, q, grad in zip(ours, theirs, step_grads, strict=True):
            p.grad, q.grad = grad.clone(), grad.clone()
        opt_ours.step()
        opt_theirs.step()
    # exact: the 2-D path is torch's op sequence, run by the same kernels in this process
    assert all(torch.equal(p, q) for p, q in zip(ours, theirs, strict=True))
    # ...and why float32 is the CPU default and bf16 an opt-in or the CUDA speed trade: torch's
    # bf16 iteration misses the 1e-4 bar.
    exact = optim.newton_schulz(grads[0][0].double(), NS, 5, 1e-7, torch.float64)
    bf16 = optim.newton_schulz(grads[0][0], NS, 5, 1e-7, torch.bfloat16)
    f32 = optim.newton_schulz(grads[0][0], NS, 5, 1e-7, torch.float32)
    # float32 is ~2e-6 of max|entry| < 1 off (see NS_F32_REL): under 1e-5; bf16's 2^-8 steps
    # do not stay under 1e-3
    assert (bf16.double() - exact).abs().max() > 1e-3 > 1e-5 > (f32.double() - exact).abs().max()
    assert opt_ours.state_dict()["state"][0].keys() == opt_theirs.state_dict()["state"][0].keys()


def per_parameter_muon_step(params, bufs, group):
    """The pre-bucketing loop (torch's, float32 NS), one parameter at a time, as the reference."""
    lr, momentum = group["lr"], group["momentum"]
    for param, buf in zip(params, bufs, strict=True):
        if param.grad is None:
            continue
        grad = param.grad
        buf.lerp_(grad, 1 - momentum)
        update = grad.lerp(buf, momentum) if group["nesterov"] else buf
        ortho = optim.newton_schulz(update, NS, group["ns_steps"], group["eps"])
        param.mul_(1 - lr * group["weight_decay"])
        param.add_(ortho, alpha=-lr * optim.lr_ratio(param.shape, group["adjust_lr_fn"]))


# Same-shape runs (wide and tall, the tall ones interleaved), lone shapes, and one frozen slot.
MIXED_SHAPES = [(24, 40), (40, 24), (24, 40), (32, 32), (40, 24), (24, 40), (48, 20)]
MIXED_SHAPES += [(24, 40), (32, 32), (40, 24), (16, 64), (24, 40), (40, 24)]


@pytest.mark.parametrize("bucket_size", [16, 2, None])
@pytest.mark.parametrize(
    ("nesterov", "adjust_lr_fn"), [(True, "original"), (False, "match_rms_adamw")]
)
def test_bucketed_step_matches_per_parameter_loop(bucket_size, nesterov, adjust_lr_fn):
    generator = torch.Generator().manual_seed(3)
    scales = [8.0, 1.0, 0.125]
    init = [torch.randn(s, generator=generator) for s in MIXED_SHAPES]
    grads = [
        [torch.randn(s, generator=generator) * scales[i % 3] for i, s in enumerate(MIXED_SHAPES)]
        for _ in range(4)
    ]
    ours = [torch.nn.Parameter(x.clone()) for x in init]
    theirs = [x.clone() for x in init]
    muon = optim.Muon(
        ours,
        lr=0.05,
        weight_decay=0.1,
        nesterov=nesterov,
        adjust_lr_fn=adjust_lr_fn,
        bucket_size=bucket_size,
    )
    bufs = [torch.zeros_like(x) for x in init]
    for step_grads in grads:
        before = [x.clone() for x in theirs]
        for i, (p, q, grad) in enumerate(zip(ours, theirs, step_grads, strict=True)):
            p.grad = None if i == 3 else grad.clone()  # one [32, 32] without a gradient
            q.grad = p.grad
        muon.step()
        per_parameter_muon_step(theirs, bufs, muon.param_groups[0])
        for p, q, p0 in zip(ours, theirs, before, strict=True):
            want = q - p0
            # the batched NS (bmm) against the per-parameter one (mm): up to NS_F32_REL apart
            # each step, and the parameters carry the earlier steps' differences (4 steps)
            error = (p.detach() - p0 - want).abs().max() / want.abs().max().clamp(min=1e-30)
            assert error <= 3 * NS_F32_REL, error
    assert torch.equal(ours[3], init[3]) and ours[3] not in muon.state
    for p, buf in zip(ours, bufs, strict=True):
        if p in muon.state:
            assert torch.equal(muon.state[p]["momentum_buffer"], buf)


@pytest.mark.parametrize(
    ("bucket_size", "expected"), [(None, [5, 4, 2, 1, 1]), (2, [2, 2, 1, 2, 2, 2, 1, 1])]
)
def test_one_newton_schulz_call_per_bucket(monkeypatch, bucket_size, expected):
    calls = []
    real = optim.newton_schulz

    def counting(update, *args):
        calls.append(tuple(update.shape))
        return real(update, *args)

    monkeypatch.setattr(optim, "newton_schulz", counting)
    generator = torch.Generator().manual_seed(4)
    params = [torch.nn.Parameter(torch.randn(s, generator=generator)) for s in MIXED_SHAPES]
    for p in params:
        p.grad = torch.randn(p.shape, generator=generator)
    optim.Muon(params, lr=0.02, bucket_size=bucket_size).step()
    # Buckets in first-seen order: [24, 40] ×5, [40, 24] ×4, [32, 32] ×2, [48, 20], [16, 64].
    assert [n for n, *_ in calls] == expected
    assert all(len(shape) == 3 for shape in calls)
    assert {shape[1:] for shape in calls} == {(24, 40), (40, 24), (32, 32), (48, 20), (16, 64)}


def test_batched_newton_schulz_normalises_each_slab():
    generator = torch.Generator().manual_seed(5)
    for shape in [(24, 40), (40, 24)]:
        bucket = torch.randn(3, *shape, generator=generator)
        bucket *= torch.tensor([8.0, 1.0, 0.125]).view(3, 1, 1)
        batched = optim.newton_schulz(bucket, NS, 5, 1e-7)
        assert batched.shape == bucket.shape
        for slab, got in zip(bucket, batched, strict=True):
            want = optim.newton_schulz(slab, NS, 5, 1e-7)
            # float32 bmm against mm: two NS paths, see NS_F32_REL
            assert (got - want).abs().max() <= NS_F32_REL * want.abs().max()
            singular = torch.linalg.svdvals(got.double())
            assert singular.min() > 0.5 and singular.max() < 1.5  # the coefficients' range
        # What the per-slab norm guards against: one norm for the whole bucket (the iteration
        # below, un-normalised) leaves the ×⅛ slab far from orthogonal after five steps.
        x = (bucket / bucket.norm()).double()
        x = x.mT if shape[0] > shape[1] else x
        a, b, c = NS
        for _ in range(5):
            gram = x @ x.mT
            x = a * x + (b * gram + c * gram @ gram) @ x
        assert torch.linalg.svdvals(x[2]).min() < 0.5  # float64 throughout: no CPU dependence
    with pytest.raises(ValueError, match="newton_schulz"):
        optim.newton_schulz(torch.randn(2, 2, 4, 4), NS, 5, 1e-7)


def test_bucket_size_is_validated_and_defaults_to_16():
    param = torch.nn.Parameter(torch.randn(16, 16))
    assert optim.Muon([param]).bucket_size == 16
    assert optim.build_optimizer([("w", param)], muon_bucket_size=None).muon.bucket_size is None
    # "auto" (the default): cache-sized buckets and torch's foreach AdamW on the CPU; one bucket
    # per shape and the fused AdamW kernel only when the parameters live on a GPU
    auto = optim.build_optimizer([("w", param), ("v", torch.nn.Parameter(torch.randn(3)))])
    assert auto.muon.bucket_size == 16
    assert not auto.adamw.defaults["fused"]
    with pytest.raises(ValueError, match="bucket_size"):
        optim.Muon([param], bucket_size=0)


def test_split_counts_by_short_side(make_toy):
    lokr = adapters.inject(make_toy(0), AdapterSpec(kind="lokr", rank=8, alpha=4, factor=4))
    opt = optim.build_optimizer(adapters.trainable_parameters(lokr), "muon", lr=1e-3)
    # Per block: 8 self/cross-attention w2 [16,16] -> Muon; their 8 w1 [4,4] and the 3 MLP
    # modules' w1, w2_a [., 8], w2_b [8, .] -> AdamW. (A real DiT LoKR run: 448 / 352.)
    assert opt.split_summary() == "16 Muon / 34 AdamW"
    assert all(n.endswith("lokr_w2") for n in opt.muon_names)
    lora16 = adapters.inject(make_toy(0), AdapterSpec(rank=16, alpha=16))
    assert optim.build_optimizer(adapters.trainable_parameters(lora16)).split_summary() == (
        "44 Muon / 0 AdamW"
    )
    lora8 = adapters.inject(make_toy(0), AdapterSpec(rank=8, alpha=16))  # short side = rank = 8
    assert optim.build_optimizer(adapters.trainable_parameters(lora8)).split_summary() == (
        "0 Muon / 44 AdamW"
    )
    adamw = optim.build_optimizer(adapters.trainable_parameters(lora16), "adamw")
    assert adamw.split_summary() == "0 Muon / 44 AdamW" and adamw.muon is None


def test_muon_lr_scale_decay_and_schedule(make_toy):
    model = adapters.inject(make_toy(0), AdapterSpec(kind="lokr", rank=8, alpha=4, factor=4))
    opt = optim.build_optimizer(
        adapters.trainable_parameters(model), lr=2e-3, weight_decay=1e-3, muon_lr_scale=20
    )
    muon_group, adamw_group = opt.param_groups
    # Python float arithmetic on the learning rates: a few ulp (approx's default rel 1e-6)
    assert muon_group["base_lr"] == pytest.approx(0.04) and adamw_group["base_lr"] == 2e-3
    # Decoupled decay per step lr·wd is AdamW's in both optimizers.
    assert muon_group["lr"] * muon_group["weight_decay"] == pytest.approx(2e-3 * 1e-3)
    assert muon_group["adjust_lr_fn"] == "original"
    schedule = LrSchedule(total_steps=101, warmup_steps=10)
    assert schedule.apply(opt, 5) == pytest.approx(0.5)  # Python floats, as above
    assert muon_group["lr"] == pytest.approx(0.02) and adamw_group["lr"] == pytest.approx(1e-3)
    schedule.apply(opt, 100)
    assert muon_group["lr"] == pytest.approx(0.004) and adamw_group["lr"] == pytest.approx(2e-4)


def test_hybrid_state_dict_round_trip(make_toy, toy_inputs):
    def build():
        model = adapters.inject(make_toy(0), AdapterSpec(kind="lokr", rank=8, alpha=4, factor=4))
        return model, optim.build_optimizer(adapters.trainable_parameters(model), lr=1e-2)

    def train(model, opt, steps):
        for _ in range(steps):
            opt.zero_grad()
            model(*toy_inputs).square().mean().backward()
            opt.step()

    model_a, opt_a = build()
    train(model_a, opt_a, 2)
    model_b, opt_b = build()
    adapters.load_adapter_state(model_b, adapters.adapter_state_dict(model_a))
    # torch's load_state_dict keeps the given tensors (no copy): copy, as a file load would.
    opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))
    train(model_a, opt_a, 2)
    train(model_b, opt_b, 2)
    for key, value in adapters.adapter_state_dict(model_a).items():
        assert torch.equal(value, adapters.adapter_state_dict(model_b)[key]), key
    with pytest.raises(ValueError, match="parts"):
        opt_b.load_state_dict({"adamw": opt_a.state_dict()["adamw"]})


def test_zero_grad_keeps_the_buffers_and_zeroes_them_in_one_call(make_toy, monkeypatch):
    lokr = adapters.inject(make_toy(0), AdapterSpec(kind="lokr", rank=8, alpha=4, factor=4))
    named = adapters.trainable_parameters(lokr)
    opt = optim.build_optimizer(named, "muon", lr=1e-3)  # both halves: Muon and AdamW
    params = [p for _, p in named]
    for param in params:
        param.grad = torch.randn_like(param)
    buffers = [param.grad for param in params]
    calls = []
    real = torch._foreach_zero_
    monkeypatch.setattr(torch, "_foreach_zero_", lambda ts: (calls.append(len(ts)), real(ts)))
    opt.zero_grad(set_to_none=False)  # the CUDA-graph trainers' stable buffers
    assert calls == [len(params)]
    assert all(p.grad is b for p, b in zip(params, buffers, strict=True))
    assert all(not b.any() for b in buffers)
    opt.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in params)


# ----------------------------------------------------------------------------- NS precision


def test_ns_precision_resolution():
    assert optim.resolve_ns_precision("auto", on_cuda=True) == "bfloat16_batched"
    assert optim.resolve_ns_precision("auto", on_cuda=False) == "float32"
    for name in optim.NS_PRECISIONS:
        assert optim.resolve_ns_precision(name, on_cuda=True) == name
    with pytest.raises(ValueError, match="auto or one of"):
        optim.resolve_ns_precision("fp16", on_cuda=True)
    with pytest.raises(ValueError, match="auto or one of"):
        optim.Muon([torch.nn.Parameter(torch.ones(16, 16))], ns_precision="half")


def test_auto_resolves_by_the_parameters_device():
    """CPU parameters: "auto" is float32, in `build_optimizer` and in `Muon` itself (the
    trainers' own pass-through is checked in test_dit_train / test_lm_train)."""
    param = torch.nn.Parameter(torch.zeros(16, 32))
    assert optim.build_optimizer([("w", param)]).muon.ns_precision == "float32"
    assert optim.Muon([param], ns_precision="auto").ns_precision == "float32"
    built = optim.build_optimizer([("w", param)], muon_ns_precision="tf32")
    assert built.muon.ns_precision == "tf32"


def _steps(precision):
    generator = torch.Generator().manual_seed(3)
    params = [torch.nn.Parameter(torch.randn(24, 40, generator=generator)) for _ in range(3)]
    muon = optim.Muon(params, lr=0.1, ns_precision=precision)
    for _ in range(3):
        for p in params:
            p.grad = torch.randn(p.shape, generator=generator)
        muon.step()
    return [p.detach().clone() for p in params]


def test_tf32_runs_newton_schulz_under_tf32_matmuls_and_is_float32_on_the_cpu(monkeypatch):
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    seen = []
    real = optim.newton_schulz

    def spy(*args, **kwargs):
        seen.append(matmul.fp32_precision)
        return real(*args, **kwargs)

    monkeypatch.setattr(optim, "newton_schulz", spy)
    tf32 = _steps("tf32")
    assert seen and set(seen) == {"tf32"}
    assert matmul.fp32_precision == before  # restored after the step
    seen.clear()
    plain = _steps("float32")
    assert seen and "tf32" not in seen
    # the knob is CUDA's: CPU float32 GEMMs are unchanged (same kernels, this process), so the
    # steps are bitwise equal
    for a, b in zip(tf32, plain, strict=True):
        assert torch.equal(a, b)


def test_bfloat16_batched_runs_the_bucketed_iteration_in_bf16(monkeypatch):
    """One batched Newton–Schulz per bucket (not torch's per-parameter loop), every GEMM of it
    on bf16 stacks, wide and tall buckets alike, and a step close to the float32 one: bf16's ~3
    significant digits, not a different update."""
    calls, operands = [], []
    real_ns, real_baddbmm = optim.newton_schulz, torch.baddbmm

    def spy_ns(grad, *args, **kwargs):
        calls.append(grad.shape)
        return real_ns(grad, *args, **kwargs)

    def spy_baddbmm(*args, **kwargs):
        operands.extend(t.dtype for t in args if isinstance(t, torch.Tensor))
        return real_baddbmm(*args, **kwargs)

    monkeypatch.setattr(optim, "newton_schulz", spy_ns)
    monkeypatch.setattr(torch, "baddbmm", spy_baddbmm)
    shapes = [(24, 40)] * 3 + [(40, 24)] * 2

    def steps(precision):
        generator = torch.Generator().manual_seed(3)
        params = [torch.nn.Parameter(torch.randn(s, generator=generator)) for s in shapes]
        start = [p.detach().clone() for p in params]
        muon = optim.Muon(params, lr=0.1, ns_precision=precision)
        for _ in range(3):
            for p in params:
                p.grad = torch.randn(p.shape, generator=generator)
            muon.step()
        return start, [p.detach().clone() for p in params]

    start, batched = steps("bfloat16_batched")
    assert sorted(calls) == sorted([(3, 24, 40), (2, 40, 24)] * 3)  # one stack per bucket
    assert operands and set(operands) == {torch.bfloat16}
    _, plain = steps("float32")
    for got, want, before in zip(batched, plain, start, strict=True):
        assert got.dtype == torch.float32
        assert not torch.equal(got, want)  # it did run in another precision
        # bf16 GEMMs (2^-9 per rounding) through 3 steps: a few % of the step, not another update
        assert (got - want).abs().max() < 0.05 * (want - before).abs().max()


def test_batched_bf16_newton_schulz_normalises_in_float32_then_iterates_in_bf16():
    """Bitwise the iteration written out: each slab divided by its own float32 norm, cast to
    bf16, five quintic steps in bf16 (a bf16 norm would round differently). Within bf16
    rounding (~4% of the largest element) of float64, and a slab 1000x larger comes out the
    same. A float64 stack with float64 `dtype` stays float64 (the benches' reference)."""
    generator = torch.Generator().manual_seed(5)
    grad = torch.randn(2, 16, 48, generator=generator)
    grad[1] = grad[0] * 1e3
    out = optim.newton_schulz(grad, NS, 5, 1e-7, torch.bfloat16)
    x = (grad / torch.linalg.vector_norm(grad, dim=(-2, -1), keepdim=True)).to(torch.bfloat16)
    a, b, c = NS
    for _ in range(5):
        gram = x @ x.mT
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    # exact: the same ops in the same order in this process
    assert out.dtype == torch.bfloat16 and torch.equal(out, x)
    reference = optim.newton_schulz(grad[0].double(), NS, 5, 1e-7, torch.float64)
    for slab in out:
        # 15 bf16-rounded GEMMs (2^-9 each, NS's a = 3.4 amplifying small singular values):
        # ~10 bf16 ulp of the largest entry, ~4%; a wrong norm or slab mix-up is O(1)
        assert (slab.double() - reference).abs().max() < 0.05 * reference.abs().max()
    assert optim.newton_schulz(grad.double(), NS, 5, 1e-7, torch.float64).dtype == torch.float64


# ----------------------------------------------------------------------------- device gate


@pytest.mark.parametrize("fused_adamw", [False, True])
def test_found_inf_skips_the_whole_step_on_the_device_and_zero_takes_it(make_toy, fused_adamw):
    """`HybridOptimizer.step(found_inf)`: nonzero leaves every parameter and every optimizer
    state as it was (Muon's bucketed gate; torch's fused AdamW, or the host's read), zero takes
    the same step as without it."""

    def build():
        model = adapters.inject(make_toy(0), AdapterSpec(kind="lokr", rank=8, alpha=4, factor=4))
        named = adapters.trainable_parameters(model)
        opt = optim.build_optimizer(named, "muon", lr=1e-2, weight_decay=0.1)
        if fused_adamw:  # as on CUDA (fused there); torch's CPU kernel takes found_inf too
            groups = [
                {"params": g["params"], "base_lr": g["base_lr"]} for g in opt.adamw.param_groups
            ]
            opt.adamw = torch.optim.AdamW(groups, lr=1e-2, weight_decay=0.1, fused=True)
        return [p for _, p in named], opt

    def grads(params, seed):
        generator = torch.Generator().manual_seed(seed)
        for param in params:
            param.grad = torch.randn(param.shape, generator=generator)

    def snapshot(params, opt):
        state = [
            t.clone()
            for o in (opt.muon, opt.adamw)
            for s in o.state.values()
            for t in s.values()
            if isinstance(t, torch.Tensor)
        ]
        return [p.detach().clone() for p in params], state

    gated_params, gated = build()
    plain_params, plain = build()
    assert plain.muon is not None and plain.adamw is not None  # both halves are exercised
    assert bool(gated.adamw.param_groups[0]["fused"]) is fused_adamw
    for step in range(3):  # zero: the plain step
        grads(gated_params, step)
        grads(plain_params, step)
        gated.step(found_inf=torch.zeros(()))
        plain.step()
    for got, want in zip(gated_params, plain_params, strict=True):
        # buf + (1 - mu)(g - buf) in two roundings against lerp's one: an ulp apart
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    before, state = snapshot(gated_params, gated)
    grads(gated_params, 9)  # nonzero: NaN gradients zeroed first (flat_grads.finite_), as the
    for param in gated_params:  # trainer does, and the step then changes nothing
        param.grad[0] = float("nan")
        param.grad.nan_to_num_(nan=0.0)
    gated.step(found_inf=torch.ones(()))
    after, state_after = snapshot(gated_params, gated)
    assert all(torch.equal(a, b) for a, b in zip(after, before, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(state_after, state, strict=True))
    assert gated.muon.found_inf is None  # not left behind
    assert getattr(gated.adamw, "found_inf", None) is None
