"""Official ACE-Step 1.5 checkpoint layout <-> diffusers 0.42 ACE-Step classes.

The official folder holds ONE `model.safetensors` whose keys start with `decoder.`, `encoder.`,
`tokenizer.`, `detokenizer.` or are `null_condition_emb`, plus one `config.json` (an
`AceStepConfig`). diffusers splits that into four models. The rules below are the facts of
`scripts/convert_ace_step_to_diffusers.py` (diffusers main), written out as data:

- `decoder.*`     -> AceStepTransformer1DModel   (`proj_in.1.` -> `proj_in_conv.`, same for out)
- `encoder.*` and `null_condition_emb` -> AceStepConditionEncoder
- `tokenizer.*`   -> AceStepAudioTokenizer
- `detokenizer.*` -> AceStepAudioTokenDetokenizer
- every attention: q/k/v/o_proj -> to_q/to_k/to_v/to_out.0, q/k_norm -> norm_q/norm_k.
"""

from __future__ import annotations

from typing import Any

from hotstep_ray.models.errors import CheckpointError

TRANSFORMER = "transformer"
CONDITION_ENCODER = "condition_encoder"
AUDIO_TOKENIZER = "audio_tokenizer"
DETOKENIZER = "detokenizer"
COMPONENTS = (TRANSFORMER, CONDITION_ENCODER, AUDIO_TOKENIZER, DETOKENIZER)

# Subfolder names that `AceStepPipeline.save_pretrained` uses, so our diffusers-format folders
# load in plain diffusers too.
DIFFUSERS_SUBFOLDERS = {
    TRANSFORMER: "transformer",
    CONDITION_ENCODER: "condition_encoder",
    AUDIO_TOKENIZER: "audio_tokenizer",
    DETOKENIZER: "audio_token_detokenizer",
}

_PREFIXES = {
    "decoder.": TRANSFORMER,
    "encoder.": CONDITION_ENCODER,
    "tokenizer.": AUDIO_TOKENIZER,
    "detokenizer.": DETOKENIZER,
}
_OFFICIAL_PREFIX = {component: prefix for prefix, component in _PREFIXES.items()}
NULL_CONDITION_KEY = "null_condition_emb"

_ATTENTION_RENAMES = (
    (".q_proj.", ".to_q."),
    (".k_proj.", ".to_k."),
    (".v_proj.", ".to_v."),
    (".o_proj.", ".to_out.0."),
    (".q_norm.", ".norm_q."),
    (".k_norm.", ".norm_k."),
)
# The official DiT wraps its patch convs in Sequential(transpose, conv, transpose): index 1.
_TRANSFORMER_RENAMES = (("proj_in.1.", "proj_in_conv."), ("proj_out.1.", "proj_out_conv."))

# Buffers diffusers keeps in the state dict that the official file does not carry.
# `silence_latent` lives in `silence_latent.pt` next to the official `model.safetensors`.
DIFFUSERS_ONLY_KEYS = {CONDITION_ENCODER: ("silence_latent",)}


def official_to_diffusers_key(key: str) -> tuple[str, str]:
    """`decoder.layers.0.self_attn.q_proj.weight` -> (`transformer`, `layers.0.self_attn.to_q.weight`).

    Raises KeyError for a key that belongs to no component (the caller reports it as unexpected).
    """
    if key == NULL_CONDITION_KEY:
        return CONDITION_ENCODER, NULL_CONDITION_KEY
    for prefix, component in _PREFIXES.items():
        if key.startswith(prefix):
            new_key = key[len(prefix) :]
            if component == TRANSFORMER:
                for old, new in _TRANSFORMER_RENAMES:
                    new_key = new_key.replace(old, new)
            for old, new in _ATTENTION_RENAMES:
                new_key = new_key.replace(old, new)
            return component, new_key
    raise KeyError(key)


def diffusers_to_official_key(component: str, key: str) -> str:
    """The inverse of `official_to_diffusers_key` (used to write official-layout files)."""
    if component == CONDITION_ENCODER and key == NULL_CONDITION_KEY:
        return NULL_CONDITION_KEY
    if component not in _OFFICIAL_PREFIX:
        raise KeyError(f"unknown component {component!r}")
    for official, ours in _ATTENTION_RENAMES:
        key = key.replace(ours, official)
    if component == TRANSFORMER:
        for official, ours in _TRANSFORMER_RENAMES:
            key = key.replace(ours, official)
    return _OFFICIAL_PREFIX[component] + key


def split_official_state_dict(state_dict: dict[str, Any]) -> tuple[dict[str, dict], list[str]]:
    """Route an official state dict into the four components; also return keys that fit none."""
    parts: dict[str, dict] = {component: {} for component in COMPONENTS}
    unrouted: list[str] = []
    for key, value in state_dict.items():
        try:
            component, new_key = official_to_diffusers_key(key)
        except KeyError:
            unrouted.append(key)
            continue
        parts[component][new_key] = value
    return parts, unrouted


