"""LM memory model and FLOP count, from config numbers only."""

from __future__ import annotations

import pytest

from hotstep_ray.core.errors import InputError
from hotstep_ray.training import lm_vram
from hotstep_ray.training.lm_vram import GIB, LmDims

# acestep15.md §2.8, vocab 217,204, tied embeddings.
CONFIGS = {
    "0.6B": {"hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16,
             "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 3072},
    "1.7B": {"hidden_size": 2048, "num_hidden_layers": 28, "num_attention_heads": 16,
             "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 6144},
    "4B": {"hidden_size": 2560, "num_hidden_layers": 36, "num_attention_heads": 32,
           "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 9728},
}  # fmt: skip
# shared/reference/lm-vae-baseline.md: model TFLOP per step at N = 1700, LoRA r16, loss on all.
BASELINE_TFLOP = {"0.6B": 5.605, "1.7B": 13.781, "4B": 31.383}


def dims(size: str) -> LmDims:
    return LmDims.from_config({**CONFIGS[size], "vocab_size": 217204, "tie_word_embeddings": True})


@pytest.mark.parametrize("size", sorted(CONFIGS))
def test_flops_match_the_baseline_formula_and_the_size_comes_from_the_shape(size):
    flops = lm_vram.train_flops(dims(size), [1700], lora_rank=16)
    # the baseline is rounded to 3 decimals: half a unit, 5e-4 (Python arithmetic otherwise)
    assert flops["model_flops"] / 1e12 == pytest.approx(BASELINE_TFLOP[size], abs=5e-4)
    assert dims(size).size_label == size
    # checkpointing adds one forward of the layers it recomputes to the hardware count only
    ckpt = lm_vram.train_flops(dims(size), [1700], checkpointed_layers=dims(size).layers)
    assert ckpt["model_flops"] == flops["model_flops"] < ckpt["hardware_flops"]


def test_packing_counts_attention_per_song():
    one = lm_vram.train_flops(dims("4B"), [3400])
    two = lm_vram.train_flops(dims("4B"), [1700, 1700])
    assert two["model_flops"] < one["model_flops"] and two["tokens"] == one["tokens"]


def test_memory_grows_with_tokens_and_falls_with_checkpointing():
    d = dims("4B")
    n = lm_vram.adapter_params(d, "lora", 16)
    assert n == 16 * 36 * (2560 + 4096 + 2 * (2560 + 1024) + 4096 + 2560 + 3 * (2560 + 9728))
    estimates = [lm_vram.estimate_vram(d, t, adapter_parameters=n) for t in (1000, 2000, 4000)]
    assert estimates[0].total < estimates[1].total < estimates[2].total
    by_ckpt = [lm_vram.estimate_vram(d, 1700, checkpointed_layers=c).total for c in (0, 10, 36)]
    assert by_ckpt[0] > by_ckpt[1] > by_ckpt[2]
    # weights alone: 4.19 B bf16 parameters, rounded to 3 digits: within half a unit (5e6)
    assert estimates[0].weights == d.params * 2 and d.params == pytest.approx(4.19e9, abs=5e6)


def test_fit_picks_the_fewest_checkpointed_layers_that_fit():
    d = dims("4B")
    free = lm_vram.estimate_vram(d, 1700)
    assert lm_vram.fit_checkpointing(d, free.total, 1700).checkpointed_layers == 0
    tight = lm_vram.estimate_vram(d, 1700, checkpointed_layers=20).total
    chosen = lm_vram.fit_checkpointing(d, tight, 1700)
    assert chosen.checkpointed_layers == 20 and chosen.total <= tight
    with pytest.raises(InputError, match="checkpointed"):
        lm_vram.fit_checkpointing(d, 8 * GIB, 1700)  # the bf16 weights alone are 7.8 GiB
    most = lm_vram.max_tokens(d, 16 * GIB, cap=100_000)
    full = d.layers
    assert lm_vram.estimate_vram(d, most, checkpointed_layers=full).total <= 16 * GIB
    assert lm_vram.estimate_vram(d, most + 1, checkpointed_layers=full).total > 16 * GIB


def test_lokr_parameter_count_follows_the_factor_shapes():
    d = dims("0.6B")
    count = lm_vram.adapter_params(d, "lokr", rank=128, factor=6, decompose_both=True)
    # q_proj 1024 -> 2048: w1 [4, 4] full; w2 [512, 256] low-rank at dim 128 (128 < 512/2)
    q = 4 * 4 + 128 * (512 + 256)
    assert count > q * d.layers
