"""Write a random-initialised ACE-Step 1.5 checkpoint tree in the official layout, full size:

  acestep-v15-turbo/ (2B) or acestep-v15-xl-turbo/   config.json, model.safetensors,
                                                      silence_latent.pt
  vae/                                                config.json, diffusion_pytorch_model.safetensors
  Qwen3-Embedding-0.6B/                               config.json, model.safetensors, tokenizer
  acestep-5Hz-lm-<0.6B|1.7B|4B>/                      config.json, model.safetensors, tokenizer

For benchmarks and dry runs on machines without the released weights: every stage loads it
through the same code as real weights, and its shapes (so its memory and speed) are the real ones.
The configs come in as data (`TreeConfigs`; `tree_configs` picks `full_configs`' official ones),
so the same writer writes tiny trees in tests. Each part is built by `full_configs.build_*`
(the loaders' own classes and config mapping, seeded random values), saved as the official
files, then checked by the loaders' own key checks against what was written (safetensors headers
only: every tensor present with its shape, nothing unknown) and by `discovery` (what `models list`
reports). Same seed, dtype and device kind => the same values.

The tree is written into `<DIR>.partial/` beside DIR and moved into place only when every part
is written and checked, so an interrupted run never leaves a DIR that looks complete; a failed
or interrupted run removes its partial folder.
"""

from __future__ import annotations

import copy
import gc
import json
import os
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from diffusers import AutoencoderOobleck
from safetensors.torch import save_file
from transformers import Qwen3ForCausalLM, Qwen3Model

from hotstep_ray.core.contracts import MakeRandomOptions
from hotstep_ray.core.errors import InputError
from hotstep_ray.models import acestep_dit, discovery, full_configs, lm_tokenizer, text_models
from hotstep_ray.models.acestep_keys import (
    COMPONENTS,
    CONDITION_ENCODER,
    diffusers_kwargs,
    dit_variant,
    official_to_diffusers_key,
    variant_name,
)
from hotstep_ray.models.errors import CheckpointError

Say = Callable[[str], None]
# Options' dtype names -> torch dtypes and the names config.json files use.
DTYPES: dict[str, tuple[torch.dtype, str]] = {
    "bf16": (torch.bfloat16, "bfloat16"),
    "fp16": (torch.float16, "float16"),
    "fp32": (torch.float32, "float32"),
}
# Added to the seed per part, as `tiny_tree` does, so the parts never share a random stream.
SEED_OFFSETS = {"vae": 1, "text_encoder": 2, "lm": 3}
SILENCE_FRAMES = 15000  # the released silence_latent.pt: 600 s at 25 frames/s
# Bytes per part beyond its weights, for the free-space check: the tokenizer files (under 50 MB
# in the LM's folder, under 20 MB in the text encoder's), the silence latent (15000 x 64 float32
# = 3.8 MB), config files.
_EXTRA_BYTES = 64 * 1024**2
PARTIAL_SUFFIX = ".partial"


@dataclass(frozen=True)
class TreeConfigs:
    """The config.json dict of each part to write (None = not written). `lm_size` names the
    LM folder (`acestep-5Hz-lm-<size>`)."""

    dit: dict[str, Any] | None = None
    vae: dict[str, Any] | None = None
    text_encoder: dict[str, Any] | None = None
    lm: dict[str, Any] | None = None
    lm_size: str = ""


def tree_configs(options: MakeRandomOptions) -> TreeConfigs:
    """The official full-size configs of the parts `options` asks for."""
    lm = options.lm != "none"
    return TreeConfigs(
        dit=full_configs.dit_config(options.dit) if options.dit != "none" else None,
        vae=copy.deepcopy(full_configs.VAE_CONFIG) if options.vae else None,
        text_encoder=copy.deepcopy(full_configs.TEXT_ENCODER_CONFIG)
        if options.text_encoder
        else None,
        lm=copy.deepcopy(full_configs.LM_CONFIGS[options.lm]) if lm else None,
        lm_size=options.lm if lm else "",
    )


def dit_folder_name(config: dict[str, Any]) -> str:
    """`acestep-v15-turbo`, `acestep-v15-xl-turbo`, ...: the released folder of its variant."""
    return f"acestep-v15-{variant_name(*dit_variant(config))}"


