"""Adapted DiT blocks compile to one graph: a graph break per adapted Linear (peft's LoKr
module-dropout coin) made the compiled LoKR step host-bound on the GPU (~20 graphs per block)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from test_dit_support import single_thread_fixture  # noqa: F401  (fixtures)

from hotstep_ray.models.acestep_dit import load_acestep_dit
from hotstep_ray.models.acestep_ops import TrainBatch
from hotstep_ray.training import adapters, dit_loss
from hotstep_ray.training.speed import SpeedOptions

pytestmark = pytest.mark.slow  # Inductor compiles every case from scratch
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "acestep15-tiny" / "checkpoint"
# id -> (adapter kind, SpeedOptions.kron_mix, .kron_forward): the CPU's and CUDA's factored defaults ("auto":
# gemm / ordered), and the merged forward. The pointwise mixes share KronMix, whose values and
# gradients test_adapters checks for every mode.
CASES = {
    "lora": ("lora", "gemm", "factored"),
    "lokr-gemm": ("lokr", "gemm", "factored"),
    "lokr-ordered": ("lokr", "ordered", "factored"),
    "lokr-merged": ("lokr", "ordered", "merged"),
}


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def block_and_inputs(kind: str, speed: SpeedOptions) -> tuple[torch.nn.Module, dict]:
    """Block 0 of the tiny DiT with a non-zero adapter, in training mode, and the keyword inputs
    the trainer's forward gives it (hidden `[2, 8, 64]`, condition `[2, 6, 64]`, rotary tuple,
    key masks set for a padded row), caught with a pre-hook on one eager loss call."""
    models = load_acestep_dit(FIXTURE, device="cpu", dtype=torch.float32)
    # factor 2: w1 [2, 2], so KronMix's unrolled 2x2 mix keeps the pointwise trace short
    spec = adapters.AdapterSpec(kind=kind, rank=4, alpha=8, factor=2)
    adapters.inject(models.transformer, spec, speed)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():  # LoRA B and LoKR w2 start at zero: make every factor's gradient live
        for param in adapters.adapter_parameters(models.transformer).values():
            param.copy_(0.05 * torch.randn(param.shape, generator=generator))
    models.transformer.train()  # peft's training-only branches are the ones that broke graphs
    frames, tokens = torch.ones(2, 16, dtype=torch.bool), torch.ones(2, 6, dtype=torch.bool)
    frames[0, 12:], tokens[0, 4:] = False, False
    batch = TrainBatch(
        target_latents=torch.randn(2, 16, 64, generator=generator),
        encoder_hidden_states=torch.randn(2, 6, 64, generator=generator),
        context_latents=torch.randn(2, 16, 128, generator=generator),
        latent_mask=frames,
        encoder_attention_mask=tokens,
    )
    block = models.transformer.layers[0]
    seen: dict = {}
    hook = block.register_forward_pre_hook(
        lambda _, args, kwargs: seen.update(kwargs), with_kwargs=True
    )
    with torch.no_grad():  # also leaves the key masks set for the block calls below
        noise = torch.randn(2, 16, 64, generator=generator)
        dit_loss.flow_matching_loss(models, batch, torch.tensor([0.3, 0.7]), noise, ~tokens[:, 0])
    hook.remove()
    return block, seen


def loss_and_grads(
    call, block: torch.nn.Module, inputs: dict
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A fixed random projection of `call(**inputs)` and its gradients: adapter + input."""
    hidden = inputs["hidden_states"].detach().requires_grad_(True)
    out = call(**{**inputs, "hidden_states": hidden})
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(11))
    loss = (out * probe).mean()
    loss.backward()
    grads = {key: p.grad for key, p in block.named_parameters() if p.requires_grad}
    grads["hidden_states"] = hidden.grad
    block.zero_grad(set_to_none=True)
    return loss.detach(), grads


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_adapted_block_is_one_graph_with_the_eager_gradients(
    case: str, single_thread, monkeypatch, record_merged
) -> None:
    kind, mix, forward = CASES[case]
    # min tokens 1: the block holds 12-16 tokens
    speed = SpeedOptions(kron_mix=mix, kron_forward=forward, kron_merged_min_tokens=1)
    block, inputs = block_and_inputs(kind, speed)
    if forward == "merged":  # the merged Linear really runs in this block (checked eagerly)
        with record_merged() as seen, torch.no_grad():
            block(**inputs)
        assert len(seen) >= 4, seen  # at least the attention projections

    explained = torch._dynamo.explain(block)(**inputs)
    reasons = [reason.reason for reason in explained.break_reasons]
    assert explained.graph_break_count == 0, reasons
    assert explained.graph_count == 1

    torch._dynamo.reset()
    eager_loss, eager_grads = loss_and_grads(block, block, inputs)
    # aot_eager: dynamo + AOTAutograd (the custom backward of KronMix included) without
    # Inductor, whose CPU vectorised kernels give wrong gradients here (see dit.compile_mode).
    compiled = torch.compile(block, backend="aot_eager", dynamic=False, fullgraph=True)
    loss, grads = loss_and_grads(compiled, block, inputs)
    # aot_eager runs the eager aten kernels in this process; only the traced backward may sum a
    # gradient's contributions in another order: a few ulp, far inside rel 1e-5 (~80 ulp)
    assert loss.item() == pytest.approx(eager_loss.item(), rel=1e-5)
    assert grads.keys() == eager_grads.keys() and len(grads) > 1
    for key, eager in eager_grads.items():
        assert eager.abs().sum() > 0, key
        # atol 1e-7: reordering sums of |grad| <= 2e-2 moves an element by ~1e-9, even near 0
        torch.testing.assert_close(grads[key], eager, rtol=1e-5, atol=1e-7, msg=key)


def test_a_lokr_block_carries_no_more_guards_than_a_lora_block() -> None:
    """Dynamo evaluates a compiled block's guards on every call: on the H200 at batch 1 on short
    crops that host time is not hidden by the GPU (docs/BENCHMARKS.md, fourteenth run). peft's
    `_available_adapters` reads all seven LoKR parameter dicts of every Linear, guarding each
    (1720 guards against LoRA's 1446 for this block, 55 on the never-used `lokr_t2`)."""
    speed = SpeedOptions(kron_mix="ordered")  # CUDA's factored path
    counts = {}
    for kind in ("lora", "lokr"):
        torch._dynamo.reset()
        block, inputs = block_and_inputs(kind, speed)
        guards = torch._dynamo.explain(block)(**inputs).out_guards
        counts[kind] = len(guards)
        assert not [g.name for g in guards if "lokr_t2" in g.name or "lokr_w1_b" in g.name]
    assert counts["lokr"] <= counts["lora"], counts
