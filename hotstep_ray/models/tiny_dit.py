"""Write tiny random ACE-Step 1.5 DiT folders in the OFFICIAL layout, for tests and dry runs.

Same files as a real checkpoint (config.json, model.safetensors with official key names,
silence_latent.pt [1, 64, N]) at a few hundred thousand parameters, so every stage can run its
real code path on CPU in seconds. Deterministic for a seed: same seed, same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from hotstep_ray.models.acestep_dit import MODEL_CLASSES
from hotstep_ray.models.acestep_keys import (
    COMPONENTS,
    diffusers_kwargs,
    merge_to_official_state_dict,
)

TINY_VARIANTS = ("turbo", "base", "sft", "xl-turbo", "xl-base", "xl-sft")
SILENCE_FRAMES = 200  # 8 s at 25 Hz

# 2B layout: every part 64 wide (q/k/v heads 4/2 of 16).
_TINY_2B: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
# XL layout: a wider DiT (80) whose attention width (6 x 16 = 96) differs from its hidden size,
# over 64-wide encoders, like the real XL (2560 hidden, 4096 attention, 2048 encoders).
_TINY_XL: dict[str, Any] = {
    "hidden_size": 80,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "encoder_hidden_size": 64,
    "encoder_intermediate_size": 96,
    "encoder_num_attention_heads": 4,
    "encoder_num_key_value_heads": 2,
}


def tiny_config(variant: str = "turbo") -> dict[str, Any]:
    """An official-style `config.json` dict for a tiny model of `variant`."""
    if variant not in TINY_VARIANTS:
        raise ValueError(f"variant must be one of {TINY_VARIANTS}, got {variant!r}")
    xl = variant.startswith("xl-")
    kind = variant.removeprefix("xl-")
    sizes = _TINY_XL if xl else _TINY_2B
    layers = sizes["num_hidden_layers"]
    config: dict[str, Any] = {
        "architectures": ["AceStepConditionGenerationModel"],
        "model_type": "acestep",
        "model_version": kind,
        "is_turbo": kind == "turbo",
        "dtype": "float32",
        **sizes,
        "num_audio_decoder_hidden_layers": layers,
        "head_dim": 16,
        "layer_types": [
            "sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(layers)
        ],
        "use_sliding_window": True,
        "sliding_window": 8,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        "rope_scaling": None,
        "max_position_embeddings": 32768,
        "in_channels": 192,
        "audio_acoustic_hidden_dim": 64,
        "patch_size": 2,
        "pool_window_size": 5,
        "text_hidden_dim": 32,
        "timbre_hidden_dim": 64,
        "timbre_fix_frame": 750,
        "num_lyric_encoder_hidden_layers": 2,
        "num_timbre_encoder_hidden_layers": 2,
        "num_attention_pooler_hidden_layers": 1,
        "fsq_dim": sizes.get("encoder_hidden_size", sizes["hidden_size"]),
        "fsq_input_levels": [8, 8, 8, 5, 5, 5],
        "fsq_input_num_quantizers": 1,
        "timestep_mu": -0.4,
        "timestep_sigma": 1.0,
        "data_proportion": 0.5,
    }
    return config


def _init_(name: str, param: torch.Tensor, generator: torch.Generator) -> None:
    """Weights with O(1) activations (the fixtures' rules), drawn in place from `generator`."""
    shape = param.shape
    if name.endswith(("special_token", "special_tokens", "null_condition_emb")):
        values = torch.randn(shape, generator=generator)
    elif name.endswith("scale_shift_table"):
        values = 0.3 * torch.randn(shape, generator=generator)
    elif name.endswith(".bias"):
        values = 0.1 * torch.randn(shape, generator=generator)
    elif param.ndim == 1:  # RMSNorm weights
        values = 0.6 + 0.8 * torch.rand(shape, generator=generator)
    elif "proj_in_conv" in name:  # Conv1d [out, in, k]
        values = torch.randn(shape, generator=generator) / (shape[1] * shape[2]) ** 0.5
    elif "proj_out_conv" in name:  # ConvTranspose1d [in, out, k]
        values = torch.randn(shape, generator=generator) / shape[0] ** 0.5
    else:  # Linear [out, in]
        values = torch.randn(shape, generator=generator) / shape[-1] ** 0.5
    with torch.no_grad():
        param.copy_(values)


def write_tiny_dit(folder: str | Path, variant: str = "turbo", seed: int = 0) -> Path:
    """Write config.json, model.safetensors and silence_latent.pt for a tiny `variant` model.
    Loadable with `load_acestep_dit`; each file stays under 3 MB."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = tiny_config(variant)
    kwargs = diffusers_kwargs(config)
    generator = torch.Generator().manual_seed(seed)
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for component in COMPONENTS:
        module = MODEL_CLASSES[component](**kwargs[component])
        for name, param in module.named_parameters():
            _init_(name, param, generator)
        parts[component] = module.state_dict()
    state = merge_to_official_state_dict(parts)
    tensors = {key: value.contiguous() for key, value in sorted(state.items())}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    # Smooth-ish "silence": a small random walk over time, [1, 64 channels, N frames].
    steps = 0.05 * torch.randn(1, 64, SILENCE_FRAMES, generator=generator)
    torch.save(steps.cumsum(dim=-1).contiguous(), folder / "silence_latent.pt")
    return folder
