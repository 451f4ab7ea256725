"""Find the checkpoints a stage needs under one `checkpoints/` folder, reading only file headers.

Layout (the official downloader's):
  acestep-v15-{turbo,base,sft,xl-turbo,...}/  config.json, model.safetensors, silence_latent.pt
  vae/                                       config.json, diffusion_pytorch_model.safetensors
  Qwen3-Embedding-0.6B/                      config.json, model.safetensors, tokenizer files
  acestep-5Hz-lm-{0.6B,1.7B,4B}/             config.json, model*.safetensors (maybe sharded)
plus diffusers-format pipeline folders (transformer/, condition_encoder/, ... , vae/, text_encoder/).

MM3 guard: a MiniMax-Music3 folder (its `modular_model_index.json`, or a transformer/config.json
naming `MiniMaxMusic3Transformer1DModel`) also has `transformer/config.json`, so it is checked
FIRST and reported as kind `mm3`, never as an ACE DiT; the `mm3/` folder (`mm3/<name>/`, where
`hotstep_ray.mm3.checkpoint` looks) is scanned one level down. No ACE stage needs kind `mm3`, so
an MM3-only install lists its MM3 folder and the ACE stages as missing, without raising.
"""

from __future__ import annotations

import json
import os
import struct
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hotstep_ray.models.acestep_keys import DIFFUSERS_SUBFOLDERS, dit_variant, variant_name
from hotstep_ray.models.errors import CheckpointError

# safetensors dtype tags -> torch names. Anything outside FLOAT_DTYPES is a quantized or integer
# tensor: a DiT or LM stored that way cannot take a LoRA/LoKr adapter.
SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
}
FLOAT_DTYPES = {"F64", "F32", "F16", "BF16"}
_MAX_HEADER_BYTES = 100 * 1024 * 1024

STAGE_NEEDS: dict[str, tuple[str, ...]] = {
    "preprocess": ("dit", "vae", "text_encoder"),
    "train-dit": ("dit",),
    "train-lm": ("lm",),
    "audition": ("dit", "vae"),
}
STAGE_OPTIONAL: dict[str, tuple[str, ...]] = {"audition": ("lm",)}
_LM_SIZES = {1024: "0.6B", 2048: "1.7B", 2560: "4B"}


