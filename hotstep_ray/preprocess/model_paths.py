"""Which checkpoint folders a preprocessing run uses, and their fingerprint.

Header reads only (no torch/diffusers import): the driver and the Ray decode/write workers
import this, and only the encoder actors pay for loading the model libraries.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from hotstep_ray.core.contracts import PreprocessOptions
from hotstep_ray.core.errors import InputError
from hotstep_ray.models.discovery import ComponentInfo, discover

_VARIANT_KEY_BAD = re.compile(r"[^A-Za-z0-9._-]")
# Bytes hashed from the start and the end of each weight file (after its header) for the
# fingerprint: cheap on a 4.8 GB file, and any re-export or fine-tune changes them.
_SAMPLE_BYTES = 1 << 20


@dataclass(frozen=True)
class ModelPaths:
    dit: str  # DiT folder (official or diffusers layout)
    vae: str
    text_encoder: str
    variant_key: str  # tensors/<slug>/<variant_key>/
    model_variant: str  # turbo | base | sft | xl-turbo | ...

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def sanitize_variant_key(name: str) -> str:
    """A DiT folder name as a storage folder name: `[A-Za-z0-9._-]`, at most 64, no lead dot."""
    key = _VARIANT_KEY_BAD.sub("_", name).lstrip(".")[:64]
    return key or "dit"


def _pick(found: list[ComponentInfo], kind: str, wanted: str, root: Path) -> ComponentInfo | None:
    usable = [info for info in found if info.kind == kind and info.usable]
    if not wanted:
        return usable[0] if usable else None
    path = Path(wanted).expanduser()
    if not path.is_absolute():
        path = root / wanted
    for info in usable:
        if Path(info.path) == path or info.name == wanted or info.variant == wanted:
            return info
    # `--variant turbo` -> acestep-v15-turbo
    for info in usable:
        if kind == "dit" and info.name in (f"acestep-v15-{wanted}", wanted):
            return info
    return None


def resolve_models(checkpoints_dir: str | Path, options: PreprocessOptions) -> ModelPaths:
    """The DiT, VAE and text encoder a run uses. `dit_model` may be a folder name, a path, or a
    variant name ("turbo", "xl-sft"); "" takes the first usable DiT. A diffusers-format DiT folder
    supplies its own `vae/` and `text_encoder/` unless others are named."""
    root = Path(checkpoints_dir).expanduser()
    found = discover(root)
    for wanted in (options.dit_model, options.vae_model, options.text_encoder):
        outside = Path(wanted).expanduser() if wanted else None
        if outside and outside.is_absolute() and outside.is_dir() and outside.parent != root:
            # A folder given by absolute path elsewhere: classify it as discovery would.
            found += [i for i in discover(outside.parent) if Path(i.path) == outside]
    dit = _pick(found, "dit", options.dit_model, root)
    if dit is None:
        names = [f"{i.name} ({i.variant})" for i in found if i.kind == "dit"]
        want = options.dit_model or "any DiT"
        raise InputError(f"no usable DiT for {want!r} under {root}; found {names or 'none'}")
    own = [info for info in found if info.name.startswith(f"{dit.name}/")]
    vae = _pick(own if not options.vae_model and own else found, "vae", options.vae_model, root)
    text = _pick(
        own if not options.text_encoder and own else found,
        "text_encoder",
        options.text_encoder,
        root,
    )
    if vae is None or text is None:
        missing = [name for name, info in (("vae", vae), ("text encoder", text)) if info is None]
        raise InputError(f"no usable {' or '.join(missing)} under {root}")
    key = sanitize_variant_key(options.output_dir or dit.name)
    return ModelPaths(dit.path, vae.path, text.path, key, dit.variant or "unknown")


def _file_digest(path: Path, digest: hashlib._Hash) -> None:
    size = path.stat().st_size
    digest.update(f"{path.name}:{size}".encode())
    with path.open("rb") as handle:
        if path.suffix == ".safetensors":
            header = int.from_bytes(handle.read(8), "little")
            handle.seek(0)
            digest.update(handle.read(min(8 + header, size)))  # names, dtypes, shapes, offsets
        else:
            digest.update(handle.read(_SAMPLE_BYTES))
        handle.seek(max(0, size - _SAMPLE_BYTES))
        digest.update(handle.read(_SAMPLE_BYTES))


def model_fingerprint(paths: ModelPaths) -> str:
    """sha256 (first 16 hex) over the three folders' config files, weight headers and the first
    and last MiB of every weight / silence file. Same checkpoint -> same fingerprint anywhere."""
    digest = hashlib.sha256()
    for folder in (paths.dit, paths.vae, paths.text_encoder):
        for path in sorted(Path(folder).rglob("*")):
            if path.is_file() and path.suffix in (".json", ".safetensors", ".pt"):
                digest.update(str(path.relative_to(folder)).encode())
                _file_digest(path, digest)
    return digest.hexdigest()[:16]
