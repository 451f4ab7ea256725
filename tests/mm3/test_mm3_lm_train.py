"""`mm3 train-lm` on the tiny MM3 (CPU, float32): the teacher-forced loss against a hand-built
reference, memorisation, the PEFT export through `PeftModel.from_pretrained`, and input errors."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mm3_helpers import sine, wav_bytes
from typer.testing import CliRunner

from hotstep_ray.cli.mm3_cmd import app
from hotstep_ray.core import layout
from hotstep_ray.core.contracts import CreateDatasetInput
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage
from hotstep_ray.dataset.store import create_dataset
from hotstep_ray.mm3 import checkpoint as ckpt
from hotstep_ray.mm3.condition import Mm3CaptionError
from hotstep_ray.mm3.lm_train import (
    Mm3LmTrainOptions,
    full_song_losses,
    head_rows,
    setup,
    song_loss,
    train,
)
from hotstep_ray.training import adapters

CAPTION = "Global Metadata\nGenre: synth-pop\nVocal Details\nfemale, airy\nArrangement\npads\n"
TINY_ACOUSTIC_VOCAB = 16  # the tiny depth decoder's audio_vocab_size (tiny.py)
FRAMES = {"a": 9, "b": 7}  # audio frames per song (the .codes files hold one more: warm-up)


def codes_array(frames: int, seed: int) -> np.ndarray:
    """int32 [frames + 1, 8]: row 0 = duplicated warm-up row, as HOT-Step's mm3-codes writes."""
    rng = np.random.default_rng(seed)
    body = np.concatenate(
        [rng.integers(0, 16_384, (frames, 1)), rng.integers(0, TINY_ACOUSTIC_VOCAB, (frames, 7))],
        axis=1,
    ).astype("<i4")
    return np.concatenate([body[:1], body])


def make_dataset(base, captions=("a", "b")):
    """Songs a, b (short sines) with lyrics; MM3 captions for `captions`; codes for both."""
    songs = Storage(base / "songs")
    for name, hz in (("a", 440.0), ("b", 330.0)):
        songs.write_bytes(f"{name}.wav", wav_bytes(sine(hz, 0.5, 44_100)[None], 44_100))
        songs.write_text(f"{name}.txt", "caption: an ACE caption\nlyrics:\n[verse]\nla la\n")
        if name in captions:
            songs.write_text(f"{name}.mm3.txt", CAPTION + f"song {name}\n")
    codes = Storage(base / "codes")
    for seed, (name, frames) in enumerate(FRAMES.items()):
        codes.write_bytes(f"{name}.codes", codes_array(frames, seed).tobytes())
    storage = Storage(base / "data")
    detail = create_dataset(storage, CreateDatasetInput(source_dir=str(base / "songs")))
    return storage, detail.slug, str(base / "codes")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("lm"))


def options(codes_dir: str, **extra) -> Mm3LmTrainOptions:
    base = {"codes_dir": codes_dir, "dtype": "float32", "device": "cpu", "max_frames": 0}
    return Mm3LmTrainOptions(**{**base, **extra})


def reference_loss(lm, depth, prompt_ids, codes_file_rows, eos: bool) -> float:
    """Straight from the formula (mm3.md §1.5, §3.7) and the composer's full-vocab logits:
    frames = rows[1:]; x = embed(prompt) ++ e(frames[:-1]) (++ e(frames[-1]) with EOS),
    e(c) = (E[c0 + 151675] + sum_k A[c_k + (k - 1) * 16]) / sqrt(8); targets at P-1 ...;
    softmax over the columns {151670} u [151675, 168059) only."""
    frames = torch.as_tensor(codes_file_rows[1:], dtype=torch.long)
    table, audio = lm.model.embed_tokens.weight, depth.audio_embeddings.weight
    embeds = []
    for row in frames if eos else frames[:-1]:
        vec = table[row[0] + 151_675].clone()
        for k in range(1, 8):
            vec = vec + audio[row[k] + (k - 1) * TINY_ACOUSTIC_VOCAB]
        embeds.append(vec / math.sqrt(8))
    prompt = table[prompt_ids]
    x = torch.cat([prompt, torch.stack(embeds)])[None]
    logits = lm(inputs_embeds=x).logits[0].float()  # [T, 168064]
    columns = torch.cat([torch.tensor([151_670]), torch.arange(151_675, 151_675 + 16_384)])
    p = prompt_ids.shape[0]
    targets = frames[:, 0] + 1  # class 0 = EOS, class 1 + s = semantic code s
    if eos:
        targets = torch.cat([targets, torch.tensor([0])])
    picked = logits[p - 1 : p - 1 + targets.shape[0]][:, columns]
    return F.cross_entropy(picked, targets).item()