def read_safetensors_header(path: str | os.PathLike) -> dict[str, dict[str, Any]]:
    """Tensor name -> {"dtype", "shape", "data_offsets"} from a safetensors file, reading only
    its header. Raises CheckpointError if the file is truncated or not safetensors."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    size = path.stat().st_size
    if size < 8:
        raise CheckpointError(f"{path}: {size} bytes, too short for a safetensors file (truncated)")
    with path.open("rb") as handle:
        (header_len,) = struct.unpack("<Q", handle.read(8))
        if header_len > min(size - 8, _MAX_HEADER_BYTES):
            raise CheckpointError(
                f"{path}: header claims {header_len} bytes but the file has {size} "
                "(truncated or not safetensors)"
            )
        try:
            header = json.loads(handle.read(header_len))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{path}: unreadable safetensors header ({exc})") from exc
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: safetensors header is not a JSON object")
    header.pop("__metadata__", None)
    data_bytes = max((int(entry["data_offsets"][1]) for entry in header.values()), default=0)
    expected = 8 + header_len + data_bytes
    if expected > size:
        raise CheckpointError(
            f"{path}: truncated: tensors need {expected} bytes, file has {size} "
            f"({expected - size} missing)"
        )
    return header


def weight_files(folder: Path, stem: str) -> tuple[list[Path], list[str]]:
    """`<stem>.safetensors`, or the shards listed in `<stem>.safetensors.index.json`.
    Returns (files that exist, problems)."""
    single = folder / f"{stem}.safetensors"
    index = folder / f"{stem}.safetensors.index.json"
    if single.is_file():
        return [single], []
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError) as exc:
            return [], [f"{index.name}: unreadable shard index ({exc})"]
        names = sorted(set(weight_map.values()))
        missing = [name for name in names if not (folder / name).is_file()]
        problems = [f"missing shard {name}" for name in missing]
        return [folder / name for name in names if name not in missing], problems
    return [], [f"missing {single.name}"]


def tally_dtypes(files: list[Path]) -> tuple[Counter, list[str]]:
    """Bytes per safetensors dtype tag over `files`, plus problems (truncated/unreadable)."""
    bytes_by_dtype: Counter = Counter()
    problems: list[str] = []
    for path in files:
        try:
            header = read_safetensors_header(path)
        except CheckpointError as exc:
            problems.append(str(exc))
            continue
        for entry in header.values():
            start, end = entry["data_offsets"]
            bytes_by_dtype[entry["dtype"]] += int(end) - int(start)
    return bytes_by_dtype, problems


def describe_dtypes(bytes_by_dtype: Counter) -> str | None:
    """`bfloat16`, or `bfloat16+float32` when a second dtype holds more than 1 % of the bytes."""
    total = sum(bytes_by_dtype.values())
    if not total:
        return None
    names = [
        SAFETENSORS_DTYPES.get(tag, tag.lower())
        for tag, count in bytes_by_dtype.most_common()
        if count > 0.01 * total
    ]
    return "+".join(names)


def quantized_tags(bytes_by_dtype: Counter) -> list[str]:
    return sorted(tag for tag in bytes_by_dtype if tag not in FLOAT_DTYPES)


def folder_size(folder: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += (Path(root) / name).stat().st_size
            except OSError:  # a dangling symlink counts as nothing
                continue
    return total


@dataclass
class ComponentInfo:
    name: str  # folder name relative to the checkpoints dir
    path: str
    kind: str  # dit | vae | text_encoder | lm
    format: str  # official | diffusers | transformers
    variant: str | None = None  # dit: turbo/base/sft/xl-*; lm: 0.6B/1.7B/4B
    layout: str | None = None  # dit: 2b | xl
    dtype: str | None = None
    size_bytes: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def usable(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "usable": self.usable}


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _check_weights(info: ComponentInfo, files: list[Path], adapters: bool) -> None:
    bytes_by_dtype, problems = tally_dtypes(files)
    info.problems.extend(problems)
    info.dtype = describe_dtypes(bytes_by_dtype)
    quantized = quantized_tags(bytes_by_dtype)
    if adapters and quantized:
        info.problems.append(
            f"quantized/integer weights ({', '.join(quantized)}) cannot take adapters"
        )


def _official_dit(folder: Path, config: dict[str, Any]) -> ComponentInfo:
    kind, layout = dit_variant(config, folder.name)
    info = ComponentInfo(
        name=folder.name,
        path=str(folder),
        kind="dit",
        format="official",
        variant=variant_name(kind, layout),
        layout=layout,
    )
    files, problems = weight_files(folder, "model")
    info.problems.extend(problems)
    if not (folder / "silence_latent.pt").is_file():
        info.problems.append("missing silence_latent.pt")
    _check_weights(info, files, adapters=True)
    return info


def _diffusers_pipeline(folder: Path) -> list[ComponentInfo]:
    dit_config = _read_json(folder / "transformer" / "config.json") or {}
    enc_config = _read_json(folder / "condition_encoder" / "config.json") or {}
    layout = (
        "xl"
        if dit_config.get("encoder_hidden_size") not in (None, dit_config.get("hidden_size"))
        else "2b"
    )
    pseudo = {
        "model_version": dit_config.get("model_version"),
        "is_turbo": dit_config.get("is_turbo"),
    }
    kind, _ = dit_variant(pseudo, folder.name)
    dit = ComponentInfo(
        name=folder.name,
        path=str(folder),
        kind="dit",
        format="diffusers",
        variant=variant_name(kind, layout),
        layout=layout,
    )
    files: list[Path] = []
    for subfolder in DIFFUSERS_SUBFOLDERS.values():
        found, problems = weight_files(folder / subfolder, "diffusion_pytorch_model")
        files += found
        dit.problems += [f"{subfolder}: {problem}" for problem in problems]
    if not enc_config:
        dit.problems.append("condition_encoder/config.json missing")
    _check_weights(dit, files, adapters=True)
    found = [dit]
    if (folder / "vae" / "config.json").is_file():
        found.append(_vae(folder / "vae", name=f"{folder.name}/vae"))
    if (folder / "text_encoder" / "config.json").is_file():
        found.append(_text_encoder(folder / "text_encoder", name=f"{folder.name}/text_encoder"))
    return found


def _vae(folder: Path, name: str | None = None) -> ComponentInfo:
    info = ComponentInfo(name=name or folder.name, path=str(folder), kind="vae", format="diffusers")
    files, problems = weight_files(folder, "diffusion_pytorch_model")
    info.problems.extend(problems)
    _check_weights(info, files, adapters=False)
    return info


def _tokenizer_problems(folder: Path) -> list[str]:
    if (folder / "tokenizer.json").is_file() or (folder / "vocab.json").is_file():
        return []
    return ["missing tokenizer.json"]


def _text_encoder(folder: Path, name: str | None = None) -> ComponentInfo:
    info = ComponentInfo(
        name=name or folder.name, path=str(folder), kind="text_encoder", format="transformers"
    )
    files, problems = weight_files(folder, "model")
    info.problems.extend(problems + _tokenizer_problems(folder))
    _check_weights(info, files, adapters=False)
    return info


def _lm(folder: Path, config: dict[str, Any]) -> ComponentInfo:
    size = next((s for s in ("0.6B", "1.7B", "4B") if folder.name.endswith(s)), None)
    info = ComponentInfo(
        name=folder.name,
        path=str(folder),
        kind="lm",
        format="transformers",
        variant=size or _LM_SIZES.get(int(config.get("hidden_size", 0))),
    )
    files, problems = weight_files(folder, "model")
    info.problems.extend(problems + _tokenizer_problems(folder))
    _check_weights(info, files, adapters=True)
    return info


MM3_SUBDIR = "mm3"
_MM3_INDEX = "modular_model_index.json"
_MM3_DIT_CLASS = "MiniMaxMusic3Transformer1DModel"


def is_mm3_folder(folder: Path) -> bool:
    """A MiniMax-Music3 diffusers folder (the same test as `mm3.checkpoint.is_mm3_folder`,
    without importing torch)."""
    index = _read_json(folder / _MM3_INDEX) or {}
    if "MiniMaxMusic3" in str(index.get("_class_name", "")):
        return True
    config = _read_json(folder / "transformer" / "config.json") or {}
    return config.get("_class_name") == _MM3_DIT_CLASS


def _mm3(folder: Path, name: str) -> ComponentInfo:
    """Kind `mm3`: usable when the DiT's weights are complete (what train-dit needs; the other
    parts are checked by `mm3.checkpoint.Mm3Paths.require` per stage)."""
    info = ComponentInfo(name=name, path=str(folder), kind="mm3", format="diffusers")
    config = _read_json(folder / "transformer" / "config.json") or {}
    if config.get("_class_name") != _MM3_DIT_CLASS:
        info.problems.append(f"transformer/config.json does not name {_MM3_DIT_CLASS}")
    files, problems = weight_files(folder / "transformer", "diffusion_pytorch_model")
    info.problems += [f"transformer: {problem}" for problem in problems]
    _check_weights(info, files, adapters=True)
    return info


def _classify(folder: Path) -> list[ComponentInfo]:
    name = folder.name
    if is_mm3_folder(folder):  # before the ACE diffusers test: MM3 has transformer/ too
        return [_mm3(folder, name)]
    if name == MM3_SUBDIR:
        return [
            _mm3(sub, f"{name}/{sub.name}")
            for sub in sorted(p for p in folder.iterdir() if p.is_dir())
            if is_mm3_folder(sub)
        ]
    if (folder / "transformer" / "config.json").is_file():
        return _diffusers_pipeline(folder)
    if list(folder.glob("*.gguf")) and not list(folder.glob("*.safetensors")):
        kind = "lm" if "lm" in name.lower() else "dit"
        return [
            ComponentInfo(
                name=name,
                path=str(folder),
                kind=kind,
                format="gguf",
                dtype="gguf",
                size_bytes=folder_size(folder),
                problems=[
                    "GGUF (quantized) weights cannot take adapters; use the safetensors release"
                ],
            )
        ]
    config = _read_json(folder / "config.json")
    if config is None:
        guessed = _guess_kind(name)
        if guessed is None:
            return []
        return [
            ComponentInfo(
                name=name,
                path=str(folder),
                kind=guessed,
                format="official",
                size_bytes=folder_size(folder),
                problems=["missing or unreadable config.json"],
            )
        ]
    if config.get("model_type") == "acestep":
        return [_official_dit(folder, config)]
    if config.get("_class_name") == "AutoencoderOobleck":
        return [_vae(folder)]
    # The embedding model's own config may name a CausalLM architecture: trust the folder name
    # first, then the architecture list.
    if "embedding" in name.lower() and config.get("model_type") == "qwen3":
        return [_text_encoder(folder)]
    architectures = " ".join(config.get("architectures") or [])
    if "CausalLM" in architectures or name.lower().startswith("acestep-5hz-lm"):
        return [_lm(folder, config)]
    if config.get("model_type") == "qwen3":
        return [_text_encoder(folder)]
    return []


def _guess_kind(name: str) -> str | None:
    lowered = name.lower()
    if lowered.startswith("acestep-v15"):
        return "dit"
    if lowered.startswith("acestep-5hz-lm"):
        return "lm"
    if lowered == "vae":
        return "vae"
    if lowered.startswith("qwen3-embedding"):
        return "text_encoder"
    return None


def discover(checkpoints_dir: str | os.PathLike) -> list[ComponentInfo]:
    """Every checkpoint component directly under `checkpoints_dir`, sorted by folder name."""
    root = Path(checkpoints_dir)
    if not root.is_dir():
        raise CheckpointError(f"{root}: checkpoints folder not found")
    found: list[ComponentInfo] = []
    for folder in sorted(path for path in root.iterdir() if path.is_dir()):
        for info in _classify(folder):
            if not info.size_bytes:
                info.size_bytes = folder_size(Path(info.path))
            found.append(info)
    return found


def missing_for_stages(components: list[ComponentInfo]) -> dict[str, list[str]]:
    """Stage -> component kinds it needs that no usable component provides (empty = ready).
    Optional kinds are listed as `lm (optional)`."""
    have = {info.kind for info in components if info.usable}
    report: dict[str, list[str]] = {}
    for stage, needs in STAGE_NEEDS.items():
        missing = [kind for kind in needs if kind not in have]
        missing += [
            f"{kind} (optional)" for kind in STAGE_OPTIONAL.get(stage, ()) if kind not in have
        ]
        report[stage] = missing
    return report
