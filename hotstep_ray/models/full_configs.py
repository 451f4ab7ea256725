"""Full-size ACE-Step 1.5 configs as data, and random-initialised builds of every component.

The dicts below are the official `config.json` contents (DiT: `AceStepConfig`; Qwen3: the
transformers Qwen3 config; VAE: the diffusers `AutoencoderOobleck` config) with the numbers of
the ACE-Step 1.5 fact sheet (shared/reference/acestep15.md §2.1, §2.2, §2.6-2.8). The real files
were not read (no HF access): keys the fact sheet does not give (`max_position_embeddings` of
the Qwen models, token ids) are the released Qwen3 values and change no parameter shape.

`build_*` construct a component exactly as the loaders in `acestep_dit` / `text_models` do for
a real checkpoint (same config mapping, same classes and kwargs, parameters on the meta device
then assigned in the target dtype, the same finishing steps: XL timbre token, padded-key
attention processor, weight-norm refresh, rotary buffers, eval mode) but fill the weights with
seeded random values instead of reading files. Nothing here writes a file (a 2B folder is
4.8 GB in bf16; `random_tree`, behind `models make-random`, saves these builds as a checkpoint
tree); the official key names are still round-tripped through `acestep_keys` and checked by the
loader's own `_check_keys`, so a key or shape the mapping gets wrong at full size fails here as
it would on a real file.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from diffusers import AutoencoderOobleck
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3Model

from hotstep_ray.models import acestep_dit, text_models
from hotstep_ray.models.acestep_dit import AceStepModels, VariantInfo
from hotstep_ray.models.acestep_keys import (
    COMPONENTS,
    CONDITION_ENCODER,
    diffusers_kwargs,
    diffusers_to_official_key,
    dit_variant,
    official_to_diffusers_key,
)
from hotstep_ray.models.acestep_wrappers import sliding_window_for_rule
from hotstep_ray.models.errors import CheckpointError

# --------------------------------------------------------------------------- DiT configs


def _layer_types(count: int) -> list[str]:
    # AceStepConfig's default rule (§2.1): layer i is sliding when (i + 1) is odd.
    return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(count)]


def _dit_config(variant: str, **sizes: Any) -> dict[str, Any]:
    layers = sizes["num_hidden_layers"]
    return {
        "architectures": ["AceStepConditionGenerationModel"],
        "auto_map": {
            "AutoConfig": "configuration_acestep_v15.AceStepConfig",
            "AutoModel": (
                f"modeling_acestep_v15_{variant.replace('-', '_')}.AceStepConditionGenerationModel"
            ),
        },
        "model_type": "acestep",
        "model_version": variant.removeprefix("xl-"),
        "is_turbo": variant.endswith("turbo"),
        "dtype": "bfloat16",
        **sizes,
        "num_audio_decoder_hidden_layers": layers,
        "head_dim": 128,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        "rope_scaling": None,
        "max_position_embeddings": 32768,
        "use_sliding_window": True,
        "sliding_window": 128,
        "layer_types": _layer_types(layers),
        "in_channels": 192,  # 64 noisy x_t + 64 source latents + 64 chunk mask
        "audio_acoustic_hidden_dim": 64,
        "patch_size": 2,
        "pool_window_size": 5,  # 25 Hz -> 5 Hz
        "text_hidden_dim": 1024,  # Qwen3-Embedding-0.6B width
        "timbre_hidden_dim": 64,
        "timbre_fix_frame": 750,  # 30 s
        "num_lyric_encoder_hidden_layers": 8,
        "num_timbre_encoder_hidden_layers": 4,
        "num_attention_pooler_hidden_layers": 2,
        "fsq_dim": 2048,
        "fsq_input_levels": [8, 8, 8, 5, 5, 5],
        "fsq_input_num_quantizers": 1,
        "lyric_alignment_layers_config": None,
        "initializer_range": 0.02,
        "timestep_mu": -0.4,
        "timestep_sigma": 1.0,
        "data_proportion": 0.5,
        "vocab_size": 64003,  # legacy, unused by the DiT
        "tie_word_embeddings": True,
        "use_cache": True,
    }


# 2B (turbo/base/sft share every shape): §2.1.
DIT_2B_TURBO = _dit_config(
    "turbo",
    hidden_size=2048,
    intermediate_size=6144,
    num_hidden_layers=24,
    num_attention_heads=16,
    num_key_value_heads=8,
)
# XL: a 2560-wide, 32-layer DiT whose attention is 32 x 128 = 4096 wide, over encoders that keep
# the 2B widths (the `encoder_*` keys; their presence is what marks the XL layout): §2.2.
DIT_XL_TURBO = _dit_config(
    "xl-turbo",
    hidden_size=2560,
    intermediate_size=9728,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    encoder_hidden_size=2048,
    encoder_intermediate_size=6144,
    encoder_num_attention_heads=16,
    encoder_num_key_value_heads=8,
)
DIT_CONFIGS: dict[str, dict[str, Any]] = {"2b": DIT_2B_TURBO, "xl": DIT_XL_TURBO}

# --------------------------------------------------------------------------- VAE, Qwen3 configs

# §2.7: 48 kHz stereo <-> 64-d latents; 2*4*4*6*10 = 1920 samples per frame = 25 frames/s.
VAE_CONFIG: dict[str, Any] = {
    "_class_name": "AutoencoderOobleck",
    "audio_channels": 2,
    "sampling_rate": 48000,
    "encoder_hidden_size": 128,  # 2 x 64: the encoder emits a Gaussian mean and scale
    "channel_multiples": [1, 2, 4, 8, 16],
    "downsampling_ratios": [2, 4, 4, 6, 10],
    "decoder_channels": 128,
    "decoder_input_channels": 64,
}

TEXT_VOCAB = 151669  # Qwen3 tokenizer
LM_VOCAB = 217204  # = 151669 + 65535 audio-code tokens (§2.8)


def _qwen3(
    hidden: int, layers: int, heads: int, intermediate: int, vocab: int, architecture: str
) -> dict[str, Any]:
    return {
        "architectures": [architecture],
        "model_type": "qwen3",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        "rope_scaling": None,
        "max_position_embeddings": 40960,
        "max_window_layers": layers,
        "use_sliding_window": False,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "initializer_range": 0.02,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "torch_dtype": "bfloat16",
        "use_cache": True,
    }


# §2.6: Qwen3-Embedding-0.6B, a Qwen3Model (no LM head): 1024 wide, 28 layers, 16/8 heads.
TEXT_ENCODER_CONFIG = {
    **_qwen3(1024, 28, 16, 3072, TEXT_VOCAB, "Qwen3ForCausalLM"),
    "max_position_embeddings": 32768,
    "eos_token_id": 151643,
}
# §2.8: the 5 Hz LMs, Qwen3 causal LMs with the extended vocabulary and tied embeddings.
LM_CONFIGS: dict[str, dict[str, Any]] = {
    "0.6B": _qwen3(1024, 28, 16, 3072, LM_VOCAB, "Qwen3ForCausalLM"),
    "1.7B": _qwen3(2048, 28, 16, 6144, LM_VOCAB, "Qwen3ForCausalLM"),
    "4B": _qwen3(2560, 36, 32, 9728, LM_VOCAB, "Qwen3ForCausalLM"),
}

# §2.3, computed by the fact sheet from the shapes (millions, to its printed precision).
DOCUMENTED_DIT_PARAMS_M: dict[str, dict[str, float]] = {
    "2b": {
        "transformer": 1575,
        "condition_encoder": 608,
        "lyric_encoder": 405,
        "timbre_encoder": 201,
        "text_projector": 2.1,
        "audio_tokenizer": 105,
        "detokenizer": 105,
        "per_layer": 62.9,
        "total": 2390,  # "≈2.39 B"
    },
    "xl": {
        "transformer": 4169,
        "condition_encoder": 608,
        "audio_tokenizer": 105,
        "detokenizer": 105,
        "per_layer": 127.2,
        "total": 4990,  # "≈4.99 B"
    },
}


def dit_config(layout: str) -> dict[str, Any]:
    """A fresh copy of the 2B ("2b") or XL ("xl") turbo `config.json` dict."""
    if layout not in DIT_CONFIGS:
        raise ValueError(f"layout must be one of {sorted(DIT_CONFIGS)}, got {layout!r}")
    return copy.deepcopy(DIT_CONFIGS[layout])


# --------------------------------------------------------------------------- random weights

Rule = Callable[[str, tuple[int, ...], torch.Generator], torch.Tensor]


def _dit_rule(name: str, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """O(1) activations at any depth (the tiny fixtures' rules, `tiny_dit._init_`), except the
    adaLN tables, which take the official init randn / sqrt(H). Names are diffusers names."""
    randn = torch.randn(shape, generator=generator)
    if name.endswith(("special_token", "special_tokens", "null_condition_emb")):
        return randn
    if name.endswith("scale_shift_table"):  # [1, 6 or 2, H]
        return randn / shape[-1] ** 0.5
    if name.endswith(".bias"):
        return 0.1 * randn
    if len(shape) == 1:  # RMSNorm weights
        return 0.6 + 0.8 * torch.rand(shape, generator=generator)
    if "proj_in_conv" in name:  # Conv1d [out, in, k]
        return randn / (shape[1] * shape[2]) ** 0.5
    if "proj_out_conv" in name:  # ConvTranspose1d [in, out, k]
        return randn / shape[0] ** 0.5
    return randn / shape[-1] ** 0.5  # Linear [out, in]


def _qwen_rule(name: str, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Qwen's own init (as `tiny_tree`): N(0, 0.02) matrices and embeddings, unit RMSNorms."""
    if len(shape) == 1:
        return torch.ones(shape)
    return 0.02 * torch.randn(shape, generator=generator)


def _vae_rule(name: str, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """As `tiny_tree._vae_rule`: conv weights N(0, 1/fan_in), zero biases and log-scale snake
    params (alpha = beta = 1), the residual units' closing conv at gain 0.1 (else 15 residual
    branches compound to latents of std ~100). weight_g is set from weight_v afterwards."""
    if name.endswith(("bias", "alpha", "beta", "weight_g")):
        return torch.zeros(shape)
    gain = 0.1 if ".res_unit" in name and name.endswith("conv2.weight_v") else 1.0
    return gain * torch.randn(shape, generator=generator) / (shape[1] * shape[2]) ** 0.5


def _random_state(
    shapes: dict[str, tuple[int, ...]],
    rule: Rule,
    device: torch.device,
    dtype: torch.dtype,
    seed: int,
) -> dict[str, torch.Tensor]:
    """One tensor per name in sorted-name order from one generator on `device` (a 4B model
    drawn on the CPU takes tens of seconds; on the GPU, milliseconds). Drawn in float32 and
    cast, as the loaders cast checkpoint tensors."""
    generator = torch.Generator(device=device).manual_seed(seed)
    state = {}
    with torch.device(device):
        for name in sorted(shapes):
            state[name] = rule(name, shapes[name], generator).to(dtype).contiguous()
    return state


def _resolve(device: torch.device | str | None, dtype: torch.dtype | str | None):
    return acestep_dit.resolve_device_dtype(device, dtype)


# --------------------------------------------------------------------------- DiT


def build_dit(
    config: dict[str, Any],
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
    *,
    seed: int = 0,
    window_rule: str = "sdpa",
    silence_frames: int = 15000,
) -> AceStepModels:
    """The four DiT-checkpoint components of `config`, random, as `load_acestep_dit` returns
    them for an official folder. `silence_frames` sizes the random silence latent ([1, N, 64];
    the real file holds 15000 frames = 600 s)."""
    device, dtype = _resolve(device, dtype)
    window = int(config.get("sliding_window", 128))
    kwargs = diffusers_kwargs(
        config, sliding_window_for_rule(window, window_rule), source="full_configs"
    )
    parts: dict[str, torch.nn.Module] = {}
    for index, component in enumerate(COMPONENTS):
        model = acestep_dit.build_component(component, kwargs[component])
        optional = (acestep_dit.SILENCE_KEY,) if component == CONDITION_ENCODER else ()
        shapes = {
            key: tuple(value.shape)
            for key, value in model.state_dict().items()
            if key not in optional
        }
        # What a real file would hold: the official names, routed back as the loader routes
        # them, then the loader's own missing/unexpected/shape check.
        found: dict[str, tuple[str, tuple[int, ...]]] = {}
        for key, shape in shapes.items():
            official = diffusers_to_official_key(component, key)
            routed_component, ours = official_to_diffusers_key(official)
            if routed_component != component:
                raise CheckpointError(f"{official}: routed to {routed_component}, not {component}")
            found[ours] = (official, shape)
        acestep_dit.check_keys(model, found, component, "full_configs", optional)
        state = _random_state(
            {ours: shape for ours, (_, shape) in found.items()},
            _dit_rule,
            device,
            dtype,
            seed * 10 + index,
        )
        model.load_state_dict(state, strict=False, assign=True)
        still_meta = [name for name, param in model.named_parameters() if param.is_meta]
        if still_meta:
            raise CheckpointError(f"{component}: parameters left unset: {still_meta[:3]}")
        parts[component] = model
    # Silence: a smooth random walk, [1, 64, N] like silence_latent.pt, transposed as loaded.
    generator = torch.Generator().manual_seed(seed)
    walk = 0.05 * torch.randn(1, 64, silence_frames, generator=generator)
    silence = walk.cumsum(dim=-1).transpose(1, 2)
    kind, layout = dit_variant(config)
    variant = VariantInfo(kind, layout, "official", window_rule)
    return acestep_dit.finish_models(
        parts, silence, copy.deepcopy(config), variant, Path("random-init"), device, dtype
    )


def dit_param_counts(config: dict[str, Any]) -> dict[str, int]:
    """Parameters per component (and sub-module) on the meta device: no memory, < 1 s."""
    kwargs = diffusers_kwargs(config, source="full_configs")
    counts: dict[str, int] = {}
    for component in COMPONENTS:
        model = acestep_dit.build_component(component, kwargs[component])
        counts[component] = sum(param.numel() for param in model.parameters())
        if component == CONDITION_ENCODER:
            for child in ("text_projector", "lyric_encoder", "timbre_encoder"):
                module = getattr(model, child)
                counts[child] = sum(param.numel() for param in module.parameters())
        if component == "transformer":
            counts["per_layer"] = sum(param.numel() for param in model.layers[0].parameters())
    counts["total"] = sum(counts[component] for component in COMPONENTS)
    return counts


# --------------------------------------------------------------------------- Qwen3, VAE


def _qwen_config(raw: dict[str, Any]) -> Qwen3Config:
    # Same steps as `text_models._qwen3_config` after reading the file.
    if raw.get("model_type") != "qwen3":
        raise CheckpointError(f"model_type {raw.get('model_type')!r}, expected 'qwen3'")
    config = Qwen3Config.from_dict(copy.deepcopy(raw))
    config._attn_implementation = "sdpa"
    return config


def build_text_encoder(
    config: dict[str, Any] | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
    *,
    seed: int = 0,
) -> Qwen3Model:
    """Qwen3-Embedding-0.6B as `text_models.load_text_encoder` builds it, random weights."""
    device, dtype = _resolve(device, dtype)
    with torch.device("meta"):
        model = Qwen3Model(_qwen_config(config or TEXT_ENCODER_CONFIG))
    shapes = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    model.load_state_dict(
        _random_state(shapes, _qwen_rule, device, dtype, seed), strict=True, assign=True
    )
    return text_models.finish_model(model, device)


def build_lm(
    config: dict[str, Any],
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
    *,
    seed: int = 0,
) -> Qwen3ForCausalLM:
    """A 5 Hz LM as `text_models.load_lm` builds it (tied lm_head), random weights."""
    device, dtype = _resolve(device, dtype)
    qwen_config = _qwen_config(config)
    tied = bool(qwen_config.tie_word_embeddings)
    with torch.device("meta"):
        model = Qwen3ForCausalLM(qwen_config)
    shapes = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    if tied:
        shapes.pop("lm_head.weight", None)
    state = _random_state(shapes, _qwen_rule, device, dtype, seed)
    model.load_state_dict(state, strict=False, assign=True)
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    return text_models.finish_model(model, device)


def build_vae(
    config: dict[str, Any] | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
    *,
    seed: int = 0,
) -> AutoencoderOobleck:
    """The Oobleck VAE as `text_models.load_vae` builds it, random weights."""
    device, dtype = _resolve(device, dtype)
    with torch.device("meta"):
        model = AutoencoderOobleck.from_config(copy.deepcopy(config or VAE_CONFIG))
    shapes = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    state = _random_state(shapes, _vae_rule, device, dtype, seed)
    for name in state:
        if name.endswith("weight_g"):  # weight = g * v / |v| = v: the drawn weights as they are
            v = state[name.removesuffix("_g") + "_v"].float()
            norm = v.flatten(1).norm(dim=1).reshape(shapes[name])
            state[name] = norm.to(dtype).contiguous()
    model.load_state_dict(state, strict=True, assign=True)
    text_models.refresh_weight_norm(model)
    return text_models.finish_model(model, device)


def meta_param_count(kind: str, config: dict[str, Any] | None = None) -> int:
    """Parameters of "vae", "text_encoder" or "lm" (config required) on the meta device. Tied
    embeddings count once."""
    with torch.device("meta"):
        if kind == "vae":
            model = AutoencoderOobleck.from_config(copy.deepcopy(config or VAE_CONFIG))
        elif kind == "text_encoder":
            model = Qwen3Model(_qwen_config(config or TEXT_ENCODER_CONFIG))
        elif kind == "lm" and config is not None:
            model = Qwen3ForCausalLM(_qwen_config(config))
        else:
            raise ValueError(f"unknown kind {kind!r} (lm needs a config)")
    return sum(param.numel() for param in model.parameters())  # parameters() dedups ties
