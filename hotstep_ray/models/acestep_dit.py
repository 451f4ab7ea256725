"""Load an ACE-Step 1.5 DiT checkpoint folder into the diffusers 0.42.1 classes (and write one).

Two layouts are accepted:
- official: `config.json` + `model.safetensors` (keys `decoder.* encoder.* tokenizer.*
  detokenizer.* null_condition_emb`) + `silence_latent.pt` ([1, 64, N] float32, N frames at 25 Hz);
- diffusers: `transformer/`, `condition_encoder/`, `audio_tokenizer/`, `audio_token_detokenizer/`
  as written by `save_pretrained` (the silence latent is the condition encoder's buffer).

Every file is checked before any weight is read: truncation, dtypes (quantized weights cannot
take adapters), missing/unexpected keys and shapes; a failure raises `CheckpointError` naming the
file. Weights are built on the meta device and filled in place, so a 2B model never exists twice.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import init_empty_weights
from diffusers import AceStepTransformer1DModel
from diffusers.pipelines.ace_step import (
    AceStepAudioTokenDetokenizer,
    AceStepAudioTokenizer,
    AceStepConditionEncoder,
)
from safetensors import safe_open
from safetensors.torch import save_file

from hotstep_ray.models.acestep_keys import (
    AUDIO_TOKENIZER,
    COMPONENTS,
    CONDITION_ENCODER,
    DETOKENIZER,
    DIFFUSERS_SUBFOLDERS,
    TRANSFORMER,
    diffusers_kwargs,
    dit_variant,
    merge_to_official_state_dict,
    official_config_from_diffusers,
    official_to_diffusers_key,
    variant_name,
)
from hotstep_ray.models.acestep_wrappers import (
    KeyPaddingMasks,
    install_padded_key_processor,
    install_timbre_token,
    sliding_window_for_rule,
)
from hotstep_ray.models.discovery import (
    FLOAT_DTYPES,
    read_safetensors_header,
    weight_files,
)
from hotstep_ray.models.errors import CheckpointError

MODEL_CLASSES: dict[str, type[torch.nn.Module]] = {
    TRANSFORMER: AceStepTransformer1DModel,
    CONDITION_ENCODER: AceStepConditionEncoder,
    AUDIO_TOKENIZER: AceStepAudioTokenizer,
    DETOKENIZER: AceStepAudioTokenDetokenizer,
}
SILENCE_KEY = "silence_latent"
_DTYPE_NAMES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
}


@dataclass
class VariantInfo:
    kind: str  # turbo | base | sft
    layout: str  # 2b | xl (XL: wider DiT over 2B-width encoders, timbre token prepended)
    source_format: str  # official | diffusers
    window_rule: str  # sdpa (|i-j| <= w) | flash (|i-j| <= w-1)

    @property
    def name(self) -> str:
        return variant_name(self.kind, self.layout)

    @property
    def is_turbo(self) -> bool:
        return self.kind == "turbo"


@dataclass
class AceStepModels:
    transformer: AceStepTransformer1DModel
    condition_encoder: AceStepConditionEncoder
    audio_tokenizer: AceStepAudioTokenizer
    detokenizer: AceStepAudioTokenDetokenizer
    config: dict[str, Any]  # official-style config.json (original sliding_window)
    variant: VariantInfo
    key_masks: KeyPaddingMasks  # read by the DiT's attention; see acestep_wrappers
    folder: str | None = None

    @property
    def silence_latent(self) -> torch.Tensor:
        """[1, N, 64] VAE latents of silence at 25 Hz (model dtype/device)."""
        return self.condition_encoder.silence_latent

    @property
    def device(self) -> torch.device:
        return next(self.transformer.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.transformer.parameters()).dtype

    def components(self) -> dict[str, torch.nn.Module]:
        return {name: getattr(self, name) for name in COMPONENTS}

    def to(
        self, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> AceStepModels:
        for module in self.components().values():
            module.to(device=device, dtype=dtype)
        return self


def resolve_device_dtype(
    device: torch.device | str | None, dtype: torch.dtype | str | None
) -> tuple[torch.device, torch.dtype]:
    """Defaults: CUDA + bfloat16 when a GPU is present, else CPU + float32."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if isinstance(dtype, str):
        if dtype.lower() not in _DTYPE_NAMES:
            raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPE_NAMES)}")
        dtype = _DTYPE_NAMES[dtype.lower()]
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return device, dtype


