"""Scan a folder of songs into `Sample`s.

Rules (HOT-Step `paths.ts` + Side-Step's extension list):
- audio = `.wav .mp3 .flac .ogg .opus .m4a .aac`, any case; hidden entries (a path part starting
  with `.`, which also drops macOS `._x.wav` shadow files) and `node_modules` are skipped;
- samples are sorted by relative path and capped at `MAX_SCAN_FILES`;
- two audio files with one stem share one sidecar, so only the first by `AUDIO_PRIORITY` is kept
  and the others are reported. Stems are compared lower-cased: sample ids hash the lower-cased
  path, and on case-insensitive disks `A.txt` and `a.txt` are one file;
- a file with more than two channels (5.1, ...) is a sample with an error: preprocessing takes
  only mono or stereo, so it is said here, at scan time, with the downmix that fixes it (and the
  build leaves the sample out).

The per-file work (`probe_sample`) is a top-level function of picklable arguments, so the Ray shell
can fan it out by passing its own `map_fn`; here it defaults to the builtin `map`.
"""

from __future__ import annotations

import functools
import posixpath
import shlex
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from hotstep_ray.audio.io import AudioInfo, probe_audio
from hotstep_ray.core.contracts import (
    AUDIO_EXTENSIONS,
    AUDIO_PRIORITY,
    MAX_SCAN_FILES,
    MIN_RECOMMENDED_SAMPLES,
    Sample,
    ScanPreview,
)
from hotstep_ray.core.errors import InputError, StorageError
from hotstep_ray.core.storage import Storage
from hotstep_ray.dataset.ids import canonical_rel_path, sample_id
from hotstep_ray.dataset.sidecar import (
    LoadedSidecar,
    infer_instrumental,
    load_sidecar,
    parse_bpm,
    parse_duration,
    parse_repeat,
    sidecar_key,
    stem_key,
)

Probe = Callable[[Storage, str], AudioInfo]
MapFn = Callable[..., Iterable[Any]]
# Sidecar fields whose provenance the studio tracks (HOT-Step `sources`).
SOURCED_FIELDS = ("caption", "lyrics", "genre", "bpm", "key", "signature", "language")
PREVIEW_NAMES = 10


@dataclass
class ScanResult:
    samples: list[Sample] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def channel_problem(channels: int, rel_path: str = "") -> str:
    """Why a file with `channels` channels cannot be trained on ("" for mono or stereo), with the
    downmix that fixes it. Preprocessing refuses such files with the same first words
    (`preprocess.audio_prep.check_channels`)."""
    if channels in (1, 2):
        return ""
    name = posixpath.basename(rel_path) or "in.wav"
    stem, ext = posixpath.splitext(name)
    out = f"{stem}-stereo{ext or '.wav'}"
    return (
        f"{channels} channels: only mono or stereo is supported; downmix to stereo first, e.g. "
        f"`ffmpeg -i {shlex.quote(name)} -ac 2 {shlex.quote(out)}`, and use that file instead"
    )


def ensure_folder(source: Storage) -> None:
    if not source.exists("") or not source.is_dir(""):
        raise InputError(f"source folder not found: {source.url}")


def is_audio(key: str) -> bool:
    return posixpath.splitext(key)[1].lower() in AUDIO_EXTENSIONS


def _visible(key: str) -> bool:
    return not any(part.startswith(".") or part == "node_modules" for part in key.split("/"))


def list_audio_keys(source: Storage, recursive: bool = True) -> list[str]:
    """Every visible audio file under the folder, as keys, sorted."""
    keys: Iterable[str] = source.walk_files() if recursive else source.list()
    return sorted(k for k in keys if is_audio(k) and _visible(k))


def _priority(key: str) -> int:
    ext = posixpath.splitext(key)[1].lower()
    return AUDIO_PRIORITY.index(ext) if ext in AUDIO_PRIORITY else len(AUDIO_PRIORITY)


