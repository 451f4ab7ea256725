"""The tiny checkpoint tree: written in the official layout, loaded through the real loaders,
forward shapes, byte-for-byte determinism, and the loaders' errors on damaged folders."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hotstep_ray.models import lm_tokenizer as L
from hotstep_ray.models import prompts as P
from hotstep_ray.models import text_models as T
from hotstep_ray.models.errors import CheckpointError
from hotstep_ray.models.tiny_tree import DIT_DIR, LM_DIR, make_tiny_tree

# The DiT half of the tree comes from tiny_dit (another module); only those checks skip without it.
HAS_DIT = importlib.util.find_spec("hotstep_ray.models.tiny_dit") is not None
needs_dit = pytest.mark.skipif(not HAS_DIT, reason="hotstep_ray.models.tiny_dit not available")
TEXT = "Qwen3-Embedding-0.6B"


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    return make_tiny_tree(tmp_path_factory.mktemp("tree"), seed=0, with_dit=HAS_DIT)


@pytest.fixture(scope="module")
def text_parts(tree):
    return T.load_text_encoder(tree / TEXT, device="cpu"), L.load_tokenizer(tree / TEXT)


def _digests(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def test_layout(tree: Path) -> None:
    for folder, files in {
        "vae": ["config.json", "diffusion_pytorch_model.safetensors"],
        TEXT: ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"],
        LM_DIR: ["config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"],
    }.items():
        for name in files:
            assert (tree / folder / name).is_file(), f"{folder}/{name}"
    if HAS_DIT:
        assert (tree / DIT_DIR / "silence_latent.pt").is_file()
    digest = hashlib.sha256((tree / LM_DIR / "tokenizer.json").read_bytes()).hexdigest()
    assert digest == L.LM_TOKENIZER_SHA256["tokenizer.json"]
    # Real-style keys: the embedding model stores bare Qwen3Model names, the LM "model." ones.
    assert "embed_tokens.weight" in load_file(str(tree / TEXT / "model.safetensors"))
    lm_keys = load_file(str(tree / LM_DIR / "model.safetensors"))
    assert "model.embed_tokens.weight" in lm_keys and "lm_head.weight" not in lm_keys


def test_text_encoder_forward(text_parts) -> None:
    encoder, tokenizer = text_parts
    assert next(encoder.parameters()).dtype == torch.float32 and not encoder.training
    caption, lyric = P.build_dit_text_inputs(
        "calm piano", "[Instrumental]", "en", P.build_dit_metadata(90, "A minor", "4", 10)
    )
    states, mask = T.encode_captions(encoder, tokenizer, [caption, "short"])
    length = len(tokenizer(caption).input_ids)
    assert states.shape == (2, length, 32) and mask.shape == (2, length)
    assert mask[0].all() and mask[1].sum() == len(tokenizer("short").input_ids)
    # Right padding + causal attention: the short prompt's states do not depend on the pads.
    # Same process, other batch shape: float32 summation order only, a few eps of O(1) states;
    # the float32 defaults (atol 1e-5, rtol 1.3e-6) leave ample room, a pad leak is O(1).
    alone, _ = T.encode_captions(encoder, tokenizer, ["short"])
    torch.testing.assert_close(states[1, : alone.shape[1]], alone[0])
    lyrics, lyric_mask = T.embed_lyrics(encoder, tokenizer, [lyric])
    assert lyrics.shape == (1, len(tokenizer(lyric).input_ids), 32) and lyric_mask.all()
    inv_freq = encoder.rotary_emb.inv_freq
    assert inv_freq.dtype == torch.float32 and not inv_freq.is_meta


def test_lm_forward_on_the_golden_sequence(tree: Path) -> None:
    lm = T.load_lm(tree / LM_DIR, device="cpu")
    tokenizer = L.load_tokenizer(tree / LM_DIR)
    assert lm.lm_head.weight is lm.model.embed_tokens.weight
    cot = P.format_cot({"bpm": 90, "duration": 10, "keyscale": "A minor", "timesignature": 4})
    seq = L.render_training_sequence(tokenizer, "calm piano", "[Instrumental]", cot, [0, 1, 63999])
    assert len(seq.input_ids) == 76
    with torch.no_grad():
        logits = lm(input_ids=torch.tensor([seq.input_ids]), use_cache=False).logits
    assert logits.shape == (1, 76, L.LM_VOCAB_SIZE) and torch.isfinite(logits).all()


def test_vae_round_trip_shapes(tree: Path) -> None:
    vae = T.load_vae(tree / "vae", device="cpu")
    assert vae.hop_length == 1920 and vae.sampling_rate == 48000
    audio = 0.3 * torch.randn(1, 2, 5 * 1920, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        posterior = vae.encode(audio).latent_dist
        latents = posterior.sample(generator=torch.Generator().manual_seed(1))
        decoded = vae.decode(latents).sample
    assert latents.shape == (1, 64, 5) and decoded.shape == (1, 2, 5 * 1920)
    # O(1) latents, so the tiny DiT trains on sane targets.
    assert 0.1 < posterior.mean.std().item() < 10 and torch.isfinite(decoded).all()


@needs_dit
def test_dit_consumes_the_text_encoder_outputs(tree: Path, text_parts) -> None:
    from hotstep_ray.models.acestep_dit import load_acestep_dit

    encoder, tokenizer = text_parts
    dit = load_acestep_dit(tree / DIT_DIR, device="cpu", dtype=torch.float32)
    caption, lyric = P.build_dit_text_inputs("calm piano", "la la", "en")
    text, text_mask = T.encode_captions(encoder, tokenizer, [caption])
    lyrics, lyric_mask = T.embed_lyrics(encoder, tokenizer, [lyric])
    timbre = dit.silence_latent[:, :10, :]
    with torch.no_grad():
        states, mask = dit.condition_encoder(
            text, text_mask, lyrics, lyric_mask, timbre, torch.zeros(1, dtype=torch.long)
        )
    hidden = dit.config["hidden_size"]
    assert states.shape == (1, lyrics.shape[1] + 1 + text.shape[1], hidden)
    assert mask.shape == states.shape[:2]


def test_same_seed_same_bytes(tree: Path, tmp_path: Path) -> None:
    again = make_tiny_tree(tmp_path / "again", seed=0, with_dit=HAS_DIT)
    assert _digests(again) == _digests(tree)
    other = make_tiny_tree(tmp_path / "other", seed=1, with_dit=False)
    for name in ("vae/diffusion_pytorch_model.safetensors", f"{LM_DIR}/model.safetensors"):
        assert _digests(other)[name] != _digests(tree)[name]
    assert _digests(other)[f"{LM_DIR}/tokenizer.json"] == _digests(tree)[f"{LM_DIR}/tokenizer.json"]


# --- loader variants -----------------------------------------------------------------------------


def _weights_only(src: Path, dst: Path) -> dict[str, torch.Tensor]:
    """Copy config.json to a new folder and return the tensors of model.safetensors."""
    dst.mkdir(parents=True)
    shutil.copy(src / "config.json", dst / "config.json")
    return load_file(str(src / "model.safetensors"))


def test_lm_without_prefix_sharded_and_with_lm_head(tree: Path, tmp_path: Path) -> None:
    reference = T.load_lm(tree / LM_DIR, device="cpu").state_dict()
    # Keys without "model." plus a stored (tied) lm_head, split over two shards.
    tensors = _weights_only(tree / LM_DIR, tmp_path / "lm")
    bare = {name.removeprefix("model."): t for name, t in tensors.items()}
    bare["lm_head.weight"] = bare["embed_tokens.weight"].clone()
    names = sorted(bare)
    shards = {
        "model-00001-of-00002.safetensors": names[:5],
        "model-00002-of-00002.safetensors": names[5:],
    }
    weight_map = {}
    for shard, keys in shards.items():
        save_file({k: bare[k] for k in keys}, str(tmp_path / "lm" / shard))
        weight_map.update({k: shard for k in keys})
    index = {"metadata": {}, "weight_map": weight_map}
    (tmp_path / "lm" / "model.safetensors.index.json").write_text(json.dumps(index))
    lm = T.load_lm(tmp_path / "lm", device="cpu", dtype=torch.bfloat16)
    assert lm.lm_head.weight is lm.model.embed_tokens.weight
    loaded = lm.state_dict()
    for name, value in reference.items():
        # the same correctly rounded float32 -> bf16 cast on both sides: exact in practice; a
        # missed cast is off by up to 2^-9 relative, far outside the float32 defaults
        torch.testing.assert_close(loaded[name].float(), value.to(torch.bfloat16).float())
    assert loaded["model.embed_tokens.weight"].dtype == torch.bfloat16

    (tmp_path / "lm" / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match="missing shard model-00002-of-00002"):
        T.load_lm(tmp_path / "lm", device="cpu")


def test_text_encoder_accepts_prefixed_keys(tree: Path, tmp_path: Path) -> None:
    tensors = _weights_only(tree / TEXT, tmp_path / "enc")
    save_file(
        {f"model.{k}": v for k, v in tensors.items()}, str(tmp_path / "enc" / "model.safetensors")
    )
    encoder = T.load_text_encoder(tmp_path / "enc", device="cpu")
    # the stored float32 values, loaded as they are (exact); a key miss leaves a random init
    torch.testing.assert_close(encoder.embed_tokens.weight, tensors["embed_tokens.weight"])


# --- errors --------------------------------------------------------------------------------------


def test_missing_files(tree: Path, tmp_path: Path) -> None:
    assert issubclass(CheckpointError, ValueError)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"empty/config\.json: missing"):
        T.load_text_encoder(tmp_path / "empty", device="cpu")
    (tmp_path / "noweights").mkdir()
    shutil.copy(tree / LM_DIR / "config.json", tmp_path / "noweights" / "config.json")
    with pytest.raises(CheckpointError, match=r"noweights: missing model\.safetensors"):
        T.load_lm(tmp_path / "noweights", device="cpu")
    (tmp_path / "vae").mkdir()
    shutil.copy(tree / "vae" / "config.json", tmp_path / "vae" / "config.json")
    with pytest.raises(CheckpointError, match=r"missing diffusion_pytorch_model\.safetensors"):
        T.load_vae(tmp_path / "vae", device="cpu")
    with pytest.raises(CheckpointError, match="expected 'AutoencoderOobleck'"):
        T.load_vae(tree / LM_DIR, device="cpu")
    with pytest.raises(CheckpointError, match="model_type None, expected 'qwen3'"):
        T.load_lm(tree / "vae", device="cpu")


def test_truncated_file(tree: Path, tmp_path: Path) -> None:
    (tmp_path / "enc").mkdir()
    shutil.copy(tree / TEXT / "config.json", tmp_path / "enc" / "config.json")
    data = (tree / TEXT / "model.safetensors").read_bytes()
    (tmp_path / "enc" / "model.safetensors").write_bytes(data[: len(data) - 1000])
    with pytest.raises(CheckpointError, match=r"enc/model\.safetensors: truncated.*1000 missing"):
        T.load_text_encoder(tmp_path / "enc", device="cpu")


def test_missing_and_misshaped_tensors(tree: Path, tmp_path: Path) -> None:
    tensors = _weights_only(tree / TEXT, tmp_path / "enc")
    missing = dict(tensors)
    del missing["layers.1.mlp.up_proj.weight"]
    save_file(missing, str(tmp_path / "enc" / "model.safetensors"))
    with pytest.raises(
        CheckpointError,
        match=r"model\.safetensors: missing tensor 'layers\.1\.mlp\.up_proj\.weight' "
        r"\(expected shape \[64, 32\]\)",
    ):
        T.load_text_encoder(tmp_path / "enc", device="cpu")

    config = json.loads((tmp_path / "enc" / "config.json").read_text())
    config["hidden_size"] = 48
    (tmp_path / "enc" / "config.json").write_text(json.dumps(config))
    save_file(tensors, str(tmp_path / "enc" / "model.safetensors"))
    with pytest.raises(
        CheckpointError,
        match=r"tensor 'embed_tokens\.weight' has shape \[151669, 32\], expected \[151669, 48\]"
        r" \(config\.json: hidden_size=48",
    ):
        T.load_text_encoder(tmp_path / "enc", device="cpu")

    extra = {**tensors, "layers.9.bogus": torch.zeros(2)}
    config["hidden_size"] = 32
    (tmp_path / "enc" / "config.json").write_text(json.dumps(config))
    save_file(extra, str(tmp_path / "enc" / "model.safetensors"))
    with pytest.raises(CheckpointError, match="unexpected tensor 'layers.9.bogus'"):
        T.load_text_encoder(tmp_path / "enc", device="cpu")
