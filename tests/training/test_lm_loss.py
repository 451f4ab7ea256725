"""The chunked head equals plain CE; packed and bucketed batches equal one-song-at-a-time."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from hotstep_ray.training import adapters, lm_data, lm_loss
from hotstep_ray.training.adapters import AdapterSpec

VOCAB = 96


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The tiny models gain nothing from intra-op threads, and on a busy 2-core box idle threads
    spin-waiting for each other cost more than the work: run these tests on one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _tiny_qwen3(seed: int = 0) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        tie_word_embeddings=True,
    )
    config._attn_implementation = "sdpa"
    return Qwen3ForCausalLM(config).float()


def _examples(lengths: list[int], seed: int = 1) -> list[lm_data.LmExample]:
    generator = torch.Generator().manual_seed(seed)
    out = []
    for i, n in enumerate(lengths):
        ids = torch.randint(0, VOCAB, (n,), generator=generator).tolist()
        out.append(
            lm_data.LmExample(f"s{i}", tuple(ids), loss_start=n // 3, loss_end=n - 1, n_codes=0)
        )
    return out


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
def test_chunked_cross_entropy_equals_plain_in_value_and_gradient(chunk):
    # float64 so "equal" means equal: only summation order differs.
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(VOCAB, 16, generator=generator, dtype=torch.float64)
    targets = torch.randint(0, VOCAB, (53,), generator=generator)
    weights = torch.rand(53, generator=generator, dtype=torch.float64)
    hidden = torch.randn(53, 16, generator=generator, dtype=torch.float64, requires_grad=True)
    plain = lm_loss.plain_cross_entropy(hidden, weight, targets, weights)
    (grad_plain,) = torch.autograd.grad(plain * 3.0, hidden)
    chunked = lm_loss.chunked_cross_entropy(hidden, weight, targets, weights, chunk=chunk)
    (grad_chunked,) = torch.autograd.grad(chunked * 3.0, hidden)
    # float64 (2^-52 ~ 2.2e-16): 53 weighted log-softmaxes over 96 logits summed in chunks, ~1e-15
    # relative in any order; rel 1e-12 and rtol 1e-10 (atol for near-zero entries) are far above
    assert chunked.item() == pytest.approx(plain.item(), rel=1e-12)
    torch.testing.assert_close(grad_chunked, grad_plain, rtol=1e-10, atol=1e-12)
    # A trainable head takes the checkpointed path: same value, same gradients for both inputs.
    head = weight.clone().requires_grad_(True)
    loss = lm_loss.chunked_cross_entropy(hidden, head, targets, weights, chunk=chunk)
    grads = torch.autograd.grad(loss, (hidden, head))
    expected = torch.autograd.grad(
        lm_loss.plain_cross_entropy(hidden, head, targets, weights), (hidden, head)
    )
    assert loss.item() == pytest.approx(plain.item(), rel=1e-12)  # float64, as above
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)  # float64, as above


def _loss_and_grads(module, model, examples, groups):
    model.zero_grad(set_to_none=True)
    total = torch.zeros(())
    for group in groups:
        batch = lm_data.collate(examples, group, pad_id=0, pad_multiple=8)
        loss = lm_loss.batch_loss(module, batch)
        loss.backward()
        total += loss.detach()
    grads = {k: p.grad.clone() for k, p in adapters.trainable_parameters(model)}
    return total, grads


@pytest.mark.parametrize("attention", ["sdpa", "varlen"])
def test_packing_and_bucketing_give_the_loss_and_gradients_of_unpacked_songs(attention):
    model = adapters.inject(
        _tiny_qwen3(), AdapterSpec(kind="lora", rank=4, alpha=8, targets=_targets())
    )
    with torch.no_grad():  # a non-zero ΔW so the adapter shapes the loss
        for param in adapters.adapter_parameters(model).values():
            param.normal_(0, 0.1)
    lm_loss.set_attention(model, attention)
    module = lm_loss.LmLossModule(model, chunk=16)
    examples = _examples([21, 9, 30, 14, 17])
    lengths = [e.length for e in examples]
    single, single_grads = _loss_and_grads(
        module, model, examples, lm_data.plan_groups(lengths, "single")
    )
    for groups in (
        lm_data.plan_groups(lengths, "pack", pack_tokens=40),
        lm_data.plan_groups(lengths, "bucket", batch=2),
    ):
        assert any(len(row) > 1 or len(g) > 1 for g in groups for row in g)
        total, grads = _loss_and_grads(module, model, examples, groups)
        # float32: packed/padded rows run other GEMM and attention shapes, so every reduction
        # rounds differently: a few ulp per op through 2 layers, ~1e-7 of the loss (rel 1e-5);
        # the LoRA gradients sum many cancelling terms (rtol 1e-4, atol near zero)
        assert total.item() == pytest.approx(single.item(), rel=1e-5)
        for key, grad in grads.items():
            torch.testing.assert_close(grad, single_grads[key], rtol=1e-4, atol=1e-6)
    # ...and all of them equal the model's own forward with full logits, one song at a time.
    packed = lm_data.collate(examples, ((0, 1, 2),))
    with torch.no_grad():
        expected = lm_loss.reference_loss(model, packed)
        got = lm_loss.batch_loss(module, packed)
    assert got.item() == pytest.approx(expected.item(), rel=1e-5)  # float32 orders, as above


def test_layer_checkpointing_changes_nothing_but_memory():
    model = adapters.inject(_tiny_qwen3(), AdapterSpec(kind="lora", rank=4, targets=_targets()))
    with torch.no_grad():
        for param in adapters.adapter_parameters(model).values():
            param.normal_(0, 0.1)
    model.train()
    module = lm_loss.LmLossModule(model)
    examples = _examples([12, 19])
    groups = lm_data.plan_groups([e.length for e in examples], "pack", pack_tokens=40)
    plain, plain_grads = _loss_and_grads(module, model, examples, groups)
    lm_loss.set_layer_checkpointing(model.model.layers, 2)
    assert all(layer.gradient_checkpointing for layer in model.model.layers)
    again, grads = _loss_and_grads(module, model, examples, groups)
    # the checkpoint recomputes the same forward with the same kernels in this process: equal
    # up to slack (rel 1e-6 ~ 8 ulp; float32 defaults)
    assert again.item() == pytest.approx(plain.item(), rel=1e-6)
    for key, grad in grads.items():
        torch.testing.assert_close(grad, plain_grads[key])


def _targets() -> tuple[str, ...]:
    return adapters.LM_ATTENTION_TARGETS + adapters.MLP_TARGETS
