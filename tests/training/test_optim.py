"""Hybrid Muon: the per-parameter split, the update against a float64 reference, and the LR."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from hotstep_ray.training import adapters, optim
from hotstep_ray.training.adapters import AdapterSpec
from hotstep_ray.training.schedule import LrSchedule

NS = (3.4445, -4.7750, 2.0315)


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
    shapes, scales = [(24, 40), (48, 20), (32, 32)], [8.0, 1.0, 0.125]  # per-slab norms differ
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
            error = ((got.double() - before) - (want - before)).abs().max().item()
            assert error < 1e-4, error
            before = want


def test_orthogonalised_update_is_semi_orthogonal():
    grad = torch.randn(32, 48, generator=torch.Generator().manual_seed(1))
    ortho = optim.newton_schulz(grad, NS, 5, 1e-7)
    singular = torch.linalg.svdvals(ortho.double())
    assert singular.min() > 0.5 and singular.max() < 1.5


def test_bfloat16_mode_reproduces_torch_muon_bit_for_bit():
    generator = torch.Generator().manual_seed(2)
    init = torch.randn(24, 40, generator=generator)
    grads = [torch.randn(24, 40, generator=generator) for _ in range(3)]
    ours = torch.nn.Parameter(init.clone())
    theirs = torch.nn.Parameter(init.clone())
    opt_ours = optim.Muon([ours], lr=0.02, ns_dtype=torch.bfloat16)
    opt_theirs = torch.optim.Muon([theirs], lr=0.02)
    for grad in grads:
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        opt_ours.step()
        opt_theirs.step()
    assert torch.equal(ours, theirs)
    # ...and that is why float32 is our default: torch's bf16 iteration misses the 1e-4 bar.
    exact = optim.newton_schulz(grads[0].double(), NS, 5, 1e-7, torch.float64)
    bf16 = optim.newton_schulz(grads[0], NS, 5, 1e-7, torch.bfloat16)
    f32 = optim.newton_schulz(grads[0], NS, 5, 1e-7, torch.float32)
    assert (bf16.double() - exact).abs().max() > 1e-3 > 1e-5 > (f32.double() - exact).abs().max()
    assert opt_ours.state_dict()["state"][0].keys() == opt_theirs.state_dict()["state"][0].keys()


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
    assert muon_group["base_lr"] == pytest.approx(0.04) and adamw_group["base_lr"] == 2e-3
    # Decoupled decay per step lr·wd is AdamW's in both optimizers.
    assert muon_group["lr"] * muon_group["weight_decay"] == pytest.approx(2e-3 * 1e-3)
    assert muon_group["adjust_lr_fn"] == "original"
    schedule = LrSchedule(total_steps=101, warmup_steps=10)
    assert schedule.apply(opt, 5) == pytest.approx(0.5)
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
