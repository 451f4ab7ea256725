"""Write a complete tiny ACE-Step 1.5 checkpoint tree in the official layout, for tests and dry
runs on CPU:

  acestep-v15-turbo/      tiny DiT (`tiny_dit.write_tiny_dit`)
  vae/                    tiny AutoencoderOobleck: 48 kHz stereo <-> 64-d latents, hop 1920
  Qwen3-Embedding-0.6B/   tiny Qwen3Model, real 151,669-token tokenizer
  acestep-5Hz-lm-0.6B/    tiny Qwen3ForCausalLM, real 217,204-token tokenizer + chat template

Every part loads through the same code as real weights (`text_models`, `acestep_dit`). The
Qwen parts keep the real vocabularies so the real tokenizers and prompts work unchanged; their
embedding tables dominate the size (151,669 x 32 and 217,204 x 32 float32: 19 MB and 28 MB).
The VAE cannot be narrow where it matters: 64-d latents force encoder_hidden_size = 128 (the
encoder's last conv emits mean and scale, 2 x 64) and diffusers runs the first encoder block at
that width at the full 48 kHz, so encoding costs ~0.8 s per second of audio on 2 CPU cores; the
decoder is 8 channels wide and takes a few ms. Same seed => byte-identical weight files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from diffusers import AutoencoderOobleck
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3Model

from hotstep_ray.models import lm_tokenizer
from hotstep_ray.models.text_models import LM_DIRS, TEXT_ENCODER_DIR, VAE_DIR, VAE_WEIGHTS

DIT_DIR = "acestep-v15-turbo"
LM_DIR = LM_DIRS["0.6B"]
TINY_TEXT_HIDDEN = 32  # the tiny DiT's text_hidden_dim; read from its config when written
TINY_VAE = {
    "audio_channels": 2,
    "sampling_rate": 48000,
    "encoder_hidden_size": 128,  # = 2 x latent dim (mean, scale): cannot shrink
    "downsampling_ratios": [2, 4, 4, 6, 10],  # 1920 samples per latent frame = 25 Hz, as real
    "channel_multiples": [1, 1, 1, 1, 1],
    "decoder_channels": 8,
    "decoder_input_channels": 64,
}
_SEED_OFFSETS = {"vae": 1, "text_encoder": 2, "lm": 3}


def _qwen3_config(hidden: int, vocab: int, architecture: str, eos: int) -> dict[str, Any]:
    """A config.json in the style of the released Qwen3 checkpoints (transformers 4.5x keys,
    `rope_theta` at top level), 2 layers, 2 query heads / 1 KV head of 16."""
    return {
        "architectures": [architecture],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": lm_tokenizer.PAD_ID,
        "eos_token_id": eos,
        "head_dim": 16,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "initializer_range": 0.02,
        "intermediate_size": 2 * hidden,
        "max_position_embeddings": 32768,
        "max_window_layers": 2,
        "model_type": "qwen3",
        "num_attention_heads": 2,
        "num_hidden_layers": 2,
        "num_key_value_heads": 1,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "transformers_version": "4.57.1",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": vocab,
    }


def _seeded(shapes: dict[str, torch.Size], seed: int, rule) -> dict[str, torch.Tensor]:
    """One tensor per name, drawn in sorted-name order from one generator (so the bytes depend
    only on the seed and the shapes, not on module construction order)."""
    generator = torch.Generator().manual_seed(seed)
    return {name: rule(name, shapes[name], generator).contiguous() for name in sorted(shapes)}


def _qwen_rule(name: str, shape: torch.Size, generator: torch.Generator) -> torch.Tensor:
    """Qwen's own init: N(0, 0.02) matrices, unit RMSNorm weights."""
    if len(shape) == 1:
        return torch.ones(shape)
    return 0.02 * torch.randn(shape, generator=generator)


def _vae_rule(name: str, shape: torch.Size, generator: torch.Generator) -> torch.Tensor:
    """Conv weights N(0, 1/fan_in); zero biases and snake params (log-scale: alpha = beta =
    exp(0) = 1); weight_g is filled in from weight_v afterwards. The residual units' closing 1x1
    conv is scaled by 0.1: at full gain the 15 residual branches of the encoder compound to
    latents of std ~100; with it, noise at 0.3 encodes to posterior means and scales of ~0.8."""
    if name.endswith(("bias", "alpha", "beta", "weight_g")):
        return torch.zeros(shape)
    fan_in = shape[1] * shape[2]
    gain = 0.1 if ".res_unit" in name and name.endswith("conv2.weight_v") else 1.0
    return gain * torch.randn(shape, generator=generator) / fan_in**0.5


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _save(tensors: dict[str, torch.Tensor], path: Path) -> None:
    save_file(tensors, str(path), metadata={"format": "pt"})


