"""The plain path end to end on the tiny tree: file format, prompts, codes, channel stats, the
Side-Step .pt layout, idempotent reruns, determinism and `inspect --decode`."""

from __future__ import annotations

import json
import math
import os
from pathlib import PurePosixPath

import numpy as np
import pytest
import soundfile as sf
import torch
from preprocess_support import SONGS, TAG, snapshot
from typer.testing import CliRunner

from hotstep_ray.cli.preprocess_cmd import app
from hotstep_ray.core.contracts import PreprocessOptions
from hotstep_ray.preprocess.cache import PT_KEYS, read_sample
from hotstep_ray.preprocess.run import preprocess_dataset

FRAMES = {name.rsplit("/", 1)[-1]: int(sec * 48000) // 1920 for name, sec, _ in SONGS}


def _meta(run) -> dict:
    return json.loads((run.tensor_dir / "preprocess_meta.json").read_text())


def _samples(run) -> list[tuple[dict, dict, dict]]:
    """(meta entry, tensors, header metadata) per sample."""
    out = []
    for entry in _meta(run)["samples"]:
        tensors, header = read_sample(run.storage, f"{_key(run)}/{entry['file']}")
        out.append((entry, tensors, header))
    return out


def _key(run) -> str:
    return run.storage.key_of(str(run.tensor_dir))


def test_every_sample_is_cached_with_the_documented_tensors(plain_run) -> None:
    assert plain_run.result.processed == 3 and plain_run.result.failed == 0
    meta = _meta(plain_run)
    assert meta["variant_key"] == "acestep-v15-turbo" and meta["model_variant"] == "turbo"
    assert len(meta["model_fingerprint"]) == 16 and meta["total"] == meta["ok"] == 3
    for entry, tensors, header in _samples(plain_run):
        frames = FRAMES[entry["rel_path"].rsplit("/", 1)[-1]]
        hidden = tensors["encoder_hidden_states"].shape[1]
        assert entry["t_latent"] == frames and header["t_latent"] == frames
        assert tensors["target_latents"].shape == (frames, 64)
        assert tensors["attention_mask"].shape == (frames,)
        assert tensors["context_latents"].shape == (frames, 128)
        assert tensors["audio_codes"].shape == (math.ceil(frames / 5),)
        assert tensors["audio_codes"].dtype == torch.int64
        assert 0 <= int(tensors["audio_codes"].min()) <= int(tensors["audio_codes"].max()) < 64000
        # no fixed-length padding: L = lyric tokens + 1 timbre token + caption tokens
        length = entry["s_lyric"] + 1 + entry["s_text"]
        assert tensors["encoder_hidden_states"].shape == (length, hidden)
        assert torch.equal(tensors["encoder_attention_mask"], torch.ones(length))
        assert all(t.dtype == torch.float32 for n, t in tensors.items() if n != "audio_codes")
        assert torch.isfinite(tensors["target_latents"]).all()
        # context = silence latents ‖ ones (chunk mask)
        assert torch.equal(tensors["context_latents"][:, 64:], torch.ones(frames, 64))
        assert header["sample_id"] == entry["sample_id"] and header["dtype"] == "f32"


def test_context_is_the_checkpoint_silence(plain_run) -> None:
    silence = torch.load(
        plain_run.ckpt / "acestep-v15-turbo" / "silence_latent.pt", weights_only=True
    )[0].T  # [N, 64]
    for _, tensors, _ in _samples(plain_run):
        frames = tensors["target_latents"].shape[0]
        torch.testing.assert_close(tensors["context_latents"][:, :64], silence[:frames])


def test_prompts_are_the_inference_forms(plain_run) -> None:
    by_name = {e["rel_path"]: (e, h, t) for e, t, h in _samples(plain_run)}
    _, alpha, tensors = by_name["alpha.wav"]
    assert alpha["caption_prompt"].startswith("# Instruction\nFill the audio semantic mask")
    assert f"# Caption\n{TAG}, test tone alpha\n" in alpha["caption_prompt"]
    assert "- duration: 0 seconds\n" in alpha["caption_prompt"]  # 0.4 s encoded
    assert alpha["lyric_prompt"] == "# Languages\nen\n\n# Lyric\n[Instrumental]<|endoftext|>"
    # alpha has a genre: the genre variant is cached for training-time swaps
    assert f"# Caption\n{TAG}, synthwave\n" in alpha["genre_prompt"]
    assert tensors["encoder_hidden_states_genre"].shape[0] == alpha["s_text_genre"] + (
        alpha["s_lyric"] + 1
    )
    _, beta, beta_tensors = by_name["beta.flac"]
    assert beta["lyric_prompt"] == "# Languages\nen\n\n# Lyric\nla la la\nna na<|endoftext|>"
    assert "encoder_hidden_states_genre" not in beta_tensors and beta["genre_prompt"] == ""


def test_channel_stats_and_lm_codes_match_the_files(plain_run) -> None:
    samples = _samples(plain_run)
    latents = torch.cat([t["target_latents"].double() for _, t, _ in samples])
    stats = json.loads((plain_run.tensor_dir / "channel_stats.json").read_text())
    assert stats["n_samples"] == 3 and stats["n_frames"] == latents.shape[0]
    # Both are float64 reductions of the same float32 latents, summed in another order: their
    # gap is ~1e-16 of the summands' size (<= ~5), absolute, so a channel mean near zero needs
    # the atol as well as the rtol. The std comes from sum(x^2)/n - mean^2, whose cancellation
    # costs a few more digits; rtol 1e-7 still fails an n - 1 (unbiased) std.
    np.testing.assert_allclose(
        stats["channel_mean"], latents.mean(0).numpy(), rtol=1e-9, atol=1e-12
    )
    np.testing.assert_allclose(
        stats["channel_std"], latents.std(0, unbiased=False).numpy(), rtol=1e-7
    )
    lines = (plain_run.tensor_dir / "lm_codes.jsonl").read_text().splitlines()
    codes = {json.loads(line)["sample_id"]: json.loads(line) for line in lines}
    for entry, tensors, _ in samples:
        line = codes[entry["sample_id"]]
        assert line["codes"] == tensors["audio_codes"].tolist()
        assert line["caption"] == f"test tone {PurePosixPath(entry['rel_path']).stem}"
        assert line["language"] == "en" and line["file"] == entry["file"]


def test_sidestep_pt_layout_loads_without_pickle(plain_run) -> None:
    for entry, tensors, _ in _samples(plain_run):
        data = torch.load(plain_run.tensor_dir / entry["pt_file"], weights_only=True)
        assert set(data) == {*PT_KEYS, "metadata"}
        for key in PT_KEYS:
            assert torch.equal(data[key], tensors[key])
        meta = data["metadata"]
        assert meta["filename"] == entry["rel_path"].rsplit("/", 1)[-1]
        assert meta["caption"].startswith("test tone") and meta["repeat"] == 1
        assert meta["custom_tag"] == TAG


def test_rerun_writes_nothing_and_a_touched_file_redoes_only_itself(plain_run) -> None:
    before = snapshot(plain_run.tensor_dir)
    options = PreprocessOptions(sidestep_pt=True)
    again = preprocess_dataset(plain_run.storage, plain_run.slug, options, plain_run.ckpt)
    assert again.processed == 0 and again.cached == 3
    assert snapshot(plain_run.tensor_dir) == before  # not one byte, not one mtime

    touched = plain_run.source / "beta.flac"
    stamp = touched.stat().st_mtime_ns + 5_000_000_000
    os.utime(touched, ns=(stamp, stamp))
    redo = preprocess_dataset(plain_run.storage, plain_run.slug, options, plain_run.ckpt)
    entry = next(e for e in _meta(plain_run)["samples"] if e["rel_path"] == "beta.flac")
    assert redo.written == [entry["sample_id"]] and redo.cached == 2
    after = snapshot(plain_run.tensor_dir)
    changed = {name for name in after if after[name][0] != before[name][0]}
    assert changed == {entry["file"], entry["pt_file"], "preprocess_meta.json"}
    # Same seed, same source: the redone tensors are byte-identical (deterministic posterior).
    assert after[entry["file"]][1] == before[entry["file"]][1]
    # fsspec reports float seconds: one float64 ulp of today's epoch seconds is ~240 ns
    assert abs(entry["src_mtime_ns"] - stamp) < 1000


def test_another_seed_draws_another_posterior_sample(plain_run) -> None:
    from hotstep_ray.preprocess.encode import Encoder
    from hotstep_ray.preprocess.items import EncodeItem, EncoderSettings
    from hotstep_ray.preprocess.model_paths import resolve_models

    paths = resolve_models(plain_run.ckpt, PreprocessOptions())
    audio = 0.3 * torch.randn(2, 5 * 1920, generator=torch.Generator().manual_seed(3))
    item = EncodeItem("s1", audio, "caption", "lyrics")
    first = Encoder.load(paths, EncoderSettings(seed=0), "cpu")
    parts = (first.vae, first.text_encoder, first.tokenizer, first.dit)
    second = Encoder(*parts, EncoderSettings(seed=1), first.device, first.dtype)
    a, b = first.latents([item])[0], first.latents([item])[0]
    other = second.latents([item])[0]
    assert torch.equal(a, b) and not torch.equal(a, other)
    # Batching does not change a sample's condition beyond float rounding (rows are unpadded):
    # same process, other batch shape, O(1) states, so a few float32 eps; 1e-5 is ample room.
    single = first.conditions(["short caption"], ["la"])[0][0]
    batched = first.conditions(["short caption", "a much longer caption " * 8], ["la", "x y"])[0]
    torch.testing.assert_close(batched[0], single, atol=1e-5, rtol=1e-5)


def test_batched_codes_equal_per_song_codes(plain_run) -> None:
    """Songs of equal length share one tokenizer call; each row's codes equal its own call's,
    including a length that needs silence padding (23 frames -> 5 codes) and a lone length."""
    from hotstep_ray.preprocess.encode import Encoder
    from hotstep_ray.preprocess.items import EncoderSettings
    from hotstep_ray.preprocess.model_paths import resolve_models

    encoder = Encoder.load(resolve_models(plain_run.ckpt, PreprocessOptions()), EncoderSettings())
    generator = torch.Generator().manual_seed(5)
    latents = [torch.randn(frames, 64, generator=generator) for frames in (23, 40, 23, 23)]
    batched = encoder.codes(latents)
    parts = (encoder.vae, encoder.text_encoder, encoder.tokenizer, encoder.dit)
    settings = EncoderSettings(codes_frames_per_call=50)  # 23-frame songs: 2 per call
    split = Encoder(*parts, settings, encoder.device, encoder.dtype).codes(latents)
    singles = [encoder.codes([z])[0] for z in latents]
    assert [c.shape[0] for c in batched] == [5, 8, 5, 5]
    for got, cut, want in zip(batched, split, singles, strict=True):
        assert torch.equal(got, want) and torch.equal(cut, want)
    assert not torch.equal(batched[0], batched[2])  # distinct songs stay distinct rows


def test_inspect_decode_writes_a_wav_of_the_cached_length(plain_run, tmp_path) -> None:
    entry = next(e for e in _meta(plain_run)["samples"] if e["rel_path"] == "beta.flac")
    out = tmp_path / "beta.wav"
    result = CliRunner().invoke(
        app,
        [
            "inspect",
            plain_run.slug,
            "--decode",
            entry["sample_id"],
            "--out",
            str(out),
            "--data",
            str(plain_run.storage.root_path),
        ],
    )
    assert result.exit_code == 0, result.output
    info = sf.info(str(out))
    assert (info.samplerate, info.channels) == (48000, 2)
    assert info.frames == entry["t_latent"] * 1920  # 25 latent frames/s, 1920 samples each


def test_inspect_unknown_sample_is_a_clean_error(plain_run, tmp_path) -> None:
    args = ["inspect", plain_run.slug, "--decode", "nope", "--out", str(tmp_path / "x.wav")]
    result = CliRunner().invoke(app, [*args, "--data", str(plain_run.storage.root_path)])
    assert result.exit_code == 2 and "no sample 'nope'" in result.output


@pytest.mark.parametrize("bad", [{"vae_chunk_frames": 64, "vae_overlap_frames": 32}])
def test_bad_tiling_options_are_refused(plain_run, bad) -> None:
    with pytest.raises(ValueError, match="must exceed twice"):
        preprocess_dataset(
            plain_run.storage, plain_run.slug, PreprocessOptions(**bad), plain_run.ckpt
        )


def test_cli_run_records_a_job_and_finds_everything_cached(plain_run) -> None:
    root = str(plain_run.storage.root_path)
    args = ["run", plain_run.slug, "--data", root, "--checkpoints", str(plain_run.ckpt)]
    result = CliRunner().invoke(app, [*args, "--variant", "turbo", "--sidestep-pt", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)  # stdout is the JSON alone; the progress went to stderr
    assert "0 written, 3 cached" in result.stderr
    assert (report["processed"], report["cached"], report["failed"]) == (0, 3, 0)
    jobs = [p for p in (plain_run.storage.local_path("jobs")).iterdir()]
    record = json.loads((jobs[-1] / "job.json").read_text())
    assert record["kind"] == "preprocess" and record["status"] == "done"
    bad = CliRunner().invoke(app, [*args, "--variant", "xl-nope"])
    assert bad.exit_code == 2 and "no usable DiT" in bad.output