def load_acestep_dit(
    folder: str | Path,
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
    *,
    expect_variant: str | None = None,
    window_rule: str = "sdpa",
) -> AceStepModels:
    """Load the four ACE-Step DiT components from an official or diffusers-format folder.

    `expect_variant` ("turbo", "base", "sft", "xl-turbo", ...) turns a mismatch into an error.
    `window_rule` picks the sliding-window convention (see `sliding_window_for_rule`).
    The loaded modules are in eval mode with every base weight frozen (adapters add trainables).
    """
    folder = Path(folder)
    device, dtype = resolve_device_dtype(device, dtype)
    sliding_window_for_rule(8, window_rule)  # validates the rule name before any work
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: checkpoint folder not found")
    if (folder / "config.json").is_file():
        models = _load_official(folder, device, dtype, window_rule)
    elif (folder / DIFFUSERS_SUBFOLDERS[TRANSFORMER] / "config.json").is_file():
        models = _load_diffusers(folder, device, dtype, window_rule)
    else:
        gguf = sorted(path.name for path in folder.glob("*.gguf"))
        hint = f" (found GGUF files {gguf}: quantized weights cannot take adapters)" if gguf else ""
        raise CheckpointError(
            f"{folder}: expected config.json (official layout) or transformer/config.json "
            f"(diffusers layout){hint}"
        )
    if expect_variant is not None and models.variant.name != expect_variant:
        raise CheckpointError(
            f"{folder}: expected variant {expect_variant!r}, found {models.variant.name!r}"
        )
    return models


# --------------------------------------------------------------------------- shared helpers


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    try:
        value = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: unreadable JSON ({exc})") from exc
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return value


def read_headers(files: list[Path]) -> dict[str, tuple[Path, dict[str, Any]]]:
    """Tensor name -> (file, header entry) over all shards, refusing quantized tensors."""
    entries: dict[str, tuple[Path, dict[str, Any]]] = {}
    for path in files:
        for key, entry in read_safetensors_header(path).items():
            if entry["dtype"] not in FLOAT_DTYPES:
                raise CheckpointError(
                    f"{path}: tensor {key} is {entry['dtype']}: quantized/integer weights cannot "
                    "take adapters; use the bfloat16/float32 release"
                )
            entries[key] = (path, entry)
    return entries


def build_component(component: str, kwargs: dict[str, Any]) -> torch.nn.Module:
    # Parameters on the meta device (filled by assignment below); buffers stay real because
    # diffusers rebuilds the FSQ `_levels`/`_basis`/`scales` in __init__ and never saves them.
    cls = MODEL_CLASSES[component]
    accepted = set(inspect.signature(cls.__init__).parameters)
    with init_empty_weights(include_buffers=False):
        return cls(**{key: value for key, value in kwargs.items() if key in accepted})


def _limited(keys: list[str], limit: int = 6) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f", ... ({len(keys)} total)" if len(keys) > limit else "")


def check_keys(
    model: torch.nn.Module,
    found: dict[str, tuple[str, tuple[int, ...]]],
    component: str,
    source: str,
    optional: tuple[str, ...] = (),
) -> None:
    """`found`: our key -> (name in the file, shape). Raises on missing/unexpected/shape."""
    expected = {
        key: tuple(value.shape) for key, value in model.state_dict().items() if key not in optional
    }
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(found[key][0] for key in set(found) - set(expected) - set(optional))
    wrong = [
        f"{found[key][0]} expected {list(expected[key])} found {list(found[key][1])}"
        for key in sorted(set(expected) & set(found))
        if expected[key] != found[key][1]
    ]
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing {component} keys: {_limited(missing)}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected keys: {_limited(unexpected)}")
    if wrong:
        problems.append(f"wrong shapes: {_limited(wrong, 3)}")
    if problems:
        raise CheckpointError(f"{source}: " + "; ".join(problems))


def fill_weights(
    model: torch.nn.Module,
    tensors: dict[str, tuple[Path, str]],
    device: torch.device,
    dtype: torch.dtype,
) -> None:
    """Read each tensor straight onto `device` in `dtype` and assign it into the meta model."""
    by_file: dict[Path, list[tuple[str, str]]] = {}
    for ours, (path, theirs) in tensors.items():
        by_file.setdefault(path, []).append((ours, theirs))
    state: dict[str, torch.Tensor] = {}
    for path, names in by_file.items():
        with safe_open(str(path), framework="pt", device=str(device)) as handle:
            for ours, theirs in names:
                state[ours] = handle.get_tensor(theirs).to(dtype)
    model.load_state_dict(state, strict=False, assign=True)
    still_meta = [name for name, param in model.named_parameters() if param.is_meta]
    if still_meta:  # _check_keys makes this unreachable; kept as a guard against silent garbage
        raise CheckpointError(f"parameters left unloaded: {_limited(still_meta)}")