def test_loss_equals_the_reference_from_the_composer_forward(dataset, mm3_checkpoints):
    storage, slug, codes_dir = dataset
    run = setup(storage, slug, str(mm3_checkpoints), options(codes_dir), out_dir="scratch/ref")
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():  # a non-zero LoRA: the reference must see the adapted composer too
        for _, param in adapters.trainable_parameters(run.lm):
            param.copy_(0.3 * torch.randn(param.shape, generator=gen))
    song = next(s for s in run.songs if s.stem == "a")
    assert song.frames.shape == (FRAMES["a"], 8)  # warm-up row dropped
    assert int(song.prompt_ids[-1]) == 151_669  # the prompt ends with <|audio_start|>
    rows = codes_array(FRAMES["a"], 0)
    for eos in (True, False):
        run.options = options(codes_dir, supervise_eos=eos)
        ours = song_loss(run, song, 0, song.n_frames).item()
        ref = reference_loss(run.lm, run.depth, song.prompt_ids, rows, eos)
        # Mean cross-entropy ~ln(16,385) = 9.7 nats by two float32 routes: log-sum-exp over 16,385
        # columns of |logit| < ~1 is good to ~u (ln n + max |z|) ~ 1e-6 (u = eps_f32 / 2). The
        # 1e-4 band is still far below what a shifted target or the EOS row changes.
        assert ours == pytest.approx(ref, rel=1e-5, abs=1e-5)
    # A crop that does not reach the end: no EOS target, only frames 2..5 supervised.
    part = song_loss(run, song, 2, 4).item()
    assert math.isfinite(part) and part != pytest.approx(ours)  # other targets: O(1e-2) apart


def test_loss_falls_on_a_memorisable_two_song_set(dataset, mm3_checkpoints):
    storage, slug, codes_dir = dataset
    opts = options(codes_dir, steps=40, learning_rate=3e-2, rank=8, alpha=16, seed=1)
    run = setup(storage, slug, str(mm3_checkpoints), opts, out_dir="scratch/fall")
    # The tiny head (rows ~N(0, 0.02^2), 16-dim RMS-normed hidden) can only reach logits of about
    # +-0.3: every distribution it can express is near uniform, so nothing is learnable. A x30
    # head (still frozen) can express peaked distributions; the LoRA has to find them.
    with torch.no_grad():
        run.lm.lm_head.weight.mul_(30.0)
    run.head = head_rows(run.lm)
    before = full_song_losses(run)
    train(run)
    after = full_song_losses(run)
    chance = math.log(16_385)  # 9.70 nats: uniform over EOS + 16,384 semantic codes
    for stem in before:  # outcomes of 40 steps, not round-off: margins a CPU's order cannot eat
        assert after[stem] < 0.6 * before[stem], (before, after)
        assert after[stem] < chance - 2.0, (before, after)  # well below the uniform guess
    assert len(run.steps_log) == 40 and run.steps_log[-1]["lr"] < opts.learning_rate