def pick_audio_files(keys: Iterable[str]) -> tuple[list[str], list[str]]:
    """One audio file per sidecar stem: (kept keys sorted, collision warnings)."""
    groups: dict[str, list[str]] = {}
    for key in keys:
        groups.setdefault(stem_key(key).lower(), []).append(key)
    kept: list[str] = []
    warnings: list[str] = []
    for members in groups.values():
        members.sort(key=lambda k: (_priority(k), k))
        winner = members[0]
        kept.append(winner)
        for loser in members[1:]:
            warnings.append(
                f"{loser} ignored: it shares the sidecar {sidecar_key(winner)} with {winner}"
            )
    return sorted(kept), sorted(warnings)


def _cap(keys: list[str]) -> tuple[list[str], list[str]]:
    if len(keys) <= MAX_SCAN_FILES:
        return keys, []
    return keys[:MAX_SCAN_FILES], [
        f"{len(keys)} audio files found; only the first {MAX_SCAN_FILES} are used"
    ]


def _prompt_override(value: str | None) -> str | None:
    value = (value or "").strip().lower()
    return value if value in ("caption", "genre") else None


def sample_from_sidecar(
    source: Storage, rel_path: str, loaded: LoadedSidecar, **derived: Any
) -> Sample:
    """A `Sample` from the loaded sidecar fields (as written, no filename fallbacks: an empty
    caption means "unlabeled") plus derived fields (duration, size, error, ...)."""
    raw = loaded.fields
    sources = {name: "sidecar" for name in SOURCED_FIELDS if raw.get(name)}
    return Sample(
        sample_id=sample_id(rel_path),
        rel_path=rel_path,
        audio_path=source.url_of(rel_path),
        filename=posixpath.basename(rel_path),
        sidecar_path=source.url_of(sidecar_key(rel_path)),
        sidecar_exists=bool(loaded.files),
        caption=raw.get("caption", ""),
        genre=raw.get("genre", ""),
        bpm=parse_bpm(raw.get("bpm")),
        key=raw.get("key", ""),
        signature=raw.get("signature", ""),
        language=raw.get("language", ""),
        is_instrumental=infer_instrumental(raw),
        lyrics=raw.get("lyrics", ""),
        custom_tag=raw.get("custom_tag") or raw.get("trigger") or "",
        repeat=parse_repeat(raw.get("repeat")),
        prompt_override=_prompt_override(raw.get("prompt_override")),
        label_status="labeled" if raw.get("caption") else "unlabeled",
        sources=sources,
        **derived,
    )


def probe_sample(source: Storage | str, rel_path: str, probe: Probe = probe_audio) -> Sample:
    """Read one file's sidecar and audio header. Never raises for a bad file: the problem is
    recorded in `Sample.error` / `file_missing`, so one broken song cannot fail a whole scan."""
    storage = source if isinstance(source, Storage) else Storage(source)
    errors: list[str] = []
    try:
        loaded = load_sidecar(storage, stem_key(rel_path))
    except InputError as exc:
        loaded, errors = LoadedSidecar(), [str(exc)]
    try:
        size = storage.size(rel_path)
    except (FileNotFoundError, StorageError):
        return sample_from_sidecar(storage, rel_path, loaded, file_missing=True)
    duration = 0.0
    try:
        info = probe(storage, rel_path)
    except InputError as exc:
        errors.append(str(exc))
    else:
        duration = info.duration_s
        if problem := channel_problem(info.channels, rel_path):
            errors.append(problem)
    if not duration:  # unreadable audio: the sidecar's own duration is better than nothing
        duration = float(parse_duration(loaded.fields.get("duration")))
    return sample_from_sidecar(
        storage, rel_path, loaded, duration=duration, size_bytes=size, error="; ".join(errors)
    )


def missing_sample(source: Storage, rel_path: str) -> Sample:
    """A sample the dataset knew (a label record) whose file is gone from the folder."""
    return sample_from_sidecar(source, rel_path, LoadedSidecar(), file_missing=True)


def summary_warnings(present: int, missing: int, source_url: str, unreadable: int = 0) -> list[str]:
    """Dataset-level warnings: no or too few usable samples, unreadable files, files gone from
    disk. "Only N samples" counts the songs that can be read: an unreadable file trains nothing."""
    warnings: list[str] = []
    usable = present - unreadable
    if not present:
        warnings.append(f"No audio files found in {source_url}")
    elif usable < MIN_RECOMMENDED_SAMPLES:
        counted = (
            f"{usable} of {present} samples can be read" if unreadable else f"{usable} samples"
        )
        warnings.append(f"Only {counted} — {MIN_RECOMMENDED_SAMPLES}+ recommended")
    if missing:
        warnings.append(f"{missing} file(s) are missing from disk")
    return warnings