def set_silence(encoder: AceStepConditionEncoder, silence: torch.Tensor) -> None:
    # The buffer's default shape is [1, 15000, 64]; tiny or trimmed files are shorter, so the
    # buffer is re-registered rather than copied into.
    encoder.register_buffer(SILENCE_KEY, silence.contiguous(), persistent=True)


def check_silence(silence: Any, source: str, channels: int) -> torch.Tensor:
    if not isinstance(silence, torch.Tensor) or silence.ndim != 3 or silence.shape[0] != 1:
        shape = tuple(silence.shape) if isinstance(silence, torch.Tensor) else type(silence)
        raise CheckpointError(f"{source}: expected a [1, {channels}, N] tensor, found {shape}")
    if not silence.is_floating_point():
        raise CheckpointError(f"{source}: expected a float tensor, found {silence.dtype}")
    return silence


def finish_models(
    parts: dict[str, torch.nn.Module],
    silence: torch.Tensor,
    config: dict[str, Any],
    variant: VariantInfo,
    folder: Path,
    device: torch.device,
    dtype: torch.dtype,
) -> AceStepModels:
    set_silence(parts[CONDITION_ENCODER], silence.to(device=device, dtype=dtype))
    if variant.layout == "xl":
        install_timbre_token(parts[CONDITION_ENCODER])
    for module in parts.values():
        module.to(device=device)
        module.eval()
        module.requires_grad_(False)
    key_masks = install_padded_key_processor(parts[TRANSFORMER])
    return AceStepModels(
        transformer=parts[TRANSFORMER],
        condition_encoder=parts[CONDITION_ENCODER],
        audio_tokenizer=parts[AUDIO_TOKENIZER],
        detokenizer=parts[DETOKENIZER],
        config=config,
        variant=variant,
        key_masks=key_masks,
        folder=str(folder),
    )


# --------------------------------------------------------------------------- official layout