def test_cli_export_reloads_with_peft_and_changes_logits(dataset, mm3_checkpoints):
    from peft import PeftModel

    storage, slug, codes_dir = dataset
    args = ["train-lm", slug, "--data", storage.url,
            "--checkpoints", str(mm3_checkpoints), "--codes", codes_dir, "--steps", "6",
            "--lr", "1e-2", "--dtype", "float32", "--device", "cpu", "--max-frames", "0",
            "--json"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    paths = json.loads(result.output[result.output.index("{") :])
    run_key = storage.key_of(paths["run"])
    assert run_key.startswith(f"{layout.mm3_lm_adapter_base()}/{slug}-")
    assert layout.latest_mm3_lm_run(storage, slug) == run_key
    folder = storage.full_path(run_key)
    config = json.loads(open(f"{folder}/adapter_config.json").read())
    assert config["r"] == 16 and config["lora_alpha"] == 16  # alpha/r folded into lora_B
    from safetensors.torch import load_file

    tensors = load_file(f"{folder}/adapter_model.safetensors")
    assert all(t.dtype == torch.bfloat16 for t in tensors.values())
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in tensors
    assert "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight" in tensors
    assert len(tensors) == 2 * 7 * 2  # 2 layers x 7 modules x (A, B)
    log = json.loads(open(f"{folder}/train_log.json").read())
    assert len(log["steps"]) == 6 and set(log["song_loss_after"]) == {"a", "b"}

    paths_ = ckpt.Mm3Paths.find(mm3_checkpoints)
    base = ckpt.load_language_model(paths_, torch.float32)
    ids = torch.tensor([[151_644, 151_671, 151_672, 151_669, 151_680, 151_700]])
    with torch.no_grad():
        plain = base(input_ids=ids).logits
        peft_model = PeftModel.from_pretrained(base, folder).eval()
        adapted = peft_model(input_ids=ids).logits
    loaded = sum(1 for n, _ in peft_model.named_parameters() if "lora_B" in n)
    assert loaded == 14  # every exported module found its target
    # 6 steps at lr 1e-2 move B from 0 by ~1e-2 per entry; round-off of the logits is ~1e-7
    assert (adapted - plain).abs().max() > 1e-3


def test_missing_caption_and_bad_codes_are_clear_errors(tmp_path, mm3_checkpoints):
    storage, slug, codes_dir = make_dataset(tmp_path / "nocap", captions=("a",))
    with pytest.raises(Mm3CaptionError, match=r"b\.mm3\.txt"):
        setup(storage, slug, str(mm3_checkpoints), options(codes_dir), out_dir="x")
    # Through the CLI: a one-line message and exit code 2, no traceback.
    args = ["train-lm", slug, "--data", storage.url, "--checkpoints", str(mm3_checkpoints),
            "--codes", codes_dir, "--dtype", "float32", "--device", "cpu"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "b.mm3.txt" in result.output

    storage, slug, codes_dir = make_dataset(tmp_path / "badcodes")
    codes = Storage(codes_dir)
    codes.write_bytes("b.codes", np.zeros((5, 7), "<i4").tobytes())  # 35 int32: not rows of 8
    with pytest.raises(InputError, match="not rows of 8"):
        setup(storage, slug, str(mm3_checkpoints), options(codes_dir), out_dir="x")
    # 7 columns that happen to fill rows of 8: acoustic codes out of range name the problem.
    codes.write_bytes("b.codes", np.full((8, 7), 500, "<i4").tobytes())
    with pytest.raises(InputError, match="acoustic codes must lie in"):
        setup(storage, slug, str(mm3_checkpoints), options(codes_dir), out_dir="x")
    codes.write_bytes("b.codes", codes_array(3, 0)[:1].tobytes())  # only the warm-up row
    with pytest.raises(InputError, match="no audio frame"):
        setup(storage, slug, str(mm3_checkpoints), options(codes_dir), out_dir="x")
    codes.delete("b.codes")
    with pytest.raises(InputError, match="b.wav"):
        setup(storage, slug, str(mm3_checkpoints), options(codes_dir), out_dir="x")
