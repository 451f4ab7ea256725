"""Load only the DiT parts preprocessing needs: condition encoder, audio tokenizer, silence latent.

`load_acestep_dit` always builds the 1.6 B (2B) / 4.2 B (XL) decoder as well; preprocessing never
runs it, so `load_dit_encoders` reads only the `encoder.*`, `null_condition_emb` and
`tokenizer.*` tensors of an official `model.safetensors` (safetensors reads by offset: the decoder
bytes are never touched). It reuses the loader's own building blocks so a key or shape problem
fails the same way. The diffusers layout falls back to the full loader.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from hotstep_ray.models import acestep_dit
from hotstep_ray.models.acestep_keys import (
    AUDIO_TOKENIZER,
    CONDITION_ENCODER,
    diffusers_kwargs,
    dit_variant,
    official_to_diffusers_key,
    variant_name,
)
from hotstep_ray.models.acestep_wrappers import install_timbre_token, sliding_window_for_rule
from hotstep_ray.models.discovery import weight_files
from hotstep_ray.models.errors import CheckpointError


@dataclass
class DitEncoders:
    condition_encoder: torch.nn.Module
    audio_tokenizer: torch.nn.Module
    silence_latent: torch.Tensor  # [N, 64] float32 on the CPU (the file's 25 Hz silence frames)
    config: dict
    variant: str  # turbo | base | xl-turbo | ...


def encoders_from_models(models: acestep_dit.AceStepModels) -> DitEncoders:
    """The preprocessing parts of fully loaded (or `full_configs`-built) DiT models; the
    decoder and detokenizer are left for the garbage collector."""
    silence = models.silence_latent[0].detach().float().cpu()
    tokenizer = models.audio_tokenizer.to(torch.float32)
    return DitEncoders(
        models.condition_encoder, tokenizer, silence, models.config, models.variant.name
    )


def load_dit_encoders(folder: str | Path, device: torch.device, dtype: torch.dtype) -> DitEncoders:
    """Condition encoder (in `dtype`), audio tokenizer (always float32: the 5 Hz codes are an FSQ
    rounding of its output, so they are computed at full precision) and the silence latent."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():  # diffusers layout: the full loader, then drop
        return encoders_from_models(acestep_dit.load_acestep_dit(folder, device, dtype))
    config = json.loads((folder / "config.json").read_text())
    window = sliding_window_for_rule(int(config.get("sliding_window", 128)), "sdpa")
    kwargs = diffusers_kwargs(config, window, source=str(folder / "config.json"))
    files, problems = weight_files(folder, "model")
    if problems:
        raise CheckpointError(f"{folder}: " + "; ".join(problems))
    entries = acestep_dit.read_headers(files)
    routed: dict[str, dict[str, tuple[str, tuple[int, ...]]]] = {
        CONDITION_ENCODER: {},
        AUDIO_TOKENIZER: {},
    }
    for key, (_path, entry) in entries.items():
        try:
            component, ours = official_to_diffusers_key(key)
        except KeyError:
            continue  # the full loader reports strays; preprocessing does not need them
        if component in routed:
            routed[component][ours] = (key, tuple(entry["shape"]))
    parts: dict[str, torch.nn.Module] = {}
    source = ", ".join(str(path) for path in files)
    for component, part_dtype in ((CONDITION_ENCODER, dtype), (AUDIO_TOKENIZER, torch.float32)):
        model = acestep_dit.build_component(component, kwargs[component])
        optional = (acestep_dit.SILENCE_KEY,) if component == CONDITION_ENCODER else ()
        acestep_dit.check_keys(model, routed[component], component, source, optional)
        tensors = {ours: (entries[key][0], key) for ours, (key, _) in routed[component].items()}
        acestep_dit.fill_weights(model, tensors, device, part_dtype)
        model.to(device=device).eval().requires_grad_(False)
        parts[component] = model
    silence_path = folder / "silence_latent.pt"
    try:
        raw = torch.load(silence_path, map_location="cpu", weights_only=True)  # tensors only
    except Exception as exc:
        raise CheckpointError(f"{silence_path}: unreadable ({exc})") from exc
    channels = int(config.get("audio_acoustic_hidden_dim", 64))
    silence = acestep_dit.check_silence(raw, str(silence_path), channels).transpose(1, 2)
    encoder = parts[CONDITION_ENCODER]
    acestep_dit.set_silence(encoder, silence.to(device=device, dtype=dtype))
    kind, layout = dit_variant(config, folder.name)
    if layout == "xl":
        install_timbre_token(encoder)
    return DitEncoders(
        encoder, parts[AUDIO_TOKENIZER], silence[0].float(), config, variant_name(kind, layout)
    )
