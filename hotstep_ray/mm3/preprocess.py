"""`mm3 preprocess`: a dataset's songs -> the MM3 tensor cache (`data.py` layout), in two passes.

1. Encode (light): decode each song, duplicate mono, resample to 44.1 kHz, keep it PLANAR [2, T]
   (`audio.io.load_audio` de-interleaves; seed trap 13) and run the DAV encoder -> latents
   [128, L]. The song's MM3 caption `<stem>.mm3.txt` is read first: a song without one fails with
   a message, it is never conditioned on the ACE caption.
2. Condition (the composer LM, ~17 GB bf16): sampled 60 s rollouts with recorded spans, or a
   teacher-forced replay of `<stem>.codes` ("aligned"), encoded to [Lc, 2048] float16.

Each song's file is written after pass 1 (latents only) and rewritten after pass 2, so a crash
keeps finished work; a rerun skips songs whose settings hash (options, caption, lyrics, codes,
source size/mtime, checkpoint) is unchanged. The manifest `mm3_cache.json` lists every song,
failed ones with their error.

Trap 14 (verify preprocessing by ear / by a tone): `tone_check` encodes a 440 Hz sine, decodes it
with the vocoder and measures the pitch that comes back (a planar/interleaved mix-up returns 220).
The CPU tests check the resample path the same way.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from hotstep_ray.audio.io import load_audio
from hotstep_ray.core import layout
from hotstep_ray.core.contracts import Sample
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.events import EventLog
from hotstep_ray.core.storage import Storage
from hotstep_ray.dataset.sidecar import stem_key
from hotstep_ray.dataset.store import included_samples, load_dataset
from hotstep_ray.mm3 import SAMPLE_RATE_HZ
from hotstep_ray.mm3 import checkpoint as ckpt
from hotstep_ray.mm3.condition import (
    ConditionModels,
    SongCondition,
    read_caption,
    sampled_condition,
    song_lyrics,
)
from hotstep_ray.mm3.data import FORMAT, MANIFEST, read_song_file, song_bytes
from hotstep_ray.mm3.options import MAX_DURATION_S, Mm3PreprocessOptions
from hotstep_ray.preprocess.audio_prep import AudioError, to_stereo
from hotstep_ray.preprocess.resample import resample

_STEM_BAD = re.compile(r"[^A-Za-z0-9._-]")


def resolve_device(name: str = "") -> torch.device:
    return torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))


def safe_stem(rel_path: str, sample_id: str) -> str:
    stem = stem_key(rel_path.replace("\\", "/")).replace("/", "__")
    return f"{_STEM_BAD.sub('_', stem)[:96]}-{sample_id}"


# -- audio ----------------------------------------------------------------------------------------
def prepare_audio(
    source: Storage, key: str, max_duration_s: float = MAX_DURATION_S
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Planar stereo [2, T] float32 at 44.1 kHz, cut at `max_duration_s` (capped at 360 s)."""
    limit_s = min(max_duration_s or MAX_DURATION_S, MAX_DURATION_S)
    try:
        raw, rate = load_audio(source, key, limit_s + 0.05)  # [C, T] planar at the file's rate
    except InputError as exc:
        raise AudioError(str(exc)) from exc
    if raw.shape[1] == 0:
        raise AudioError("no audio frames")
    stereo = to_stereo(raw)  # mono duplicated to L = R; > 2 channels refused
    audio = resample(torch.from_numpy(stereo), rate, SAMPLE_RATE_HZ)
    audio = audio[:, : int(round(limit_s * SAMPLE_RATE_HZ))].contiguous()
    if not torch.isfinite(audio).all():
        raise AudioError("decoded audio contains NaN or Inf")
    facts = {
        "source_rate_hz": int(rate),
        "source_channels": int(raw.shape[0]),
        "n_samples": int(audio.shape[1]),
        "duration_s": audio.shape[1] / SAMPLE_RATE_HZ,
    }
    return audio, facts


def dominant_frequency(signal: np.ndarray, rate_hz: int) -> float:
    """The strongest frequency of a mono signal, with parabolic peak interpolation (Hz)."""
    windowed = signal * np.hanning(signal.size)
    spectrum = np.abs(np.fft.rfft(windowed))
    k = int(np.argmax(spectrum[1:]) + 1)
    if 0 < k < spectrum.size - 1:
        a, b, c = np.log(spectrum[k - 1 : k + 2] + 1e-12)
        k = k + 0.5 * (a - c) / (a - 2 * b + c)
    return float(k * rate_hz / signal.size)