def write_tiny_vae(folder: str | Path, seed: int = 0) -> Path:
    """`vae/`: diffusers config.json + diffusion_pytorch_model.safetensors (~12 MB)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with torch.device("meta"):
        model = AutoencoderOobleck(**TINY_VAE)
    shapes = {name: tensor.shape for name, tensor in model.state_dict().items()}
    tensors = _seeded(shapes, seed, _vae_rule)
    for name in tensors:
        if name.endswith("weight_g"):  # weight = g * v / |v| = v: the drawn weights as they are
            v = tensors[name.removesuffix("_g") + "_v"]
            tensors[name] = v.flatten(1).norm(dim=1).reshape(shapes[name]).contiguous()
    _save(tensors, folder / f"{VAE_WEIGHTS}.safetensors")
    _write_json(folder / "config.json", {"_class_name": "AutoencoderOobleck", **TINY_VAE})
    return folder


def write_tiny_text_encoder(folder: str | Path, seed: int = 0, hidden: int = 32) -> Path:
    """`Qwen3-Embedding-0.6B/`: tiny Qwen3Model weights stored without the "model." prefix (as
    the real file), config.json and the real text-tokenizer files."""
    folder = Path(folder)
    config = _qwen3_config(hidden, lm_tokenizer.TEXT_VOCAB_SIZE, "Qwen3Model", lm_tokenizer.PAD_ID)
    with torch.device("meta"):
        model = Qwen3Model(Qwen3Config.from_dict(config))
    shapes = {name: tensor.shape for name, tensor in model.state_dict().items()}
    lm_tokenizer.save_text_tokenizer(folder)
    _save(_seeded(shapes, seed, _qwen_rule), folder / "model.safetensors")
    _write_json(folder / "config.json", config)
    return folder


def write_tiny_lm(
    folder: str | Path, seed: int = 0, hidden: int = 32, embedding_scale: float = 1.0
) -> Path:
    """`acestep-5Hz-lm-0.6B/`: tiny Qwen3ForCausalLM (tied embeddings, so no lm_head tensor),
    keys with the "model." prefix, config.json and the real LM tokenizer folder.
    `embedding_scale` multiplies the tied embeddings: at N(0, 0.02) a 32-wide model's logits span
    < 1 nat, so training tests that must see the loss fall scale them up (25)."""
    folder = Path(folder)
    config = _qwen3_config(
        hidden, lm_tokenizer.LM_VOCAB_SIZE, "Qwen3ForCausalLM", lm_tokenizer.IM_END_ID
    )
    with torch.device("meta"):
        model = Qwen3ForCausalLM(Qwen3Config.from_dict(config))
    shapes = {n: t.shape for n, t in model.state_dict().items() if n != "lm_head.weight"}
    lm_tokenizer.save_lm_tokenizer(folder)
    tensors = _seeded(shapes, seed, _qwen_rule)
    if embedding_scale != 1.0:
        tensors["model.embed_tokens.weight"] *= embedding_scale
    _save(tensors, folder / "model.safetensors")
    _write_json(folder / "config.json", config)
    return folder


def make_tiny_tree(root: str | Path, seed: int = 0, with_dit: bool = True) -> Path:
    """Write the four folders under `root` (created if needed) and return `root`. The text
    encoder's width follows the DiT's `text_hidden_dim`. `with_dit=False` skips the DiT."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    text_hidden = TINY_TEXT_HIDDEN
    if with_dit:
        from hotstep_ray.models.tiny_dit import write_tiny_dit

        dit = write_tiny_dit(root / DIT_DIR, variant="turbo", seed=seed)
        dit_config = json.loads((dit / "config.json").read_text(encoding="utf-8"))
        text_hidden = int(dit_config.get("text_hidden_dim", TINY_TEXT_HIDDEN))
    write_tiny_vae(root / VAE_DIR, seed + _SEED_OFFSETS["vae"])
    write_tiny_text_encoder(
        root / TEXT_ENCODER_DIR, seed + _SEED_OFFSETS["text_encoder"], text_hidden
    )
    write_tiny_lm(root / LM_DIR, seed + _SEED_OFFSETS["lm"])
    return root