def merge_to_official_state_dict(parts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Four diffusers state dicts -> one official state dict (diffusers-only buffers dropped)."""
    merged: dict[str, Any] = {}
    for component, state_dict in parts.items():
        skip = DIFFUSERS_ONLY_KEYS.get(component, ())
        for key, value in state_dict.items():
            if key in skip:
                continue
            merged[diffusers_to_official_key(component, key)] = value
    return merged


# --------------------------------------------------------------------------- config mapping


def is_xl_config(config: dict[str, Any]) -> bool:
    """XL checkpoints carry the `encoder_*` widths (2B configs never set them). The XL code also
    differs in one behaviour: its timbre encoder prepends a learned token."""
    return "encoder_hidden_size" in config


DIT_KINDS = ("turbo", "base", "sft")


def dit_variant(config: dict[str, Any], folder_name: str = "") -> tuple[str, str]:
    """(kind, layout) of a DiT: kind in turbo/base/sft, layout "2b" or "xl".

    sft shares the base config and weights layout (it differs only in its sampler honouring
    custom timesteps), so the folder name (`acestep-v15-sft`, `-xl-sft`) decides it.
    """
    layout = "xl" if is_xl_config(config) else "2b"
    version = str(config.get("model_version") or "").lower()
    if "sft" in folder_name.lower() or version == "sft":
        kind = "sft"
    elif version in ("turbo", "base"):
        kind = version
    else:
        kind = "turbo" if config.get("is_turbo") else "base"
    return kind, layout


def variant_name(kind: str, layout: str) -> str:
    """`turbo`, `base`, `sft`, `xl-turbo`, `xl-base`, `xl-sft` (the checkpoint folder suffixes)."""
    return f"xl-{kind}" if layout == "xl" else kind


def _default_layer_types(count: int) -> list[str]:
    # AceStepConfig's rule: layer i is sliding when (i + 1) is odd.
    return ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(count)]


def _require(config: dict[str, Any], keys: tuple[str, ...], source: str) -> None:
    missing = [key for key in keys if key not in config]
    if missing:
        raise CheckpointError(f"{source}: missing config keys {missing}")


_REQUIRED_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "text_hidden_dim",
    "timbre_hidden_dim",
    "num_lyric_encoder_hidden_layers",
    "num_timbre_encoder_hidden_layers",
)


def diffusers_kwargs(
    config: dict[str, Any], sliding_window: int | None = None, source: str = "config.json"
) -> dict[str, dict[str, Any]]:
    """Official `config.json` -> constructor kwargs for each diffusers component.

    `sliding_window` overrides the config's window for every component (the "flash" window rule
    passes w - 1; see `acestep_wrappers.sliding_window_for_rule`).
    """
    if config.get("model_type", "acestep") != "acestep":
        raise CheckpointError(
            f"{source}: model_type is {config.get('model_type')!r}, expected 'acestep' "
            "(is this an LM or VAE folder?)"
        )
    _require(config, _REQUIRED_KEYS, source)
    window = int(config.get("sliding_window", 128) if sliding_window is None else sliding_window)
    layer_types = list(
        config.get("layer_types") or _default_layer_types(config["num_hidden_layers"])
    )
    # XL: the condition encoder, tokenizer and detokenizer keep the 2B widths.
    enc_hidden = config.get("encoder_hidden_size", config["hidden_size"])
    enc_intermediate = config.get("encoder_intermediate_size", config["intermediate_size"])
    enc_heads = config.get("encoder_num_attention_heads", config["num_attention_heads"])
    enc_kv_heads = config.get("encoder_num_key_value_heads", config["num_key_value_heads"])
    n_pool = int(config.get("num_attention_pooler_hidden_layers", 2))
    n_lyric = int(config["num_lyric_encoder_hidden_layers"])
    n_timbre = int(config["num_timbre_encoder_hidden_layers"])

    # The official encoders index the decoder's `layer_types` by their own layer index. The
    # diffusers timbre encoder always uses the default alternation, so refuse configs where the
    # two would disagree instead of loading a model that computes something else.
    if layer_types[:n_timbre] != _default_layer_types(n_timbre)[: len(layer_types)]:
        raise CheckpointError(
            f"{source}: layer_types {layer_types[:n_timbre]} for the timbre encoder differ from "
            "the sliding/full alternation diffusers supports"
        )

    shared = {
        "head_dim": config["head_dim"],
        "rope_theta": config.get("rope_theta", 1_000_000.0),
        "attention_bias": config.get("attention_bias", False),
        "attention_dropout": config.get("attention_dropout", 0.0),
        "rms_norm_eps": config.get("rms_norm_eps", 1e-6),
        "sliding_window": window,
    }
    encoder_side = {
        **shared,
        "hidden_size": enc_hidden,
        "intermediate_size": enc_intermediate,
        "num_attention_heads": enc_heads,
        "num_key_value_heads": enc_kv_heads,
    }
    transformer = {
        **shared,
        "hidden_size": config["hidden_size"],
        "intermediate_size": config["intermediate_size"],
        "num_hidden_layers": config["num_hidden_layers"],
        "num_attention_heads": config["num_attention_heads"],
        "num_key_value_heads": config["num_key_value_heads"],
        "in_channels": config.get("in_channels", 192),
        "audio_acoustic_hidden_dim": config.get("audio_acoustic_hidden_dim", 64),
        "patch_size": config.get("patch_size", 2),
        "layer_types": layer_types,
        "encoder_hidden_size": enc_hidden,
        "is_turbo": bool(config.get("is_turbo", False)),
        "model_version": config.get("model_version"),
    }
    condition_encoder = {
        **encoder_side,
        "text_hidden_dim": config["text_hidden_dim"],
        "timbre_hidden_dim": config["timbre_hidden_dim"],
        "num_lyric_encoder_hidden_layers": n_lyric,
        "num_timbre_encoder_hidden_layers": n_timbre,
        "layer_types": layer_types[:n_lyric] if len(layer_types) >= n_lyric else None,
    }
    pooler_side = {
        **encoder_side,
        "audio_acoustic_hidden_dim": config.get("audio_acoustic_hidden_dim", 64),
        "pool_window_size": config.get("pool_window_size", 5),
        "num_attention_pooler_hidden_layers": n_pool,
        "layer_types": layer_types[:n_pool] if len(layer_types) >= n_pool else None,
    }
    audio_tokenizer = {
        **pooler_side,
        "fsq_dim": config.get("fsq_dim", enc_hidden),
        "fsq_input_levels": list(config.get("fsq_input_levels", [8, 8, 8, 5, 5, 5])),
        "fsq_input_num_quantizers": config.get("fsq_input_num_quantizers", 1),
    }
    return {
        TRANSFORMER: transformer,
        CONDITION_ENCODER: condition_encoder,
        AUDIO_TOKENIZER: audio_tokenizer,
        DETOKENIZER: dict(pooler_side),
    }


def official_config_from_diffusers(configs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Rebuild an official-style `config.json` dict from the four diffusers configs, so callers
    see the same keys whichever layout was loaded."""
    dit = configs[TRANSFORMER]
    enc = configs[CONDITION_ENCODER]
    tok = configs[AUDIO_TOKENIZER]
    config: dict[str, Any] = {
        "model_type": "acestep",
        "architectures": ["AceStepConditionGenerationModel"],
        "hidden_size": dit["hidden_size"],
        "intermediate_size": dit["intermediate_size"],
        "num_hidden_layers": dit["num_hidden_layers"],
        "num_audio_decoder_hidden_layers": dit["num_hidden_layers"],
        "num_attention_heads": dit["num_attention_heads"],
        "num_key_value_heads": dit["num_key_value_heads"],
        "head_dim": dit["head_dim"],
        "in_channels": dit["in_channels"],
        "audio_acoustic_hidden_dim": dit["audio_acoustic_hidden_dim"],
        "patch_size": dit["patch_size"],
        "rope_theta": dit["rope_theta"],
        "attention_bias": dit["attention_bias"],
        "attention_dropout": dit["attention_dropout"],
        "rms_norm_eps": dit["rms_norm_eps"],
        "use_sliding_window": True,
        "sliding_window": dit["sliding_window"],
        "layer_types": list(
            dit.get("layer_types") or _default_layer_types(dit["num_hidden_layers"])
        ),
        "text_hidden_dim": enc["text_hidden_dim"],
        "timbre_hidden_dim": enc["timbre_hidden_dim"],
        "num_lyric_encoder_hidden_layers": enc["num_lyric_encoder_hidden_layers"],
        "num_timbre_encoder_hidden_layers": enc["num_timbre_encoder_hidden_layers"],
        "num_attention_pooler_hidden_layers": tok["num_attention_pooler_hidden_layers"],
        "pool_window_size": tok["pool_window_size"],
        "fsq_dim": tok["fsq_dim"],
        "fsq_input_levels": list(tok["fsq_input_levels"] or [8, 8, 8, 5, 5, 5]),
        "fsq_input_num_quantizers": tok["fsq_input_num_quantizers"],
        "is_turbo": bool(dit.get("is_turbo", False)),
        "model_version": dit.get("model_version"),
        "timestep_mu": -0.4,
        "timestep_sigma": 1.0,
        "data_proportion": 0.5,
    }
    enc_hidden = dit.get("encoder_hidden_size") or dit["hidden_size"]
    # The diffusers converter always writes `encoder_hidden_size`; only a width that differs from
    # the DiT marks the XL layout (whose official config carries the encoder_* keys).
    if enc_hidden != dit["hidden_size"]:
        config["encoder_hidden_size"] = enc_hidden
        config["encoder_intermediate_size"] = enc["intermediate_size"]
        config["encoder_num_attention_heads"] = enc["num_attention_heads"]
        config["encoder_num_key_value_heads"] = enc["num_key_value_heads"]
    return config