@dataclass(frozen=True)
class Part:
    """One folder of the tree: its kind (as `discovery` names it), config and parameters."""

    kind: str  # dit | vae | text_encoder | lm
    folder: str
    config: dict[str, Any]
    params: int


def plan_parts(configs: TreeConfigs) -> list[Part]:
    """The parts to write, in order, with their parameter counts (meta device: no memory)."""
    parts = []
    if configs.dit is not None:
        params = full_configs.dit_param_counts(configs.dit)["total"]
        parts.append(Part("dit", dit_folder_name(configs.dit), configs.dit, params))
    if configs.vae is not None:
        params = full_configs.meta_param_count("vae", configs.vae)
        parts.append(Part("vae", text_models.VAE_DIR, configs.vae, params))
    if configs.text_encoder is not None:
        params = full_configs.meta_param_count("text_encoder", configs.text_encoder)
        folder = text_models.TEXT_ENCODER_DIR
        parts.append(Part("text_encoder", folder, configs.text_encoder, params))
    if configs.lm is not None:
        if configs.lm_size not in text_models.LM_DIRS:
            raise InputError(
                f"LM size {configs.lm_size!r}: expected one of {list(text_models.LM_DIRS)}"
            )
        params = full_configs.meta_param_count("lm", configs.lm)
        parts.append(Part("lm", text_models.LM_DIRS[configs.lm_size], configs.lm, params))
    if not parts:
        raise InputError("nothing to write: every part is switched off")
    return parts


def _gb(num_bytes: float) -> str:
    return f"{num_bytes / 1e9:.2f} GB" if num_bytes >= 1e9 else f"{num_bytes / 1e6:.1f} MB"


# --------------------------------------------------------------------------- writing parts


def _with_dtype(config: dict[str, Any], key: str, dtype_name: str) -> dict[str, Any]:
    """A copy of `config` whose dtype entry names what the weights are stored in."""
    return {**copy.deepcopy(config), key: dtype_name}


