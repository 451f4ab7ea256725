"""Load the non-DiT parts of an ACE-Step 1.5 checkpoint tree from the official folder layout:

  Qwen3-Embedding-0.6B/    config.json, model.safetensors (keys without "model."), tokenizer
  acestep-5Hz-lm-{size}/   config.json, model.safetensors or shards + model.safetensors.index.json
                           (keys with or without "model."), tokenizer; size 0.6B, 1.7B or 4B
  vae/                     config.json (diffusers), diffusion_pytorch_model.safetensors

Weights are checked against the config before any tensor is read (safetensors headers only), so a
missing file, a truncated file, a missing tensor or a wrong shape raises CheckpointError naming the
file and what was expected versus found. Models are built on the meta device and the checkpoint
tensors are assigned in place: no random init, no second copy in memory. Defaults match the DiT
loader: CUDA when present, bf16 on CUDA and float32 elsewhere. Models come back in eval mode.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch
from diffusers import AutoencoderOobleck
from safetensors.torch import load_file
from transformers import PreTrainedTokenizerBase, Qwen3Config, Qwen3ForCausalLM, Qwen3Model

from hotstep_ray.models.acestep_dit import resolve_device_dtype
from hotstep_ray.models.discovery import read_safetensors_header, weight_files
from hotstep_ray.models.errors import CheckpointError
from hotstep_ray.models.prompts import CAPTION_MAX_TOKENS, LYRIC_MAX_TOKENS

TEXT_ENCODER_DIR = "Qwen3-Embedding-0.6B"
VAE_DIR = "vae"
LM_DIRS = {size: f"acestep-5Hz-lm-{size}" for size in ("0.6B", "1.7B", "4B")}
VAE_WEIGHTS = "diffusion_pytorch_model"
LM_PREFIX = "model."


def _read_config(folder: Path, what: str) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{path}: missing (expected the {what} config)")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: unreadable config ({exc})") from exc
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: not a JSON object")
    return config


def _qwen3_config(folder: Path, what: str) -> Qwen3Config:
    raw = _read_config(folder, what)
    if raw.get("model_type") != "qwen3":
        raise CheckpointError(
            f"{folder / 'config.json'}: model_type {raw.get('model_type')!r}, expected 'qwen3'"
        )
    config = Qwen3Config.from_dict(raw)
    config._attn_implementation = "sdpa"
    return config


def _headers(folder: Path, stem: str) -> dict[str, tuple[Path, list[int]]]:
    """Tensor name -> (file, shape) over the single file or every shard; raises on a missing
    or truncated file or a tensor stored twice."""
    files, problems = weight_files(folder, stem)
    if problems:
        raise CheckpointError(f"{folder}: {'; '.join(problems)}")
    found: dict[str, tuple[Path, list[int]]] = {}
    for path in files:
        for name, entry in read_safetensors_header(path).items():
            if name in found:
                raise CheckpointError(f"{path}: tensor {name!r} also in {found[name][0].name}")
            found[name] = (path, list(entry["shape"]))
    return found


def _describe(folder: Path, stem: str) -> Path:
    single = folder / f"{stem}.safetensors"
    return single if single.is_file() else folder / f"{stem}.safetensors.index.json"


def _check_keys(
    folder: Path,
    stem: str,
    expected: dict[str, list[int]],
    found: dict[str, tuple[Path, list[int]]],
    hint: str,
) -> None:
    """Every expected tensor present with its shape, nothing unknown; else CheckpointError."""
    missing = [name for name in expected if name not in found]
    if missing:
        first = missing[0]
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise CheckpointError(
            f"{_describe(folder, stem)}: missing tensor {first!r} (expected shape "
            f"{expected[first]}){more}"
        )
    for name, shape in expected.items():
        path, have = found[name]
        if have != shape:
            raise CheckpointError(
                f"{path}: tensor {name!r} has shape {have}, expected {shape} ({hint})"
            )
    unexpected = sorted(set(found) - set(expected))
    if unexpected:
        path = found[unexpected[0]][0]
        raise CheckpointError(
            f"{path}: unexpected tensor {unexpected[0]!r} (+{len(unexpected) - 1} more); "
            f"this is not the model its config.json describes ({hint})"
        )


def _rename(
    found: dict[str, tuple[Path, list[int]]], rename: dict[str, str | None]
) -> dict[str, tuple[Path, list[int]]]:
    return {rename[name]: value for name, value in found.items() if rename[name] is not None}


def _load_tensors(
    found: dict[str, tuple[Path, list[int]]],
    rename: dict[str, str | None],
    device: torch.device,
    dtype: torch.dtype,
) -> dict[str, torch.Tensor]:
    """Read every file once, keep the renamed tensors, cast floats to `dtype`."""
    state: dict[str, torch.Tensor] = {}
    for path in sorted({path for path, _ in found.values()}):
        for name, tensor in load_file(str(path), device=str(device)).items():
            target = rename.get(name)
            if target is not None:
                state[target] = tensor.to(dtype) if tensor.is_floating_point() else tensor
    return state


def _materialize_buffers(model: torch.nn.Module, device: torch.device) -> None:
    """Non-persistent buffers (RoPE inverse frequencies) are not in checkpoints: rebuild every
    module still holding a meta buffer from its own config, on the target device, in float32."""
    for name, module in list(model.named_modules()):
        if not any(buf.is_meta for buf in module.buffers(recurse=False)):
            continue
        config = getattr(module, "config", None)
        if config is None:
            raise CheckpointError(f"cannot materialise buffers of {name or 'model'}")
        with torch.device(device):
            rebuilt = type(module)(config)
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, rebuilt)


def finish_model(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    _materialize_buffers(model, device)
    leftover = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if leftover:
        raise CheckpointError(f"tensors never loaded: {leftover[:3]}")
    return model.eval()


def _text_encoder_rename(names: Sequence[str]) -> dict[str, str | None]:
    """Qwen3-Embedding stores Qwen3Model keys bare; a "model."-prefixed copy (saved from a causal
    LM) is accepted too, and a stray lm_head is ignored."""
    return {
        name: None if name.startswith("lm_head.") else name.removeprefix(LM_PREFIX)
        for name in names
    }


def load_text_encoder(
    folder: str | Path,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
) -> Qwen3Model:
    """`Qwen3-Embedding-0.6B/` as a transformers Qwen3Model. Captions: full forward,
    `last_hidden_state` [B, L, hidden]; lyrics: `embed_tokens` only (see `embed_lyrics`)."""
    folder = Path(folder)
    device, dtype = resolve_device_dtype(device, dtype)
    config = _qwen3_config(folder, "Qwen3-Embedding text encoder")
    with torch.device("meta"):
        model = Qwen3Model(config)
    expected = {k: list(v.shape) for k, v in model.state_dict().items()}
    found = _headers(folder, "model")
    rename = _text_encoder_rename(list(found))
    hint = f"config.json: hidden_size={config.hidden_size}, vocab_size={config.vocab_size}"
    _check_keys(folder, "model", expected, _rename(found, rename), hint)
    model.load_state_dict(_load_tensors(found, rename, device, dtype), strict=True, assign=True)
    return finish_model(model, device)


def _lm_rename(names: Sequence[str], tied: bool) -> dict[str, str | None]:
    """Causal-LM keys are `model.*` + `lm_head.weight`; some LM files store the trunk without
    the "model." prefix. With tied embeddings a stored lm_head is the embedding again: dropped."""
    rename: dict[str, str | None] = {}
    for name in names:
        if name.startswith("lm_head."):
            rename[name] = None if tied else name
        else:
            rename[name] = name if name.startswith(LM_PREFIX) else LM_PREFIX + name
    return rename


def load_lm(
    folder: str | Path,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
) -> Qwen3ForCausalLM:
    """`acestep-5Hz-lm-*/` as a transformers Qwen3ForCausalLM (vocab 217,204 = Qwen3 + 65,535
    audio-code tokens), single-file or sharded."""
    folder = Path(folder)
    device, dtype = resolve_device_dtype(device, dtype)
    config = _qwen3_config(folder, "5 Hz LM")
    tied = bool(config.tie_word_embeddings)
    with torch.device("meta"):
        model = Qwen3ForCausalLM(config)
    expected = {k: list(v.shape) for k, v in model.state_dict().items()}
    if tied:
        expected.pop("lm_head.weight", None)
    found = _headers(folder, "model")
    rename = _lm_rename(list(found), tied)
    hint = f"config.json: hidden_size={config.hidden_size}, vocab_size={config.vocab_size}"
    _check_keys(folder, "model", expected, _rename(found, rename), hint)
    state = _load_tensors(found, rename, device, dtype)
    model.load_state_dict(state, strict=False, assign=True)
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    return finish_model(model, device)


def load_vae(
    folder: str | Path,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
) -> AutoencoderOobleck:
    """`vae/` as diffusers AutoencoderOobleck (48 kHz stereo <-> 64-d latents; the real one
    downsamples 2*4*4*6*10 = 1920 samples per latent frame, 25 frames/s)."""
    folder = Path(folder)
    device, dtype = resolve_device_dtype(device, dtype)
    raw = _read_config(folder, "Oobleck VAE")
    if raw.get("_class_name") != "AutoencoderOobleck":
        raise CheckpointError(
            f"{folder / 'config.json'}: _class_name {raw.get('_class_name')!r}, "
            "expected 'AutoencoderOobleck'"
        )
    try:
        with torch.device("meta"):
            model = AutoencoderOobleck.from_config(raw)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{folder / 'config.json'}: invalid VAE config ({exc})") from exc
    expected = {k: list(v.shape) for k, v in model.state_dict().items()}
    found = _headers(folder, VAE_WEIGHTS)
    rename: dict[str, str | None] = {name: name for name in found}
    hint = f"config.json: encoder_hidden_size={raw.get('encoder_hidden_size')}"
    _check_keys(folder, VAE_WEIGHTS, expected, found, hint)
    model.load_state_dict(_load_tensors(found, rename, device, dtype), strict=True, assign=True)
    refresh_weight_norm(model)
    return finish_model(model, device)


def refresh_weight_norm(model: torch.nn.Module) -> None:
    """torch's (old-style) weight_norm keeps `weight` as a plain attribute recomputed from
    weight_g / weight_v before each forward; recompute it now so nothing is left on meta."""
    for module in model.modules():
        for hook in module._forward_pre_hooks.values():
            if type(hook).__name__ == "WeightNorm":
                setattr(module, hook.name, hook.compute_weight(module))


# --- using the text encoder ----------------------------------------------------------------------


def encode_captions(
    encoder: Qwen3Model,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    max_length: int = CAPTION_MAX_TOKENS,
    padding: str | bool = "longest",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Caption prompts -> (last_hidden_state [B, L, hidden], mask [B, L] bool). Like upstream the
    encoder runs without an attention mask: padding is on the right and attention is causal,
    so real tokens never see pads and their states are the same either way."""
    batch = tokenizer(
        list(texts), padding=padding, truncation=True, max_length=max_length, return_tensors="pt"
    )
    device = encoder.get_input_embeddings().weight.device
    with torch.no_grad():
        out = encoder(input_ids=to_device(batch["input_ids"], device), use_cache=False)
    return out.last_hidden_state, to_device(batch["attention_mask"], device).bool()


def embed_lyrics(
    encoder: Qwen3Model,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    max_length: int = LYRIC_MAX_TOKENS,
    padding: str | bool = "longest",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Lyric prompts -> (token embeddings [B, L, hidden], mask [B, L] bool): only the
    embedding table, the DiT's lyric encoder does the contextualising."""
    batch = tokenizer(
        list(texts), padding=padding, truncation=True, max_length=max_length, return_tensors="pt"
    )
    embeddings = encoder.get_input_embeddings()
    device = embeddings.weight.device
    with torch.no_grad():
        states = embeddings(to_device(batch["input_ids"], device))
    return states, to_device(batch["attention_mask"], device).bool()


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU tensor onto `device`; to CUDA through pinned memory without waiting for the GPU (a
    pageable copy waits for all queued work, e.g. a VAE still running)."""
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)