def scan_folder(
    source: Storage,
    recursive: bool = True,
    probe: Probe = probe_audio,
    map_fn: MapFn = map,
    known_rel_paths: Iterable[str] = (),
) -> ScanResult:
    """Scan `source` into samples sorted by relative path.

    Args:
        known_rel_paths: files the dataset already knows (label records); those no longer on
            disk come back as `file_missing` samples.
    """
    ensure_folder(source)
    keys, warnings = pick_audio_files(list_audio_keys(source, recursive))
    keys, cap_warnings = _cap(keys)
    samples: list[Sample] = list(map_fn(functools.partial(probe_sample, source, probe=probe), keys))
    found = {canonical_rel_path(s.rel_path) for s in samples}
    for rel_path in sorted(set(known_rel_paths)):
        if canonical_rel_path(rel_path) not in found:
            samples.append(missing_sample(source, rel_path))
            found.add(canonical_rel_path(rel_path))
    samples.sort(key=lambda s: s.rel_path)
    file_warnings = [f"{s.rel_path}: {s.error}" for s in samples if s.error]
    missing = sum(1 for s in samples if s.file_missing)
    unreadable = sum(1 for s in samples if not s.file_missing and s.error and not s.duration)
    counts = summary_warnings(len(samples) - missing, missing, source.url, unreadable)
    return ScanResult(samples, warnings + cap_warnings + file_warnings + counts)


def _loaded_sidecars(source: Storage, keys: list[str]) -> Iterator[LoadedSidecar]:
    for key in keys:
        try:
            yield load_sidecar(source, stem_key(key))
        except InputError:
            yield LoadedSidecar()


def scan_preview(source: Storage, recursive: bool = True) -> ScanPreview:
    """What a scan would find, without opening any audio (fast, for a confirm step)."""
    ensure_folder(source)
    keys, warnings = pick_audio_files(list_audio_keys(source, recursive))
    keys, cap_warnings = _cap(keys)
    loaded = list(_loaded_sidecars(source, keys))
    extensions: dict[str, int] = {}
    for key in keys:
        ext = posixpath.splitext(key)[1].lower()
        extensions[ext] = extensions.get(ext, 0) + 1
    return ScanPreview(
        root=source.url,
        audio_files=len(keys),
        with_sidecar=sum(1 for item in loaded if item.files),
        with_caption=sum(1 for item in loaded if item.has_caption),
        has_dataset_json=source.exists("dataset.json"),
        extensions=dict(sorted(extensions.items())),
        sample_names=keys[:PREVIEW_NAMES],
        warnings=warnings + cap_warnings + summary_warnings(len(keys), 0, source.url),
    )


def check_songs_folder(songs: str, storage: Storage, move_root: str) -> Storage:
    """The user's songs folder, or an `InputError` saying what to do: it must be a folder that
    exists, holds audio, and does not contain the storage root `storage` (whose previews and
    renders a scan would take as songs). `move_root` is the caller's way to fix that last one
    ("pass --data somewhere outside it")."""
    source = Storage(songs)
    if source.is_local and source.local_path("").is_file():
        raise InputError(f"{source.url} is a file; give the folder that holds the songs")
    try:
        ensure_folder(source)
    except InputError:
        raise InputError(f"songs folder not found: {source.url}") from None
    inside = storage.fs is source.fs and (
        storage.root_path == source.root_path
        or storage.root_path.startswith(source.root_path.rstrip("/") + "/")
    )
    if inside:
        raise InputError(
            f"the storage root {storage.url} is inside the songs folder {source.url}; {move_root}"
        )
    if not list_audio_keys(source):
        kinds = " ".join(AUDIO_EXTENSIONS)
        raise InputError(f"no audio files ({kinds}) in {source.url}; give a folder of songs")
    return source
