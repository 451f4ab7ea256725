"""Pick the checkpoint folders an audition component needs, and load only what it uses.

The codes decoder needs the FSQ quantizer (inside the DiT's audio tokenizer) and the detokenizer,
not the 2B transformer, so `load_codes_parts` reads just those tensors from the DiT file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from hotstep_ray.models.acestep_keys import (
    AUDIO_TOKENIZER,
    DETOKENIZER,
    DIFFUSERS_SUBFOLDERS,
    diffusers_kwargs,
    official_to_diffusers_key,
)
from hotstep_ray.models.discovery import ComponentInfo, discover, weight_files
from hotstep_ray.models.errors import CheckpointError

if TYPE_CHECKING:  # torch/diffusers load lazily: `pick` serves the light HTTP ingress too
    import torch

# When no DiT is named: a turbo first (what the audition renders with), then anything usable.
_DIT_PREFERENCE = ("turbo", "xl-turbo", "sft", "base", "xl-sft", "xl-base")


def pick(checkpoints: str | Path, kind: str, name: str | None = None) -> ComponentInfo:
    """The usable component of `kind` ("dit", "vae", "lm", "text_encoder") named `name` (a
    folder under `checkpoints`), else the preferred one; CheckpointError when none."""
    found = [c for c in discover(checkpoints) if c.kind == kind]
    if name:
        for info in found:
            if info.name == name or Path(info.path).name == name:
                if not info.usable:
                    raise CheckpointError(f"{info.path}: {'; '.join(info.problems)}")
                return info
        raise CheckpointError(f"{checkpoints}: no {kind} folder named {name!r}")
    usable = [c for c in found if c.usable]
    if not usable:
        raise CheckpointError(f"{checkpoints}: no usable {kind} checkpoint")
    if kind == "dit":
        usable.sort(
            key=lambda c: (
                _DIT_PREFERENCE.index(c.variant)
                if c.variant in _DIT_PREFERENCE
                else len(_DIT_PREFERENCE)
            )
        )
    return usable[0]


def load_codes_parts(
    dit_folder: str | Path,
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(FSQ quantizer, detokenizer) of an official or diffusers DiT folder, nothing else."""
    from safetensors import safe_open

    from hotstep_ray.models.acestep_dit import (
        build_component,
        check_keys,
        fill_weights,
        resolve_device_dtype,
    )

    folder = Path(dit_folder)
    device, dtype = resolve_device_dtype(device, dtype)
    shapes: dict[str, tuple[int, ...]] = {}  # name in the file -> shape (read with the key list)
    if (folder / "config.json").is_file():
        config = json.loads((folder / "config.json").read_text())
        kwargs = diffusers_kwargs(config, source=str(folder / "config.json"))
        files, problems = weight_files(folder, "model")
        if problems:
            raise CheckpointError(f"{folder}: {'; '.join(problems)}")
        wanted: dict[str, dict[str, tuple[Path, str]]] = {AUDIO_TOKENIZER: {}, DETOKENIZER: {}}
        for path in files:
            with safe_open(str(path), framework="pt", device="cpu") as handle:
                for key in handle.keys():
                    if not key.startswith(("tokenizer.quantizer.", "detokenizer.")):
                        continue
                    component, ours = official_to_diffusers_key(key)
                    wanted[component][ours] = (path, key)
                    shapes[key] = tuple(handle.get_slice(key).get_shape())
    elif (folder / DIFFUSERS_SUBFOLDERS[DETOKENIZER] / "config.json").is_file():
        kwargs, wanted = {}, {}
        for component in (AUDIO_TOKENIZER, DETOKENIZER):
            sub = folder / DIFFUSERS_SUBFOLDERS[component]
            config = json.loads((sub / "config.json").read_text())
            kwargs[component] = {k: v for k, v in config.items() if not k.startswith("_")}
            files, problems = weight_files(sub, "diffusion_pytorch_model")
            if problems:
                raise CheckpointError(f"{sub}: {'; '.join(problems)}")
            wanted[component] = {}
            for path in files:
                with safe_open(str(path), framework="pt", device="cpu") as handle:
                    for key in handle.keys():
                        if component == DETOKENIZER or key.startswith("quantizer."):
                            wanted[component][key] = (path, key)
                            shapes[key] = tuple(handle.get_slice(key).get_shape())
    else:
        raise CheckpointError(f"{folder}: not an ACE-Step DiT folder (no config.json)")

    quantizer = build_component(AUDIO_TOKENIZER, kwargs[AUDIO_TOKENIZER]).quantizer
    detokenizer = build_component(DETOKENIZER, kwargs[DETOKENIZER])
    for component, module, strip in (
        (AUDIO_TOKENIZER, quantizer, "quantizer."),
        (DETOKENIZER, detokenizer, ""),
    ):
        tensors = {ours.removeprefix(strip): spec for ours, spec in wanted[component].items()}
        found = {ours: (theirs, shapes[theirs]) for ours, (_, theirs) in tensors.items()}
        check_keys(module, found, component, str(folder))
        fill_weights(module, tensors, device, dtype)
        module.to(device).eval().requires_grad_(False)
    return quantizer, detokenizer
