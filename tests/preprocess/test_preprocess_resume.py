"""Interrupted runs on the tiny tree: a cached file is trusted only when its own safetensors
header carries this run's settings hash, and the songs a killed run wrote are kept by their
headers even when the meta never got written.

A kill is simulated by a `write_outputs` that raises KeyboardInterrupt (what Ctrl-C raises)
right after writing a chosen number of songs: everything written before it is on storage,
nothing after it, and `finalize` never runs, exactly as with SIGKILL between two songs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from preprocess_support import make_song_folder, new_dataset, snapshot

from hotstep_ray.core.contracts import PreprocessOptions
from hotstep_ray.core.events import EventLog, LogEvent
from hotstep_ray.core.storage import Storage
from hotstep_ray.preprocess import cache, run
from hotstep_ray.preprocess.cache import SampleOutputs, read_header, read_sample
from hotstep_ray.preprocess.plan import make_plan
from hotstep_ray.preprocess.run import preprocess_dataset
from hotstep_ray.preprocess.sample_job import FORMAT, SampleJob

VARIANT = "acestep-v15-turbo"  # the tiny tree's DiT folder: the default variant key
META = "preprocess_meta.json"


class Killed(KeyboardInterrupt):
    """The simulated Ctrl-C (a BaseException, as the real one: no `except Exception` eats it)."""


def _kill_after(monkeypatch, songs: int, landed: list[SampleOutputs] | None = None) -> None:
    """The run's `write_outputs` writes `songs` songs (their outputs go to `landed`), then the
    run dies."""
    real = run.write_outputs
    landed = [] if landed is None else landed

    def write(storage, tensor_dir, job, outputs):
        real(storage, tensor_dir, job, outputs)
        landed.append(outputs)
        if len(landed) >= songs:
            raise Killed

    monkeypatch.setattr(run, "write_outputs", write)


def _copy(plain_run, tmp_path: Path) -> tuple[Storage, Path]:
    """The session run's storage root (dataset + tensor cache), copied so a test may damage it.
    Its dataset still points at the shared, unchanged source songs."""
    root = tmp_path / "root"
    shutil.copytree(plain_run.storage.root_path, root, ignore=shutil.ignore_patterns("jobs"))
    return Storage(root), root / "tensors" / plain_run.slug / VARIANT


def _entry(tensor_dir: Path, rel_path: str) -> dict:
    meta = json.loads((tensor_dir / META).read_text())
    return next(e for e in meta["samples"] if e["rel_path"] == rel_path)


def _cache_options(tensor_dir: Path) -> PreprocessOptions:
    """The options the cache was last made with (other tests rerun the session cache, some
    with other options that do not change its tensors, such as `dit_model`)."""
    return PreprocessOptions.model_validate(json.loads((tensor_dir / META).read_text())["options"])


def _warnings(events: list) -> list[str]:
    return [e.message for e in events if isinstance(e, LogEvent) and e.level == "warn"]


def test_a_killed_run_with_other_settings_is_re_encoded_by_the_next_run(
    plain_run, tmp_path, monkeypatch
) -> None:
    storage, tensor_dir = _copy(plain_run, tmp_path)
    before = snapshot(tensor_dir)
    options = _cache_options(tensor_dir)
    assert options.sidestep_pt and options.dtype == "f32"
    # A bf16 run dies after its first song (the shortest, alpha; one song per batch, so no other
    # is encoded): the meta still says float32.
    _kill_after(monkeypatch, 1)
    bf16 = options.model_copy(update={"dtype": "bf16"})
    with pytest.raises(Killed):
        preprocess_dataset(storage, plain_run.slug, bf16, plain_run.ckpt, batch_size=1)
    monkeypatch.undo()
    alpha = _entry(tensor_dir, "alpha.wav")
    tensors, header = read_sample(storage, f"tensors/{plain_run.slug}/{VARIANT}/{alpha['file']}")
    assert header["dtype"] == "bf16" and tensors["target_latents"].dtype == torch.bfloat16
    assert header["settings_hash"] != alpha["settings_hash"]  # the meta's claim is now false

    events: list = []
    result = preprocess_dataset(
        storage, plain_run.slug, options, plain_run.ckpt, events=EventLog(events.append)
    )
    assert result.stale == [alpha["sample_id"]] and result.written == [alpha["sample_id"]]
    assert (result.processed, result.cached, result.recovered) == (1, 2, [])
    assert "1 cached file was made with other settings: re-encoding" in _warnings(events)
    after = snapshot(tensor_dir)
    # Everything but alpha's two files is untouched (bytes and mtime); even the meta is not
    # rewritten, as alpha's new entry equals the one it had (same seed, same source: the same
    # latents, so the same channel sums).
    assert {name for name in after if after[name] != before[name]} == {
        alpha["file"],
        alpha["pt_file"],
    }
    key = f"tensors/{plain_run.slug}/{VARIANT}/{alpha['file']}"
    redone, header = read_sample(storage, key)
    original, original_header = read_sample(plain_run.storage, key)
    assert header == original_header and header["dtype"] == "f32"
    for name in ("target_latents", "audio_codes", "context_latents"):
        assert torch.equal(redone[name], original[name]), name
    # The condition was encoded in a batch of one here, of three in the session run: equal up to
    # float rounding (O(1) states, a few float32 eps; the bound of
    # test_another_seed_draws_another_posterior_sample).
    for name in ("encoder_hidden_states", "encoder_hidden_states_genre"):
        torch.testing.assert_close(redone[name], original[name], atol=1e-5, rtol=1e-5)


def test_the_songs_a_killed_first_run_wrote_are_kept(tmp_path, tiny_ckpt, monkeypatch) -> None:
    source = make_song_folder(tmp_path / "songs")
    for path in source.glob("beta.*"):  # the longest song: two are enough, and cheaper
        path.unlink()
    storage = Storage(tmp_path / "root")
    slug = new_dataset(storage, source)
    tensor_dir = storage.local_path(f"tensors/{slug}/{VARIANT}")
    landed: list[SampleOutputs] = []
    _kill_after(monkeypatch, 1, landed)  # batch_size 1: killed once the first song's file is in
    with pytest.raises(Killed):
        preprocess_dataset(storage, slug, PreprocessOptions(), tiny_ckpt, batch_size=1)
    monkeypatch.undo()
    assert not (tensor_dir / META).exists()  # before the fix: "2 new", all encoded again
    (kept,) = [out.entry for out in landed]
    before = snapshot(tensor_dir)

    events: list = []
    result = preprocess_dataset(
        storage, slug, PreprocessOptions(), tiny_ckpt, events=EventLog(events.append)
    )
    assert result.recovered == [kept["sample_id"]] and result.stale == []
    assert (result.processed, result.cached, result.total) == (1, 1, 2)
    assert kept["sample_id"] not in result.written and len(result.written) == 1
    messages = [e.message for e in events if isinstance(e, LogEvent)]
    assert any(m.endswith("1 cached (1 left by an interrupted run)") for m in messages)
    # not re-encoded: the same bytes and mtime
    assert snapshot(tensor_dir)[kept["file"]] == before[kept["file"]]
    # The rebuilt entry is the one the killed run's encode made, field for field (training and
    # the main job's fingerprint read it), and the variant files cover both songs.
    meta = json.loads((tensor_dir / META).read_text())
    by_id = {e["sample_id"]: e for e in meta["samples"]}
    assert by_id[kept["sample_id"]] == json.loads(json.dumps(kept))
    assert meta["total"] == meta["ok"] == 2
    stats = json.loads((tensor_dir / "channel_stats.json").read_text())
    assert stats["n_samples"] == 2
    lines = [json.loads(x) for x in (tensor_dir / "lm_codes.jsonl").read_text().splitlines()]
    assert sorted(line["sample_id"] for line in lines) == sorted(by_id)
    for line in lines:
        tensors, _ = read_sample(storage, f"tensors/{slug}/{VARIANT}/{line['file']}")
        assert line["codes"] == tensors["audio_codes"].tolist()


@pytest.mark.parametrize(
    "stale_entry",
    [
        {"settings_hash": "0" * 16},  # the meta is another settings' run's
        {"src_mtime_ns": 1, "checksum": "0" * 64},  # the meta is of an older source file
    ],
    ids=["settings", "changed"],
)
def test_a_file_the_meta_does_not_describe_is_kept_when_its_header_matches(
    plain_run, tmp_path, stale_entry
) -> None:
    """A killed run with this run's settings rewrote alpha after the meta was written: the
    plan keeps the file and rebuilds the entry `build_outputs` made for it, field for field."""
    storage, tensor_dir = _copy(plain_run, tmp_path)
    meta = json.loads((tensor_dir / META).read_text())
    alpha = next(e for e in meta["samples"] if e["rel_path"] == "alpha.wav")
    original = dict(alpha)
    alpha.update(stale_entry)
    (tensor_dir / META).write_text(json.dumps(meta))
    plan = make_plan(storage, plain_run.slug, _cache_options(tensor_dir), str(plain_run.ckpt))
    assert plan.jobs == [] and plan.recovered == [alpha["sample_id"]]
    assert plan.carried[alpha["sample_id"]] == original


def _rewrite_with_other_settings(storage: Storage, key: str, frames: int) -> None:
    """What a killed `--max-duration` run leaves: fewer frames, another settings hash."""
    tensors, meta = read_sample(storage, key)
    cut = {name: t for name, t in tensors.items() if name != "audio_codes"}
    for name in ("target_latents", "attention_mask", "context_latents"):
        cut[name] = tensors[name][:frames]
    cut["audio_codes"] = tensors["audio_codes"][: -(-frames // 5)]  # 5 latent frames per code
    meta.update(t_latent=frames, settings_hash="0" * 16)
    header = {"format": FORMAT, "json": json.dumps(meta)}  # the part `read_header` reads
    storage.write_bytes(key, cache.safetensors_bytes(cut, header))


def test_plans_read_headers_only_and_sample_runs_drop_disagreeing_entries(
    plain_run, tmp_path, monkeypatch
) -> None:
    storage, tensor_dir = _copy(plain_run, tmp_path)
    gamma, alpha = _entry(tensor_dir, "sub/gamma.wav"), _entry(tensor_dir, "alpha.wav")
    key = f"tensors/{plain_run.slug}/{VARIANT}/{gamma['file']}"
    _rewrite_with_other_settings(storage, key, gamma["t_latent"] - 2)
    assert read_header(storage, key)["t_latent"] == gamma["t_latent"] - 2

    def no_tensors(*_args, **_kwargs):
        raise AssertionError("planning loaded a tensor file")

    monkeypatch.setattr(cache, "load_safetensors", no_tensors)
    options = _cache_options(tensor_dir)
    plan = make_plan(storage, plain_run.slug, options, str(plain_run.ckpt))
    assert [(job.sample_id, job.reason) for job in plan.jobs] == [(gamma["sample_id"], "stale")]
    assert plan.stale == [gamma["sample_id"]] and len(plan.carried) == 2
    monkeypatch.undo()

    # A run over alpha only (cached: nothing to encode) must not vouch for gamma's file: its
    # entry and file go, and the warning says so.
    events: list = []
    only = options.model_copy(update={"sample_ids": [alpha["sample_id"]]})
    result = preprocess_dataset(
        storage, plain_run.slug, only, plain_run.ckpt, events=EventLog(events.append)
    )
    assert result.dropped == [gamma["sample_id"]] and result.processed == 0
    assert any("dropped 1 cached file outside this run's samples" in m for m in _warnings(events))
    meta = json.loads((tensor_dir / META).read_text())
    assert gamma["sample_id"] not in {e["sample_id"] for e in meta["samples"]}
    assert (
        not (tensor_dir / gamma["file"]).exists() and not (tensor_dir / gamma["pt_file"]).exists()
    )


def test_a_pt_is_rewritten_only_after_its_safetensors_is_gone(tmp_path, monkeypatch) -> None:
    """Killed between a sample's two files, a run leaves no header vouching for the other
    run's `.pt`: the next plan finds the safetensors missing and redoes the sample."""
    storage = Storage(tmp_path)
    job = SampleJob(
        index=0,
        sample_id="s1",
        rel_path="a.wav",
        audio_path="a.wav",
        source_root=str(tmp_path),
        source_key="a.wav",
        stem="a-s1",
        src_size=1,
        src_mtime_ns=1,
        record={},
        use_genre=False,
        tag_position="prepend",
        pt_metadata={},
        settings_hash="h",
    )
    storage.write_bytes("t/a-s1.safetensors", b"old run")
    storage.write_bytes("t/a-s1.pt", b"old run")
    files = {"a-s1.safetensors": b"new run", "a-s1.pt": b"new run"}
    outputs = SampleOutputs({"ok": True, "pt_file": "a-s1.pt"}, "", files)
    real = Storage.write_bytes

    def write(self, key, data):
        if key.endswith(".safetensors"):
            raise Killed
        return real(self, key, data)

    monkeypatch.setattr(Storage, "write_bytes", write)
    with pytest.raises(Killed):
        cache.write_outputs(storage, "t", job, outputs)
    assert not storage.exists("t/a-s1.safetensors")
    assert storage.read_bytes("t/a-s1.pt") == b"new run"