def _write_json(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _save(state: dict[str, torch.Tensor], path: Path) -> None:
    tensors = {name: tensor.detach().contiguous() for name, tensor in sorted(state.items())}
    save_file(tensors, str(path), metadata={"format": "pt"})


def _readable(folder: Path) -> None:
    """Files as the umask allows: safetensors creates its files owner-only, and a checkpoint
    tree is often read by other users' jobs."""
    umask = os.umask(0)
    os.umask(umask)
    for path in folder.iterdir():
        path.chmod(0o666 & ~umask)


def write_dit(part: Part, folder: Path, seed: int, device: torch.device, dtype: str) -> None:
    torch_dtype, name = DTYPES[dtype]
    config = _with_dtype(part.config, "dtype", name)
    models = full_configs.build_dit(
        config, device, torch_dtype, seed=seed, silence_frames=SILENCE_FRAMES
    )
    acestep_dit.save_official(models, folder)  # config.json, model.safetensors, silence_latent.pt


def write_vae(part: Part, folder: Path, seed: int, device: torch.device, dtype: str) -> None:
    model = full_configs.build_vae(part.config, device, DTYPES[dtype][0], seed=seed)
    folder.mkdir(parents=True)
    _save(model.state_dict(), folder / f"{text_models.VAE_WEIGHTS}.safetensors")
    _write_json(folder / "config.json", {"_class_name": "AutoencoderOobleck", **part.config})


def write_text_encoder(
    part: Part, folder: Path, seed: int, device: torch.device, dtype: str
) -> None:
    torch_dtype, name = DTYPES[dtype]
    model = full_configs.build_text_encoder(part.config, device, torch_dtype, seed=seed)
    lm_tokenizer.save_text_tokenizer(folder)
    _save(model.state_dict(), folder / "model.safetensors")  # bare Qwen3Model keys, as released
    _write_json(folder / "config.json", _with_dtype(part.config, "torch_dtype", name))


def write_lm(part: Part, folder: Path, seed: int, device: torch.device, dtype: str) -> None:
    torch_dtype, name = DTYPES[dtype]
    model = full_configs.build_lm(part.config, device, torch_dtype, seed=seed)
    state = model.state_dict()
    if model.config.tie_word_embeddings:  # the head is the embedding again: stored once
        state.pop("lm_head.weight", None)
    lm_tokenizer.save_lm_tokenizer(folder)
    _save(state, folder / "model.safetensors")  # "model."-prefixed keys
    _write_json(folder / "config.json", _with_dtype(part.config, "torch_dtype", name))


WRITERS = {"dit": write_dit, "vae": write_vae, "text_encoder": write_text_encoder, "lm": write_lm}


# --------------------------------------------------------------------------- checking parts
# The loaders' own checks (`acestep_dit._load_official`, `text_models.load_*`) on the written
# files, up to the point where they would read the tensors: they need no memory for weights.


def check_dit(folder: Path) -> int:
    """Official DiT folder: every key routed to a component, each component's keys and shapes
    as its model expects, a readable silence latent. Returns the tensor count."""
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    kwargs = diffusers_kwargs(config, source=str(config_path))
    files, problems = discovery.weight_files(folder, "model")
    if problems:
        raise CheckpointError(f"{folder}: " + "; ".join(problems))
    entries = acestep_dit.read_headers(files)
    routed: dict[str, dict[str, tuple[str, tuple[int, ...]]]] = {name: {} for name in COMPONENTS}
    for key, (_path, entry) in entries.items():
        try:
            component, ours = official_to_diffusers_key(key)
        except KeyError as exc:
            raise CheckpointError(f"{files[0]}: unexpected key {key} (no component)") from exc
        routed[component][ours] = (key, tuple(entry["shape"]))
    for component in COMPONENTS:
        model = acestep_dit.build_component(component, kwargs[component])
        optional = (acestep_dit.SILENCE_KEY,) if component == CONDITION_ENCODER else ()
        acestep_dit.check_keys(model, routed[component], component, str(files[0]), optional)
    silence_path = folder / "silence_latent.pt"
    silence = torch.load(silence_path, map_location="cpu", weights_only=True)
    channels = int(config.get("audio_acoustic_hidden_dim", 64))
    acestep_dit.check_silence(silence, str(silence_path), channels)
    return len(entries)


def _check_qwen(folder: Path, causal: bool) -> int:
    config = text_models._qwen3_config(folder, "5 Hz LM" if causal else "text encoder")
    with torch.device("meta"):
        model = Qwen3ForCausalLM(config) if causal else Qwen3Model(config)
    expected = {key: list(value.shape) for key, value in model.state_dict().items()}
    found = text_models._headers(folder, "model")
    if causal:
        tied = bool(config.tie_word_embeddings)
        if tied:
            expected.pop("lm_head.weight", None)
        rename = text_models._lm_rename(list(found), tied)
    else:
        rename = text_models._text_encoder_rename(list(found))
    hint = f"config.json: hidden_size={config.hidden_size}, vocab_size={config.vocab_size}"
    text_models._check_keys(folder, "model", expected, text_models._rename(found, rename), hint)
    return len(found)


def check_vae(folder: Path) -> int:
    raw = text_models._read_config(folder, "Oobleck VAE")
    with torch.device("meta"):
        model = AutoencoderOobleck.from_config(raw)
    expected = {key: list(value.shape) for key, value in model.state_dict().items()}
    found = text_models._headers(folder, text_models.VAE_WEIGHTS)
    hint = f"config.json: encoder_hidden_size={raw.get('encoder_hidden_size')}"
    text_models._check_keys(folder, text_models.VAE_WEIGHTS, expected, found, hint)
    return len(found)


CHECKS: dict[str, Callable[[Path], int]] = {
    "dit": check_dit,
    "vae": check_vae,
    "text_encoder": lambda folder: _check_qwen(folder, causal=False),
    "lm": lambda folder: _check_qwen(folder, causal=True),
}


def check_part(kind: str, folder: Path, dtype: str = "") -> int:
    """The loader's key check of `kind` on `folder`, then `discovery`'s view of it (the one
    `models list` prints): one usable component of that kind, stored in `dtype` when given.
    Returns the tensor count; raises CheckpointError."""
    count = CHECKS[kind](folder)
    found = [
        info
        for info in discovery.discover(folder.parent)
        if info.name == folder.name and info.kind == kind
    ]
    if len(found) != 1 or not found[0].usable:
        problems = "; ".join(p for info in found for p in info.problems) or "not recognised"
        raise CheckpointError(f"{folder}: not a usable {kind} ({problems})")
    if dtype and found[0].dtype != DTYPES[dtype][1]:
        raise CheckpointError(f"{folder}: stored as {found[0].dtype}, not {DTYPES[dtype][1]}")
    return count


# --------------------------------------------------------------------------- the tree


def _existing(root: Path) -> list[str]:
    if root.exists() and not root.is_dir():
        raise InputError(f"{root}: exists and is not a folder")
    return sorted(path.name for path in root.iterdir()) if root.is_dir() else []


def _check_space(where: Path, needed: int) -> None:
    free = shutil.disk_usage(where).free
    if free < needed:
        raise InputError(f"{where}: {_gb(free)} free, the tree needs {_gb(needed)}")


def _move_into_place(partial: Path, root: Path) -> None:
    """`partial` becomes `root` by one rename when `root` is absent or empty; otherwise (the
    --force case) each written folder replaces its namesake in `root` (other folders stay)."""
    if not _existing(root):
        if root.is_dir():
            root.rmdir()
        os.replace(partial, root)
        return
    for child in sorted(partial.iterdir()):
        target = root / child.name
        if target.exists():
            os.replace(target, partial / f".replaced-{child.name}")  # removed with `partial`
        os.replace(child, target)
    shutil.rmtree(partial)


def write_random_tree(
    root: str | Path,
    configs: TreeConfigs,
    *,
    seed: int = 0,
    dtype: str = "bf16",
    device: str = "",
    force: bool = False,
    say: Say = lambda message: None,
) -> Path:
    """Write the parts of `configs` under `root` (see the module docstring) and return `root`.
    A non-empty `root` is refused unless `force` (then the written folders replace their
    namesakes and every other folder stays). `device` draws the values ("" = CUDA when present)."""
    if dtype not in DTYPES:
        raise InputError(f"dtype {dtype!r}: expected one of {list(DTYPES)}")
    root = Path(root).absolute()
    existing = _existing(root)
    if existing and not force:
        shown = ", ".join(existing[:4]) + (", ..." if len(existing) > 4 else "")
        raise InputError(f"{root}: not empty ({shown}); pass --force to replace what it writes")
    torch_device, _ = acestep_dit.resolve_device_dtype(device or None, DTYPES[dtype][0])
    parts = plan_parts(configs)
    width = torch.finfo(DTYPES[dtype][0]).bits // 8
    needed = sum(part.params for part in parts) * width + _EXTRA_BYTES * len(parts)
    partial = root.with_name(root.name + PARTIAL_SUFFIX)
    if partial.exists():  # left by a run that was killed before it could clean up
        say(f"removing {partial} (an unfinished earlier run)")
        shutil.rmtree(partial)
    root.parent.mkdir(parents=True, exist_ok=True)
    _check_space(root.parent, needed)
    say(
        f"writing {len(parts)} parts ({_gb(needed)}, {dtype}, drawn on {torch_device}) into {partial}"
    )
    partial.mkdir()
    try:
        for index, part in enumerate(parts, 1):
            started = time.perf_counter()
            say(
                f"[{index}/{len(parts)}] {part.folder}: {part.kind}, "
                f"{part.params / 1e6:,.0f} M parameters ({_gb(part.params * width)})"
            )
            folder = partial / part.folder
            with warnings.catch_warnings():  # diffusers' weight_norm deprecation: not the user's
                warnings.simplefilter("ignore", FutureWarning)
                part_seed = seed + SEED_OFFSETS.get(part.kind, 0)
                WRITERS[part.kind](part, folder, part_seed, torch_device, dtype)
                gc.collect()  # the built model is gone: free its memory before the next part
                if torch_device.type == "cuda":
                    torch.cuda.empty_cache()
                tensors = check_part(part.kind, folder, dtype)
            _readable(folder)
            seconds = time.perf_counter() - started
            size = discovery.folder_size(folder)
            say(
                f"[{index}/{len(parts)}] {part.folder}: {_gb(size)} written, "
                f"{tensors} tensors pass the loader's key check ({seconds:.0f} s)"
            )
        _move_into_place(partial, root)
    except BaseException:  # Ctrl-C included: no half-written tree stays behind
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return root
