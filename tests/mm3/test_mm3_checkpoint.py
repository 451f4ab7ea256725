"""The tiny MM3 loads through the real loaders from the real layout; missing parts are named;
an MM3-only install (no ACE folders) works (seed trap 19)."""

from __future__ import annotations

import shutil

import pytest
import torch
from diffusers import (
    FlowMatchEulerDiscreteScheduler,
    MiniMaxMusic3ConditionEncoder,
    MiniMaxMusic3RVQDepthDecoder,
    MiniMaxMusic3Transformer1DModel,
    MiniMaxMusic3Vocoder,
)
from transformers import Qwen3ForCausalLM

from hotstep_ray.mm3 import checkpoint as ckpt
from hotstep_ray.mm3.dav import DavEncoder, load_dav_encoder, save_dav_encoder
from hotstep_ray.models.discovery import discover


def test_tiny_model_in_the_real_layout_loads(mm3_checkpoints):
    paths = ckpt.Mm3Paths.find(mm3_checkpoints)  # found one level down, in mm3/
    assert paths.root == mm3_checkpoints / "mm3" / "MiniMax-Music3"
    assert paths.problems(tuple(ckpt.PURPOSE)) == {}
    index = paths.root / "transformer" / "diffusion_pytorch_model.safetensors.index.json"
    assert index.is_file()  # sharded like the release
    dit = ckpt.load_transformer(paths, torch.float32)
    assert isinstance(dit, MiniMaxMusic3Transformer1DModel)
    assert isinstance(ckpt.load_condition_encoder(paths), MiniMaxMusic3ConditionEncoder)
    assert isinstance(ckpt.load_depth_decoder(paths, torch.float32), MiniMaxMusic3RVQDepthDecoder)
    assert isinstance(ckpt.load_vocoder(paths), MiniMaxMusic3Vocoder)
    assert isinstance(ckpt.load_scheduler(paths), FlowMatchEulerDiscreteScheduler)
    lm = ckpt.load_language_model(paths, torch.float32)
    assert isinstance(lm, Qwen3ForCausalLM) and ckpt.rope_theta(lm.config) == 1e6
    tokenizer = ckpt.load_tokenizer(paths)
    assert tokenizer.convert_tokens_to_ids("<|audio_start|>") == 151669
    assert tokenizer("120")["input_ids"] == [16, 17, 15]  # one digit per token (trap 2)
    dav = ckpt.load_dav(paths)
    assert isinstance(dav, DavEncoder) and dav.hop == 512
    out = dit(torch.randn(1, 128, 10), torch.rand(1), torch.randn(1, 10, 32), return_dict=False)[0]
    assert out.shape == (1, 128, 10)


def test_mm3_only_install_needs_no_ace_folders(mm3_checkpoints):
    # The checkpoints folder holds only mm3/: discovery lists it as MM3 and does not fail,
    # and every MM3 stage's parts are present.
    assert [p.name for p in mm3_checkpoints.iterdir()] == ["mm3"]
    assert [c.kind for c in discover(mm3_checkpoints)] == ["mm3"]  # never an ACE kind
    paths = ckpt.Mm3Paths.find(mm3_checkpoints)
    for stage in ckpt.STAGE_PARTS:
        paths.require(stage)


def test_missing_part_is_named(tmp_path, mm3_checkpoints):
    root = tmp_path / "mm3" / "partial"
    shutil.copytree(mm3_checkpoints / "mm3" / "MiniMax-Music3", root)
    (root / "dav.pth").unlink()
    shutil.rmtree(root / "language_model")
    paths = ckpt.Mm3Paths.find(tmp_path)
    paths.require("train-dit")  # the DiT alone is enough to train
    with pytest.raises(ckpt.Mm3CheckpointError, match="dav_encoder.*dav.pth"):
        paths.require("encode")
    with pytest.raises(ckpt.Mm3CheckpointError, match="language_model.*folder language_model/"):
        paths.require("condition")
    with pytest.raises(ckpt.Mm3CheckpointError, match="no MiniMax-Music3 folder"):
        ckpt.Mm3Paths.find(tmp_path / "nowhere")


def test_dav_release_file_and_converted_folder_agree(tmp_path, mm3_checkpoints):
    release = load_dav_encoder(mm3_checkpoints / "mm3" / "MiniMax-Music3")
    save_dav_encoder(release, tmp_path)
    converted = load_dav_encoder(tmp_path)
    audio = torch.randn(2, 3000)
    assert torch.equal(release.encode(audio), converted.encode(audio))
