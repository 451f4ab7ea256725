"""Find and load an MM3 checkpoint folder (the HF `MiniMaxAI/MiniMax-Music3` diffusers layout).

    <mm3>/modular_model_index.json
          tokenizer/            Qwen2Tokenizer (single-digit pre-tokenisation: seed trap 2)
          language_model/       transformers Qwen3ForCausalLM (8.59 B, vocab 200 k, untied head)
          rvq_depth_decoder/    diffusers MiniMaxMusic3RVQDepthDecoder
          condition_encoder/    diffusers MiniMaxMusic3ConditionEncoder
          transformer/          diffusers MiniMaxMusic3Transformer1DModel (sharded, F32 on disk)
          vocoder/              diffusers MiniMaxMusic3Vocoder (the DAV decoder)
          scheduler/            FlowMatchEulerDiscreteScheduler config
          dav.pth | dav_encoder/   the DAV ENCODER (release file, or our converted folder)

Where it lives: `<checkpoints>/mm3/<any name>/` (or `<checkpoints>/mm3/` itself, or any path given
directly). The ACE scan (`models.discovery`) reads only the folders directly under
`<checkpoints>` and classifies any of them holding `transformer/config.json` as an ACE diffusers
DiT, so the MM3 folder belongs one level down, in `mm3/` (seed trap 9's layout). Nothing here
imports or needs ACE-Step weights: an MM3-only install works (seed trap 19).

Each stage asks only for the parts it uses, and a missing part is an error that names the part,
the path looked at and what it is for.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from hotstep_ray.core.errors import InputError
from hotstep_ray.mm3.dav import DAV_FOLDER, DAV_RELEASE_FILE, DAV_WEIGHTS

MM3_SUBDIR = "mm3"
INDEX_FILE = "modular_model_index.json"
TRANSFORMER_CLASS = "MiniMaxMusic3Transformer1DModel"
LM_ROPE_THETA = 1_000_000.0

PART_CLASSES = {
    "transformer": "MiniMaxMusic3Transformer1DModel",
    "condition_encoder": "MiniMaxMusic3ConditionEncoder",
    "rvq_depth_decoder": "MiniMaxMusic3RVQDepthDecoder",
    "vocoder": "MiniMaxMusic3Vocoder",
}
PURPOSE = {
    "dav_encoder": "audio -> latents (mm3 preprocess); diffusers has no DAV encoder",
    "tokenizer": "caption + lyrics -> prompt ids (conditioning)",
    "language_model": "the composer LM (conditioning rollouts)",
    "rvq_depth_decoder": "acoustic codes + per-frame hidden states (conditioning)",
    "condition_encoder": "frame hidden states -> DiT conditioning (conditioning)",
    "transformer": "the flow DiT (train-dit)",
    "vocoder": "latents -> audio (renders, the 440 Hz round trip)",
    "scheduler": "the flow-match schedule (renders)",
}
STAGE_PARTS: dict[str, tuple[str, ...]] = {
    "encode": ("dav_encoder",),
    "condition": ("tokenizer", "language_model", "rvq_depth_decoder", "condition_encoder"),
    "train-dit": ("transformer",),
    "train-lm": ("tokenizer", "language_model", "rvq_depth_decoder"),
    "render": ("transformer", "vocoder"),
}


class Mm3CheckpointError(InputError):
    """An MM3 folder is missing, or lacks a part the stage needs."""


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def is_mm3_folder(folder: Path) -> bool:
    if (folder / INDEX_FILE).is_file():
        return True
    config = _read_json(folder / "transformer" / "config.json") or {}
    return config.get("_class_name") == TRANSFORMER_CLASS


def find_mm3_root(path: str | Path) -> Path:
    """The MM3 folder at `path`, `path/mm3`, or the first (by name) MM3 folder in `path/mm3/`."""
    base = Path(path).expanduser()
    candidates = [base, base / MM3_SUBDIR]
    if (base / MM3_SUBDIR).is_dir():
        candidates += sorted(p for p in (base / MM3_SUBDIR).iterdir() if p.is_dir())
    for folder in candidates:
        if folder.is_dir() and is_mm3_folder(folder):
            return folder
    looked = ", ".join(str(c) for c in candidates[:6])
    raise Mm3CheckpointError(
        f"no MiniMax-Music3 folder found (looked for {INDEX_FILE} or transformer/config.json "
        f"naming {TRANSFORMER_CLASS} in: {looked}). Put the HF MiniMaxAI/MiniMax-Music3 "
        f"snapshot in <checkpoints>/{MM3_SUBDIR}/<name>/"
    )


def _weights_present(folder: Path, stem: str) -> bool:
    return (folder / f"{stem}.safetensors").is_file() or (
        folder / f"{stem}.safetensors.index.json"
    ).is_file()


def part_problem(root: Path, part: str) -> str | None:
    """Why `part` is unusable in `root`, or None when it looks complete (files only)."""
    if part == "dav_encoder":
        if (root / DAV_FOLDER / DAV_WEIGHTS).is_file() or (root / DAV_RELEASE_FILE).is_file():
            return None
        return f"neither {DAV_FOLDER}/{DAV_WEIGHTS} nor {DAV_RELEASE_FILE}"
    folder = root / part
    if not folder.is_dir():
        return f"folder {part}/ missing"
    if part == "tokenizer":
        files = ("tokenizer.json", "vocab.json")
        return None if any((folder / f).is_file() for f in files) else "no vocab.json"
    if part == "scheduler":
        return None if (folder / "scheduler_config.json").is_file() else "no scheduler_config.json"
    config = _read_json(folder / "config.json")
    if config is None:
        return "no readable config.json"
    expected = PART_CLASSES.get(part)
    if expected and config.get("_class_name") != expected:
        return f"config.json names {config.get('_class_name')!r}, expected {expected}"
    stem = "model" if part == "language_model" else "diffusion_pytorch_model"
    return None if _weights_present(folder, stem) else f"no {stem}.safetensors (or shard index)"


@dataclass(frozen=True)
class Mm3Paths:
    root: Path

    @classmethod
    def find(cls, path: str | Path) -> Mm3Paths:
        return cls(find_mm3_root(path))

    def problems(self, parts: tuple[str, ...]) -> dict[str, str]:
        found = {part: part_problem(self.root, part) for part in parts}
        return {part: why for part, why in found.items() if why}

    def require(self, stage: str) -> None:
        """Raise naming every part `stage` needs that is missing or broken."""
        problems = self.problems(STAGE_PARTS[stage])
        if problems:
            lines = "; ".join(f"{p} ({PURPOSE[p]}): {why}" for p, why in problems.items())
            raise Mm3CheckpointError(f"MM3 folder {self.root} cannot run {stage}: {lines}")


# -- loaders ------------------------------------------------------------------------------------
def load_transformer(paths: Mm3Paths, dtype: torch.dtype = torch.bfloat16, device: str = "cpu"):
    from diffusers import MiniMaxMusic3Transformer1DModel

    paths.require("train-dit")
    model = MiniMaxMusic3Transformer1DModel.from_pretrained(
        paths.root, subfolder="transformer", torch_dtype=dtype
    )
    return model.to(device)


def load_condition_encoder(paths: Mm3Paths, device: str = "cpu"):
    """F32 (its on-disk dtype): a 25 M-parameter module whose output is cached once."""
    from diffusers import MiniMaxMusic3ConditionEncoder

    return MiniMaxMusic3ConditionEncoder.from_pretrained(
        paths.root, subfolder="condition_encoder", torch_dtype=torch.float32
    ).to(device)


def load_depth_decoder(paths: Mm3Paths, dtype: torch.dtype = torch.bfloat16, device: str = "cpu"):
    from diffusers import MiniMaxMusic3RVQDepthDecoder

    return MiniMaxMusic3RVQDepthDecoder.from_pretrained(
        paths.root, subfolder="rvq_depth_decoder", torch_dtype=dtype
    ).to(device)


def load_vocoder(paths: Mm3Paths, device: str = "cpu"):
    from diffusers import MiniMaxMusic3Vocoder

    problem = part_problem(paths.root, "vocoder")
    if problem:
        raise Mm3CheckpointError(
            f"MM3 folder {paths.root}: vocoder ({PURPOSE['vocoder']}): {problem}"
        )
    return MiniMaxMusic3Vocoder.from_pretrained(
        paths.root, subfolder="vocoder", torch_dtype=torch.float32
    ).to(device)


def rope_theta(config) -> float | None:
    """RoPE theta from a transformers config: `rope_parameters` (5.x) or `rope_theta` (4.x)."""
    params = getattr(config, "rope_parameters", None) or {}
    if isinstance(params, dict) and "rope_theta" in params:
        return float(params["rope_theta"])
    value = getattr(config, "rope_theta", None)
    return None if value is None else float(value)


def load_language_model(paths: Mm3Paths, dtype: torch.dtype = torch.bfloat16, device: str = "cpu"):
    """The composer LM; refuses a config whose RoPE theta is not 1e6 (the release's config is
    written in transformers 5 `rope_parameters` form, which an older reader silently misses)."""
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM.from_pretrained(paths.root / "language_model", dtype=dtype)
    theta = rope_theta(model.config)
    if theta != LM_ROPE_THETA:
        raise Mm3CheckpointError(f"MM3 language model RoPE theta is {theta}, expected 1e6")
    return model.to(device).eval()


def load_tokenizer(paths: Mm3Paths):
    """`Qwen2Tokenizer`, the class the diffusers pipeline declares: its pre-tokeniser splits digits
    one by one ("120" -> 1, 2, 0), which the prompt ids depend on (seed trap 2)."""
    from transformers import Qwen2Tokenizer

    return Qwen2Tokenizer.from_pretrained(paths.root / "tokenizer")


def load_scheduler(paths: Mm3Paths):
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler.from_pretrained(paths.root, subfolder="scheduler")


def load_dav(paths: Mm3Paths, device: str = "cpu"):
    from hotstep_ray.mm3.dav import load_dav_encoder

    paths.require("encode")
    return load_dav_encoder(paths.root, device)
