"""Full-size ACE-Step 1.5 configs: parameter counts on the meta device against the fact sheet
(shared/reference/acestep15.md §2.3, §2.4) and the peer baselines, the config -> diffusers kwargs
mapping at full size, and the random builds matching what the loaders return (tiny sizes)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from hotstep_ray.models import full_configs as fc
from hotstep_ray.models.acestep_dit import MODEL_CLASSES, build_component, load_acestep_dit
from hotstep_ray.models.acestep_keys import (
    AUDIO_TOKENIZER,
    COMPONENTS,
    CONDITION_ENCODER,
    DETOKENIZER,
    TRANSFORMER,
    diffusers_kwargs,
    dit_variant,
)
from hotstep_ray.models.acestep_wrappers import PaddedKeyAttnProcessor
from hotstep_ray.models.tiny_dit import tiny_config, write_tiny_dit

# Printed precision of each fact-sheet number: half a unit of its last digit (millions).
_TOLERANCE_M = {"per_layer": 0.05, "text_projector": 0.05, "total": 5.0}


@pytest.fixture(scope="module")
def counts() -> dict[str, dict[str, int]]:
    return {layout: fc.dit_param_counts(fc.dit_config(layout)) for layout in ("2b", "xl")}


@pytest.mark.parametrize("layout", ["2b", "xl"])
def test_dit_counts_match_fact_sheet(counts, layout: str) -> None:
    for name, documented in fc.DOCUMENTED_DIT_PARAMS_M[layout].items():
        tolerance = _TOLERANCE_M.get(name, 0.5)
        assert abs(counts[layout][name] / 1e6 - documented) <= tolerance, name


def test_dit_totals_match_measured_peer_counts(counts) -> None:
    # dit-peer-baseline.md: PEFT's count of the whole official model, 2.394 B and 4.987 B.
    assert round(counts["2b"]["total"] / 1e9, 3) == 2.394
    assert round(counts["xl"]["total"] / 1e9, 3) == 4.987
    # The encoder side is identical: XL widens only the DiT (§2.2).
    for component in (CONDITION_ENCODER, AUDIO_TOKENIZER, DETOKENIZER):
        assert counts["2b"][component] == counts["xl"][component]


@pytest.mark.parametrize(
    ("layout", "q", "kv", "o", "gate", "down", "modules", "lora_r64"),
    [
        # §2.4 shapes [out, in]; LoRA r64 on self+cross q/k/v/o: §2.3 and dit-peer-baseline (b).
        ("2b", (2048, 2048), (1024, 2048), (2048, 2048), (6144, 2048), (2048, 6144), 192, 44040192),
        ("xl", (4096, 2560), (1024, 2560), (2560, 4096), (9728, 2560), (2560, 9728), 256, 83886080),
    ],
)
def test_projection_shapes_and_lora_size(layout, q, kv, o, gate, down, modules, lora_r64) -> None:
    kwargs = diffusers_kwargs(fc.dit_config(layout))
    dit = build_component(TRANSFORMER, kwargs[TRANSFORMER])
    layer = dit.layers[0]
    for attn in (layer.self_attn, layer.cross_attn):
        assert tuple(attn.to_q.weight.shape) == q
        assert tuple(attn.to_k.weight.shape) == kv
        assert tuple(attn.to_v.weight.shape) == kv
        assert tuple(attn.to_out[0].weight.shape) == o
    assert tuple(layer.mlp.gate_proj.weight.shape) == gate
    assert tuple(layer.mlp.up_proj.weight.shape) == gate
    assert tuple(layer.mlp.down_proj.weight.shape) == down
    targets = [
        module
        for name, module in dit.named_modules()
        if name.rsplit(".", 1)[-1] in ("to_q", "to_k", "to_v") or name.endswith("to_out.0")
    ]
    assert len(targets) == modules
    assert sum(64 * (m.in_features + m.out_features) for m in targets) == lora_r64


def test_config_mapping_2b() -> None:
    config = fc.dit_config("2b")
    kwargs = diffusers_kwargs(config)
    dit = kwargs[TRANSFORMER]
    assert dit_variant(config) == ("turbo", "2b")
    assert (dit["hidden_size"], dit["num_hidden_layers"], dit["intermediate_size"]) == (
        2048,
        24,
        6144,
    )
    assert (dit["num_attention_heads"], dit["num_key_value_heads"], dit["head_dim"]) == (16, 8, 128)
    assert (dit["in_channels"], dit["patch_size"], dit["audio_acoustic_hidden_dim"]) == (192, 2, 64)
    assert dit["encoder_hidden_size"] == 2048 and dit["is_turbo"] is True
    assert dit["sliding_window"] == 128 and dit["rope_theta"] == 1_000_000
    # Layers 0, 2, 4, ... slide; the encoders take the first 8 / 2 entries of the same list.
    assert dit["layer_types"][:4] == ["sliding_attention", "full_attention"] * 2
    assert kwargs[CONDITION_ENCODER]["layer_types"] == dit["layer_types"][:8]
    assert kwargs[CONDITION_ENCODER]["text_hidden_dim"] == 1024
    assert kwargs[AUDIO_TOKENIZER]["fsq_input_levels"] == [8, 8, 8, 5, 5, 5]
    assert kwargs[AUDIO_TOKENIZER]["pool_window_size"] == 5
    assert math.prod(kwargs[AUDIO_TOKENIZER]["fsq_input_levels"]) == 64000
    # The flash-attention window rule keeps |i - j| <= w - 1 (acestep_wrappers).
    assert diffusers_kwargs(config, sliding_window=127)[DETOKENIZER]["sliding_window"] == 127


def test_config_mapping_xl_keeps_2b_encoders() -> None:
    config = fc.dit_config("xl")
    kwargs = diffusers_kwargs(config)
    assert dit_variant(config) == ("turbo", "xl")
    dit = kwargs[TRANSFORMER]
    assert (dit["hidden_size"], dit["num_hidden_layers"], dit["intermediate_size"]) == (
        2560,
        32,
        9728,
    )
    assert (dit["num_attention_heads"], dit["num_key_value_heads"]) == (32, 8)
    assert dit["encoder_hidden_size"] == 2048  # condition_embedder: Linear 2048 -> 2560
    for component in (CONDITION_ENCODER, AUDIO_TOKENIZER, DETOKENIZER):
        side = kwargs[component]
        assert (side["hidden_size"], side["intermediate_size"]) == (2048, 6144), component
        assert (side["num_attention_heads"], side["num_key_value_heads"]) == (16, 8), component
    assert kwargs[AUDIO_TOKENIZER]["fsq_dim"] == 2048
    condition_embedder = build_component(TRANSFORMER, dit).condition_embedder
    assert (condition_embedder.in_features, condition_embedder.out_features) == (2048, 2560)


def test_dit_config_is_a_copy() -> None:
    config = fc.dit_config("2b")
    config["hidden_size"] = 1
    assert fc.dit_config("2b")["hidden_size"] == 2048
    with pytest.raises(ValueError, match="layout"):
        fc.dit_config("3b")


def _qwen3_params(config: dict) -> int:
    """Closed form from the §2.6/§2.8 table: tied embedding once, q/k/v/o, q/k norms, SwiGLU,
    two RMSNorms per layer, final norm."""
    h, i, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    dq = config["num_attention_heads"] * config["head_dim"]
    dkv = config["num_key_value_heads"] * config["head_dim"]
    per_layer = h * dq + 2 * h * dkv + dq * h + 2 * config["head_dim"] + 3 * h * i + 2 * h
    return config["vocab_size"] * h + layers * per_layer + h


def test_qwen_counts() -> None:
    encoder = fc.meta_param_count("text_encoder")
    assert encoder == _qwen3_params(fc.TEXT_ENCODER_CONFIG)
    assert round(encoder / 1e9, 1) == 0.6  # "Qwen3-Embedding-0.6B"
    expected = {"0.6B": 662884352, "1.7B": 1854243840, "4B": 4189554176}
    for size, config in fc.LM_CONFIGS.items():
        assert config["vocab_size"] == 217204
        assert fc.meta_param_count("lm", config) == _qwen3_params(config) == expected[size]
    assert fc.LM_CONFIGS["4B"]["num_hidden_layers"] == 36


def test_vae_count_and_hop() -> None:
    # lm-vae-baseline.md measured 168.7 M (acestep15 §2.7's "≈160 M" is read off a GGUF size).
    assert fc.meta_param_count("vae") == 168695426
    assert math.prod(fc.VAE_CONFIG["downsampling_ratios"]) == 1920  # 48000 / 1920 = 25 Hz
    with pytest.raises(ValueError, match="unknown kind"):
        fc.meta_param_count("lm")


# --------------------------------------------------------------------------- builds (tiny)


@pytest.mark.parametrize("variant", ["turbo", "xl-turbo"])
def test_build_dit_matches_loader(tmp_path: Path, variant: str) -> None:
    """A random build is what the loader returns for a real folder of the same config."""
    config = tiny_config(variant)
    loaded = load_acestep_dit(write_tiny_dit(tmp_path / variant, variant), "cpu", torch.float32)
    built = fc.build_dit(config, "cpu", "bf16", silence_frames=200)
    assert built.variant.name == loaded.variant.name == variant
    assert built.dtype == torch.bfloat16
    for component in COMPONENTS:
        ours, theirs = getattr(built, component), getattr(loaded, component)
        assert type(ours) is MODEL_CLASSES[component] is type(theirs)
        assert dict(ours.config) == dict(theirs.config), component
        ours_state, theirs_state = ours.state_dict(), theirs.state_dict()
        assert ours_state.keys() == theirs_state.keys(), component
        for key, value in ours_state.items():
            assert value.shape == theirs_state[key].shape, key
            assert not value.is_meta and torch.isfinite(value.float()).all(), key
        assert not any(p.requires_grad for p in ours.parameters())
        assert not ours.training
    # The loader's finishing steps ran: padded-key processors, the XL timbre token.
    processors = built.transformer.attn_processors.values()
    assert all(isinstance(p, PaddedKeyAttnProcessor) for p in processors)
    timbre = built.condition_encoder.timbre_encoder
    assert getattr(timbre, "prepends_special_token", False) == variant.startswith("xl-")
    # FSQ buffers are rebuilt, not random: same as the loader's.
    assert torch.equal(
        built.audio_tokenizer.quantizer._levels, loaded.audio_tokenizer.quantizer._levels
    )


def _tiny_qwen(config: dict) -> dict:
    return {
        **config,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "max_window_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 16,
    }


def test_build_qwen_and_vae_tiny() -> None:
    lm = fc.build_lm(_tiny_qwen(fc.LM_CONFIGS["0.6B"]), "cpu", torch.float32)
    assert lm.lm_head.weight is lm.model.embed_tokens.weight  # tied, as load_lm ties it
    ids = torch.tensor([[1, 2, 217203]])
    with torch.no_grad():
        logits = lm(input_ids=ids, use_cache=False).logits
    assert logits.shape == (1, 3, 217204) and torch.isfinite(logits).all()
    encoder = fc.build_text_encoder(_tiny_qwen(fc.TEXT_ENCODER_CONFIG), "cpu", torch.float32)
    with torch.no_grad():
        states = encoder(input_ids=ids[:, :2], use_cache=False).last_hidden_state
    assert states.shape == (1, 2, 32) and torch.isfinite(states).all()
    config = {
        **fc.VAE_CONFIG,
        "channel_multiples": [1, 1],
        "downsampling_ratios": [2, 2],
        "decoder_channels": 8,
    }
    vae = fc.build_vae(config, "cpu", torch.float32)
    # weight = g * v / |v| was recomputed from the random g, v (the loader's refresh step). With
    # g = |v| that is v times a float32 ratio of two norms (1 +- a few eps): far inside the
    # tolerance, while an unrefreshed weight is off by the weights' own size (~1/sqrt(fan_in)).
    first = vae.decoder.conv1
    assert torch.allclose(first.weight, first.weight_v, atol=1e-5)
    leftovers = [
        name
        for model in (lm, encoder, vae)
        for name, t in [*model.named_parameters(), *model.named_buffers()]
        if t.is_meta
    ]
    assert leftovers == []
