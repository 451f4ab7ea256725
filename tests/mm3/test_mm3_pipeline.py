"""End to end on the tiny MM3, through the CLI: dataset -> `mm3 preprocess` -> `mm3 train-dit`
(ComfyUI export, checkpoint, report); and resume == uninterrupted."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from mm3_helpers import sine, wav_bytes
from safetensors.torch import load as load_bytes
from typer.testing import CliRunner

from hotstep_ray.cli.common import EXIT_PARTIAL
from hotstep_ray.cli.mm3_cmd import app
from hotstep_ray.core import layout
from hotstep_ray.core.contracts import CreateDatasetInput
from hotstep_ray.core.storage import Storage
from hotstep_ray.dataset.store import create_dataset
from hotstep_ray.mm3 import checkpoint as ckpt
from hotstep_ray.mm3 import latent_length
from hotstep_ray.mm3.data import MANIFEST, load_songs, read_song_file
from hotstep_ray.mm3.export import COMFY_PREFIX
from hotstep_ray.mm3.train import Mm3TrainOptions, save_state, setup, train, train_step
from hotstep_ray.training import adapters

CAPTION = "Global Metadata\nGenre: synth-pop\nVocal Details\nfemale, airy\nArrangement\npads\n"


@pytest.fixture(scope="module")
def cached(tmp_path_factory, mm3_checkpoints):
    """A 2-song dataset (one without an MM3 caption) preprocessed through the CLI."""
    base = tmp_path_factory.mktemp("pipeline")
    songs = Storage(base / "songs")
    stereo = np.stack([sine(440.0, 1.0, 48_000), sine(660.0, 1.0, 48_000, 0.3)])
    songs.write_bytes("a.wav", wav_bytes(stereo, 48_000))
    songs.write_text("a.txt", "caption: an ACE caption\nlyrics:\n[verse]\nla la\nlo lo\n")
    songs.write_text("a.mm3.txt", CAPTION)
    songs.write_bytes("b.wav", wav_bytes(sine(330.0, 0.5, 44_100)[None], 44_100))
    songs.write_text("b.txt", "caption: only an ACE caption here\n")
    storage = Storage(base / "data")
    detail = create_dataset(storage, CreateDatasetInput(source_dir=str(base / "songs")))
    args = ["preprocess", detail.slug, "--data", str(base / "data"), "--checkpoints",
            str(mm3_checkpoints), "--segment-s", "0.4", "--device", "cpu", "--lm-dtype", "float32",
            "--json"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == EXIT_PARTIAL, result.output  # b.wav has no MM3 caption
    return storage, detail.slug, json.loads(result.stdout)


def test_preprocess_writes_latents_and_seamed_conditioning(cached, mm3_checkpoints):
    storage, slug, manifest = cached
    assert manifest["n_ok"] == 1 and manifest["n_failed"] == 1
    failed = next(e for e in manifest["samples"] if not e["ok"])
    assert failed["rel_path"] == "b.wav" and "b.mm3.txt" in failed["error"]  # no ACE fallback
    entry = next(e for e in manifest["samples"] if e["ok"])
    tensor_dir = layout.tensor_dir(slug, "mm3-sampled-s42")
    tensors, meta = read_song_file(storage, f"{tensor_dir}/{entry['file']}")
    assert tensors["latents"].shape == (128, 87)  # ceil(44100 / 512)
    assert tensors["condition"].shape == (latent_length(25), 32)
    assert tensors["span_starts"].tolist() == [0, latent_length(10), latent_length(20)]
    assert meta["frames_wanted"] == [10, 10, 5] and meta["caption"] == CAPTION
    assert meta["lyrics"] == "[verse]\nla la\nlo lo"
    # The cached latents are the DAV encoding of the planar 44.1 kHz song.
    from hotstep_ray.mm3.preprocess import prepare_audio

    audio, _ = prepare_audio(Storage(storage.root_path + "/../songs"), "a.wav")
    dav = ckpt.load_dav(ckpt.Mm3Paths.find(mm3_checkpoints))
    # The same encode call (float32 file, same defaults) in this process: equal but for round-off
    # (|latents| <~ 1); a float16 cache would miss by ~5e-4 relative, a wrong song by O(1).
    assert torch.allclose(tensors["latents"], dav.encode(audio), atol=1e-6)
    assert storage.exists(f"{tensor_dir}/{MANIFEST}")


def test_train_dit_cli_writes_the_comfy_lora(cached, mm3_checkpoints):
    storage, slug, _ = cached
    args = ["train-dit", slug, "--data", storage.root_path, "--checkpoints", str(mm3_checkpoints),
            "--steps", "4", "--crop", "16", "--dtype", "float32", "--device", "cpu",
            "--delta-every", "2", "--export-every", "2", "--lr", "1e-3", "--json"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    paths = json.loads(result.output[result.output.index("{") :])
    run_dir = paths["lora"].rsplit("/", 1)[0]
    assert "/adapters/mm3-dit/" in run_dir
    out = Storage(run_dir)
    tensors = load_bytes(out.read_bytes("mm3_lora.safetensors"))
    assert all(k.startswith(COMFY_PREFIX) for k in tensors)
    assert not any("project_" in k for k in tensors)
    assert any(
        "project_in" in k for k in load_bytes(out.read_bytes("mm3_lora_unfiltered.safetensors"))
    )
    assert out.exists("mm3_lora_step2.safetensors") and out.exists("checkpoint/checkpoint.json")
    report = out.read_json("train_report.json")
    assert len(report["losses"]) == 4 and report["crop_stats"]["draws"] >= 4
    assert [h["step"] for h in report["delta_history"]] == [2, 4]


def test_resume_equals_uninterrupted(cached, mm3_checkpoints):
    storage, slug, _ = cached
    options = Mm3TrainOptions(
        steps=6, crop_latents=16, dtype="float32", device="cpu", delta_every=0, learning_rate=1e-3
    )
    dit = ckpt.load_transformer(ckpt.Mm3Paths.find(mm3_checkpoints), torch.float32)
    full = setup(storage, slug, "", options, transformer=dit)
    train(full)

    first = setup(storage, slug, "", options, transformer=ckpt.load_transformer(
        ckpt.Mm3Paths.find(mm3_checkpoints), torch.float32))  # fmt: skip
    for step in range(3):
        first.losses.append(train_step(first, step)["loss"])
    key = save_state(first, 3).rsplit("/", 1)[0]
    resumed = setup(storage, slug, "", options.model_copy(update={"resume": key}),
                    transformer=ckpt.load_transformer(ckpt.Mm3Paths.find(mm3_checkpoints), torch.float32))  # fmt: skip
    assert resumed.start_step == 3
    assert resumed.out_dir == first.out_dir  # it continues in the run folder it resumes
    train(resumed)
    # Same process, kernels and order: a faithful resume is bit-identical. The float32 slack
    # (a loss is a mean over 128 x 16 latents: u sqrt(2048) ~ 3e-6 relative) stays far below what
    # a lost optimizer state or a shifted schedule does to the later steps.
    assert resumed.losses == pytest.approx(full.losses, rel=1e-5)
    a, b = (
        adapters.adapter_state_dict(full.transformer),
        adapters.adapter_state_dict(resumed.transformer),
    )
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)  # Adam moves them ~lr = 1e-3
    assert len(load_songs(storage, layout.tensor_dir(slug, "mm3-sampled-s42"))) == 1
