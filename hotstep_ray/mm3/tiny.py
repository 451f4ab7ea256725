"""A tiny MM3 in the real folder layout (`checkpoint.py`), seeded, for CPU tests and dry runs.

Every part is the real class at toy width and loads through the real loaders: the DiT is
written SHARDED (with `diffusion_pytorch_model.safetensors.index.json`, as the release), the LM
in bfloat16 (as released) and the DAV encoder as the release's `dav.pth` with weight-normalised
convs. What cannot shrink: the LM vocabulary must cover the semantic codes the reference
hard-codes (ids 151675-168058), so its two 168,064 x 16 tables are ~5 MB each in bf16; the DAV
strides (2, 4, 8, 8) keep the real 512-sample hop, and the latents keep 128 channels. The
tokenizer is the real Qwen BPE (`models/assets/qwen3`) with the Qwen3 added tokens and MM3's six
prompt tokens at their release ids (151669-151674). Same seed -> identical weights.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from hotstep_ray.mm3.checkpoint import INDEX_FILE
from hotstep_ray.mm3.dav import DAV_RELEASE_FILE, DavConfig, DavEncoder
from hotstep_ray.models.lm_tokenizer import ASSETS, PAD_ID, QWEN3_ADDED_TOKENS

LM_HIDDEN = 16
LM_VOCAB = 168_064  # > 151675 + 16384: the reference masks logits to that range
COND_DIM = 32  # condition encoder out_dim = DiT condition_dim
MM3_TOKENS = (
    "<|audio_start|>",
    "<|audio_end|>",
    "<|caption_start|>",
    "<|caption_end|>",
    "<|lyrics_start|>",
    "<|lyrics_end|>",
)
TINY_DIT = {
    "in_channels": 128,
    "condition_dim": COND_DIM,
    "num_layers": 2,
    "num_attention_heads": 2,
    "attention_head_dim": 16,
    "ff_inner_dim": 64,
    "rotary_dim": 8,
    "fourier_embedding_dim": 16,
}
TINY_DAV = DavConfig(base_channels=2, strides=(2, 4, 8, 8), hidden_channels=16, latent_channels=64)
_COMPONENTS = {
    "tokenizer": ("transformers", "Qwen2Tokenizer"),
    "language_model": ("transformers", "Qwen3ForCausalLM"),
    "rvq_depth_decoder": ("diffusers", "MiniMaxMusic3RVQDepthDecoder"),
    "condition_encoder": ("diffusers", "MiniMaxMusic3ConditionEncoder"),
    "transformer": ("diffusers", "MiniMaxMusic3Transformer1DModel"),
    "vocoder": ("diffusers", "MiniMaxMusic3Vocoder"),
    "scheduler": ("diffusers", "FlowMatchEulerDiscreteScheduler"),
}


@contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Build under a fixed global seed without disturbing the caller's RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _write_tokenizer(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("vocab.json", "merges.txt"):
        shutil.copyfile(ASSETS / name, folder / name)
    added = list(QWEN3_ADDED_TOKENS) + [(token, True) for token in MM3_TOKENS]
    config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "model_max_length": 10240,
        "added_tokens_decoder": {
            str(PAD_ID + i): {
                "content": token,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": special,
            }
            for i, (token, special) in enumerate(added)
        },
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def _write_lm(folder: Path, seed: int) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=LM_VOCAB,
        hidden_size=LM_HIDDEN,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=10240,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        tie_word_embeddings=False,
        eos_token_id=151645,
        pad_token_id=151643,
    )
    with _seeded(seed):
        model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)


def _write_dav(path: Path, seed: int) -> None:
    """`dav.pth` with weight-normalised convs (weight_g / weight_v), as the release stores them."""
    with _seeded(seed):
        model = DavEncoder(TINY_DAV)
        for module in model.modules():  # gain 0.8, no bias: the output follows the input
            if isinstance(module, torch.nn.Conv1d):
                torch.nn.init.normal_(module.weight, std=0.8 / module.weight[0].numel() ** 0.5)
                torch.nn.init.zeros_(module.bias)
    state = {}
    for key, tensor in model.state_dict().items():
        if key.endswith(".weight") and tensor.ndim == 3:
            stem = key[: -len(".weight")]
            norm = tensor.reshape(tensor.shape[0], -1).norm(dim=1).reshape(-1, 1, 1)
            state[f"{stem}.weight_g"] = norm.clone()
            state[f"{stem}.weight_v"] = tensor.clone()
        else:
            state[key] = tensor.clone()
    torch.save(state, path)


def write_tiny_mm3(folder: str | Path, seed: int = 0) -> Path:
    """Write the tiny MM3 folder at `folder`; returns it."""
    from diffusers import (
        FlowMatchEulerDiscreteScheduler,
        MiniMaxMusic3ConditionEncoder,
        MiniMaxMusic3RVQDepthDecoder,
        MiniMaxMusic3Transformer1DModel,
        MiniMaxMusic3Vocoder,
    )

    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    with _seeded(seed + 1):
        dit = MiniMaxMusic3Transformer1DModel(**TINY_DIT)
    dit.save_pretrained(root / "transformer", max_shard_size="200KB")
    with _seeded(seed + 2):
        encoder = MiniMaxMusic3ConditionEncoder(condition_hidden_dim=LM_HIDDEN, out_dim=COND_DIM)
    encoder.save_pretrained(root / "condition_encoder")
    with _seeded(seed + 3):
        depth = MiniMaxMusic3RVQDepthDecoder(
            hidden_size=LM_HIDDEN,
            num_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            audio_vocab_size=16,
        )
    depth.save_pretrained(root / "rvq_depth_decoder")
    with _seeded(seed + 4):
        vocoder = MiniMaxMusic3Vocoder(decoder_input_dim=8, decoder_hidden_dim=16)
    vocoder.save_pretrained(root / "vocoder")
    FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1, shift=1.0, invert_sigmas=True
    ).save_pretrained(root / "scheduler")
    _write_lm(root / "language_model", seed + 5)
    _write_tokenizer(root / "tokenizer")
    _write_dav(root / DAV_RELEASE_FILE, seed + 6)
    index = {"_class_name": "MiniMaxMusic3ModularPipeline", "_hotstep_ray_tiny": True}
    index.update({name: list(spec) for name, spec in _COMPONENTS.items()})
    (root / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return root