@torch.no_grad()
def tone_check(dav, vocoder, frequency_hz: float = 440.0, seconds: float = 3.0) -> dict[str, float]:
    """Trap 14's objective gate: a sine through encode -> decode comes back at its own pitch
    (ratio 1.0000; the interleaving bug gave 0.5000). Needs real weights."""
    t = np.arange(int(seconds * SAMPLE_RATE_HZ)) / SAMPLE_RATE_HZ
    tone = (0.5 * np.sin(2 * np.pi * frequency_hz * t)).astype(np.float32)
    audio = torch.from_numpy(np.stack([tone, tone]))
    latents = dav.encode(audio)
    param = next(vocoder.parameters())
    wave = vocoder(latents.unsqueeze(0).to(param.device, param.dtype))[0].float().cpu().numpy()
    found = dominant_frequency(wave[0], SAMPLE_RATE_HZ)
    return {"frequency_hz": found, "ratio": found / frequency_hz}


# -- the run --------------------------------------------------------------------------------------
@dataclass
class SongJob:
    sample: Sample
    stem: str
    settings_hash: str
    caption: str = ""
    lyrics: str = ""
    error: str = ""
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def file(self) -> str:
        return f"{self.stem}.safetensors"


def _settings_hash(job: SongJob, source: Storage, options: Mm3PreprocessOptions, root: str) -> str:
    try:
        stat = (source.size(job.sample.rel_path), source.mtime_ns(job.sample.rel_path))
    except (OSError, InputError):
        stat = (-1, -1)
    fields = {
        "options": options.model_dump(
            mode="json", exclude={"sample_ids", "overwrite", "device", "variant_key"}
        ),
        "caption": hashlib.sha256(job.caption.encode()).hexdigest(),
        "lyrics": job.lyrics,
        "source": stat,
        "checkpoint": root,
    }
    text = json.dumps(fields, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _codes_key(options: Mm3PreprocessOptions, source: Storage, job: SongJob) -> tuple[Storage, str]:
    """`<codes_dir>/<file stem>.codes|.npy`, or `<audio stem>.codes|.npy` next to the audio."""
    stem = stem_key(job.sample.rel_path)
    folder = Storage(options.codes_dir) if options.codes_dir else source
    base = stem.rsplit("/", 1)[-1] if options.codes_dir else stem
    for suffix in (".codes", ".npy"):
        if folder.exists(base + suffix):
            return folder, base + suffix
    raise InputError(f"aligned mode: no {base}.codes or {base}.npy in {folder.url}")


def _plan(storage, detail, tensor_dir, options, root) -> tuple[list[SongJob], dict[str, Any]]:
    source = Storage(detail.source_dir)
    wanted = set(options.sample_ids) if options.sample_ids is not None else None
    previous = {}
    if storage.exists(f"{tensor_dir}/{MANIFEST}"):
        previous = {
            e["sample_id"]: e for e in storage.read_json(f"{tensor_dir}/{MANIFEST}")["samples"]
        }
    jobs, carried = [], {}
    for sample in included_samples(detail.samples):
        if wanted is not None and sample.sample_id not in wanted:
            if sample.sample_id in previous:
                carried[sample.sample_id] = previous[sample.sample_id]
            continue
        job = SongJob(sample, safe_stem(sample.rel_path, sample.sample_id), "")
        try:
            job.caption = read_caption(source, sample.rel_path)
        except InputError as exc:
            job.error = str(exc)
        job.lyrics = song_lyrics(sample.lyrics, sample.is_instrumental)
        job.settings_hash = _settings_hash(job, source, options, root)
        old = previous.get(sample.sample_id)
        fresh = (
            old is not None
            and old.get("ok")
            and old.get("settings_hash") == job.settings_hash
            and storage.exists(f"{tensor_dir}/{old['file']}")
        )
        if fresh and not options.overwrite:
            carried[sample.sample_id] = old
        else:
            jobs.append(job)
    return jobs, carried


def _entry(job: SongJob, ok: bool, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "sample_id": job.sample.sample_id,
        "rel_path": job.sample.rel_path,
        "stem": job.stem,
        "file": job.file if ok else None,
        "ok": ok,
        "error": "" if ok else job.error,
        "settings_hash": job.settings_hash,
        **job.facts,
        **(extra or {}),
    }


def load_condition_models(paths: ckpt.Mm3Paths, device: torch.device, dtype: torch.dtype):
    return ConditionModels(
        tokenizer=ckpt.load_tokenizer(paths),
        language_model=ckpt.load_language_model(paths, dtype, str(device)),
        rvq_depth_decoder=ckpt.load_depth_decoder(paths, dtype, str(device)).eval(),
        condition_encoder=ckpt.load_condition_encoder(paths, str(device)).eval(),
        device=device,
    )


def run_preprocess(
    storage: Storage,
    slug: str,
    checkpoints: str,
    options: Mm3PreprocessOptions | None = None,
    events: EventLog | None = None,
) -> dict[str, Any]:
    """Build (or update) the MM3 cache of dataset `slug`; returns the manifest."""
    options = options or Mm3PreprocessOptions()
    events = events or EventLog()
    paths = ckpt.Mm3Paths.find(checkpoints)
    paths.require("encode")
    paths.require("condition")
    device = resolve_device(options.device)
    detail = load_dataset(storage, slug)
    source = Storage(detail.source_dir)
    tensor_dir = layout.tensor_dir(slug, options.resolved_variant_key)
    jobs, carried = _plan(storage, detail, tensor_dir, options, paths.root.name)
    events.log(
        f"mm3 preprocess {slug}: {len(jobs)} to do, {len(carried)} unchanged -> {tensor_dir}"
    )

    dav = ckpt.load_dav(paths, str(device))
    for done, job in enumerate(jobs):
        events.progress(done, len(jobs), "mm3-encode", current=job.sample.sample_id)
        if job.error:
            continue
        try:
            audio, job.facts = prepare_audio(source, job.sample.rel_path, options.max_duration_s)
            latents = dav.encode(audio)  # [128, L]
            job.facts["latent_frames"] = int(latents.shape[1])
            meta = {"stage": "latents", **_entry(job, True)}
            storage.write_bytes(f"{tensor_dir}/{job.file}", song_bytes(latents, meta))
        except InputError as exc:
            job.error = str(exc)
    del dav
    events.progress(len(jobs), len(jobs), "mm3-encode")

    todo = [job for job in jobs if not job.error]
    entries = dict(carried)
    if todo:
        dtype = getattr(torch, options.lm_dtype)
        models = load_condition_models(paths, device, dtype)
        for done, job in enumerate(todo):
            events.progress(done, len(todo), "mm3-condition", current=job.sample.sample_id)
            try:
                cond = _condition(models, options, source, job)
            except InputError as exc:
                job.error = str(exc)
                continue
            tensors, _ = read_song_file(storage, f"{tensor_dir}/{job.file}")
            meta = {
                "stage": "done",
                **_entry(job, True, cond.to_meta()),
                "caption": job.caption,
                "lyrics": job.lyrics,
                "mode": options.mode,
                "seed": options.seed,
            }
            data = song_bytes(
                tensors["latents"], meta, cond.condition, cond.span_starts, cond.span_ends
            )
            storage.write_bytes(f"{tensor_dir}/{job.file}", data)
            entries[job.sample.sample_id] = _entry(job, True, cond.to_meta())
        events.progress(len(todo), len(todo), "mm3-condition")
    for job in jobs:
        if job.error:
            events.log(f"{job.sample.rel_path}: {job.error}", level="warn")
            entries[job.sample.sample_id] = _entry(job, False)
    manifest = {
        "format": FORMAT,
        "kind": "mm3_cache",
        "version": 1,
        "variant_key": options.resolved_variant_key,
        "checkpoint": str(paths.root),
        "options": options.model_dump(mode="json"),
        "samples": list(entries.values()),
        "n_ok": sum(1 for e in entries.values() if e.get("ok")),
        "n_failed": sum(1 for e in entries.values() if not e.get("ok")),
    }
    storage.write_json(f"{tensor_dir}/{MANIFEST}", manifest)
    if not manifest["n_ok"]:
        raise InputError(f"mm3 preprocess {slug}: no song succeeded (see {tensor_dir}/{MANIFEST})")
    return manifest


def _condition(models, options, source: Storage, job: SongJob) -> SongCondition:
    if options.mode == "aligned":
        from hotstep_ray.mm3.aligned import aligned_condition, read_codes

        folder, key = _codes_key(options, source, job)
        codes = read_codes(folder, key, warmup_row=options.codes_warmup_row)
        return aligned_condition(models, job.caption, job.lyrics, codes)
    return sampled_condition(
        models,
        job.caption,
        job.lyrics,
        job.facts["duration_s"],
        options.seed,
        options.segment_s,
    )
