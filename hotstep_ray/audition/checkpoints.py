"""Pick the checkpoint folders an audition component needs, and load only what it uses.

The codes decoder needs the FSQ quantizer (inside the DiT's audio tokenizer) and the detokenizer,
not the 2B transformer, so `load_codes_parts` reads just those tensors from the DiT file.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

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


def _build(component: str, kwargs: dict[str, Any]) -> torch.nn.Module:
    from accelerate import init_empty_weights

    from hotstep_ray.models.acestep_dit import MODEL_CLASSES

    cls = MODEL_CLASSES[component]
    accepted = set(inspect.signature(cls.__init__).parameters)
    with init_empty_weights(include_buffers=False):  # FSQ buffers are rebuilt, never saved
        return cls(**{k: v for k, v in kwargs.items() if k in accepted})


def _fill(module: torch.nn.Module, tensors: dict[str, torch.Tensor], where: str) -> None:
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    missing = sorted(set(expected) - set(tensors))
    wrong = [k for k in expected if k in tensors and tuple(tensors[k].shape) != expected[k]]
    if missing or wrong:
        raise CheckpointError(f"{where}: missing {missing[:3]} / wrong shape {wrong[:3]}")
    module.load_state_dict({k: tensors[k] for k in expected}, strict=True, assign=True)


def _read(path: Path, names: dict[str, str], device: torch.device, dtype: torch.dtype):
    """{our name: tensor} for {our name: name in file}, read straight onto `device`."""
    from safetensors import safe_open

    out = {}
    with safe_open(str(path), framework="pt", device=str(device)) as handle:
        for ours, theirs in names.items():
            out[ours] = handle.get_tensor(theirs).to(dtype)
    return out


def load_codes_parts(
    dit_folder: str | Path,
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(FSQ quantizer, detokenizer) of an official or diffusers DiT folder, nothing else."""
    from safetensors import safe_open

    from hotstep_ray.models.acestep_dit import resolve_device_dtype

    folder = Path(dit_folder)
    device, dtype = resolve_device_dtype(device, dtype)
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
    else:
        raise CheckpointError(f"{folder}: not an ACE-Step DiT folder (no config.json)")

    tokenizer = _build(AUDIO_TOKENIZER, kwargs[AUDIO_TOKENIZER])
    quantizer = tokenizer.quantizer
    detokenizer = _build(DETOKENIZER, kwargs[DETOKENIZER])
    for component, module, strip in (
        (AUDIO_TOKENIZER, quantizer, "quantizer."),
        (DETOKENIZER, detokenizer, ""),
    ):
        tensors: dict[str, torch.Tensor] = {}
        by_file: dict[Path, dict[str, str]] = {}
        for ours, (path, theirs) in wanted[component].items():
            by_file.setdefault(path, {})[ours.removeprefix(strip)] = theirs
        for path, names in by_file.items():
            tensors.update(_read(path, names, device, dtype))
        _fill(module, tensors, f"{folder} ({component})")
        module.to(device).eval().requires_grad_(False)
    return quantizer, detokenizer