def _load_official(
    folder: Path, device: torch.device, dtype: torch.dtype, window_rule: str
) -> AceStepModels:
    config_path = folder / "config.json"
    config = _read_json(config_path)
    window = int(config.get("sliding_window", 128))
    kwargs = diffusers_kwargs(
        config, sliding_window_for_rule(window, window_rule), source=str(config_path)
    )
    files, problems = weight_files(folder, "model")
    if problems:
        raise CheckpointError(f"{folder}: " + "; ".join(problems))
    entries = read_headers(files)
    routed: dict[str, dict[str, tuple[str, tuple[int, ...]]]] = {name: {} for name in COMPONENTS}
    unrouted = []
    for key, (_path, entry) in entries.items():
        try:
            component, ours = official_to_diffusers_key(key)
        except KeyError:
            unrouted.append(key)
            continue
        routed[component][ours] = (key, tuple(entry["shape"]))
    source = ", ".join(str(path) for path in files)
    if unrouted:
        raise CheckpointError(
            f"{source}: {len(unrouted)} unexpected keys outside decoder/encoder/tokenizer/"
            f"detokenizer: {_limited(sorted(unrouted))}"
        )

    silence_path = folder / "silence_latent.pt"
    if not silence_path.is_file():
        raise CheckpointError(f"{silence_path}: file not found (needed for padding and context)")
    try:
        # Tensors only: nothing else in a checkpoint folder is ever unpickled.
        raw = torch.load(silence_path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated or non-tensor pickle
        raise CheckpointError(f"{silence_path}: unreadable ({exc})") from exc
    channels = int(config.get("audio_acoustic_hidden_dim", 64))
    silence = check_silence(raw, str(silence_path), channels).transpose(1, 2)  # [1, N, 64]
    if silence.shape[-1] != channels:
        raise CheckpointError(
            f"{silence_path}: expected [1, {channels}, N], found {list(raw.shape)}"
        )

    parts = {}
    for component in COMPONENTS:
        model = build_component(component, kwargs[component])
        optional = (SILENCE_KEY,) if component == CONDITION_ENCODER else ()
        check_keys(model, routed[component], component, source, optional)
        tensors = {ours: (entries[key][0], key) for ours, (key, _) in routed[component].items()}
        fill_weights(model, tensors, device, dtype)
        parts[component] = model
    kind, layout = dit_variant(config, folder.name)
    variant = VariantInfo(kind, layout, "official", window_rule)
    return finish_models(parts, silence, config, variant, folder, device, dtype)


# --------------------------------------------------------------------------- diffusers layout


def _load_diffusers(
    folder: Path, device: torch.device, dtype: torch.dtype, window_rule: str
) -> AceStepModels:
    configs: dict[str, dict[str, Any]] = {}
    parts: dict[str, torch.nn.Module] = {}
    silence: torch.Tensor | None = None
    for component in COMPONENTS:
        sub = folder / DIFFUSERS_SUBFOLDERS[component]
        config = _read_json(sub / "config.json")
        expected_class = MODEL_CLASSES[component].__name__
        if config.get("_class_name") not in (None, expected_class):
            raise CheckpointError(
                f"{sub / 'config.json'}: _class_name is {config.get('_class_name')!r}, "
                f"expected {expected_class!r}"
            )
        configs[component] = config
        kwargs = {key: value for key, value in config.items() if not key.startswith("_")}
        kwargs["sliding_window"] = sliding_window_for_rule(
            int(config.get("sliding_window", 128)), window_rule
        )
        files, problems = weight_files(sub, "diffusion_pytorch_model")
        if problems:
            raise CheckpointError(f"{sub}: " + "; ".join(problems))
        entries = read_headers(files)
        found = {key: (key, tuple(entry["shape"])) for key, (_, entry) in entries.items()}
        model = build_component(component, kwargs)
        optional = (SILENCE_KEY,) if component == CONDITION_ENCODER else ()
        check_keys(model, found, component, ", ".join(str(path) for path in files), optional)
        if component == CONDITION_ENCODER and SILENCE_KEY in entries:
            path = entries.pop(SILENCE_KEY)[0]
            with safe_open(str(path), framework="pt", device="cpu") as handle:
                silence = handle.get_tensor(SILENCE_KEY).float()  # [1, N, 64]
        fill_weights(model, {key: (path, key) for key, (path, _) in entries.items()}, device, dtype)
        parts[component] = model

    if silence is None:  # the diffusers converter also keeps the raw file at the root
        raw_path = folder / "silence_latent.pt"
        if not raw_path.is_file():
            raise CheckpointError(
                f"{folder}: no silence_latent in condition_encoder weights and no "
                "silence_latent.pt at the root"
            )
        raw = torch.load(raw_path, map_location="cpu", weights_only=True)
        silence = check_silence(raw, str(raw_path), 64).transpose(1, 2)

    transformer_config = configs[TRANSFORMER]
    config = official_config_from_diffusers(configs)
    _, layout = dit_variant(config)
    kind, _ = dit_variant(
        {
            "model_version": transformer_config.get("model_version"),
            "is_turbo": transformer_config.get("is_turbo"),
        },
        folder.name,
    )
    variant = VariantInfo(kind, layout, "diffusers", window_rule)
    return finish_models(parts, silence, config, variant, folder, device, dtype)


# --------------------------------------------------------------------------- writing


def _base_state(module: torch.nn.Module, component: str) -> dict[str, torch.Tensor]:
    state = module.state_dict()
    adapter_keys = [key for key in state if "lora_" in key or ".base_layer." in key]
    if adapter_keys:
        raise ValueError(
            f"{component} carries adapter weights ({adapter_keys[0]}, ...); "
            "write base checkpoints from an un-adapted model"
        )
    return state


def save_official(models: AceStepModels, folder: str | Path) -> Path:
    """Write the official layout: config.json, model.safetensors, silence_latent.pt."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    parts = {name: _base_state(module, name) for name, module in models.components().items()}
    merged = merge_to_official_state_dict(parts)
    tensors = {key: value.detach().cpu().contiguous() for key, value in sorted(merged.items())}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(models.config, indent=2, sort_keys=True) + "\n")
    # Official file layout is [1, 64, N] float32 (loaders transpose it to [1, N, 64]).
    silence = models.silence_latent.detach().float().cpu().transpose(1, 2).contiguous()
    torch.save(silence, folder / "silence_latent.pt")
    return folder


def save_diffusers(models: AceStepModels, folder: str | Path) -> Path:
    """Write the diffusers layout (one `save_pretrained` subfolder per component)."""
    folder = Path(folder)
    window = int(models.config.get("sliding_window", 128))
    for name, module in models.components().items():
        _base_state(module, name)
        sub = folder / DIFFUSERS_SUBFOLDERS[name]
        module.save_pretrained(str(sub), safe_serialization=True)
        # A "flash" window rule built the modules with w - 1; the file keeps the checkpoint's w.
        config_path = sub / "config.json"
        config = json.loads(config_path.read_text())
        config["sliding_window"] = window
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return folder
