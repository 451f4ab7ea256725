"""`dataset.json`: read it as Side-Step's preprocessing does, and build it for Side-Step.

Reading (`tests/fixtures/sidestep/dataset_json.json` pins every value):
- three shapes are accepted: a bare array of samples, `{"samples": [...]}` and
  `{"metadata": {...}, "samples": [...]}`; only `tag_position` (default `prepend`), `genre_ratio`
  (0) and `custom_tag` ("") are read from the metadata, and a caller's non-empty tag/position or
  ratio > 0 overrides them;
- each sample's `audio_path` is resolved against the JSON's folder, then its `filename`; missing
  files are skipped, and the found files are processed in sorted path order (not JSON order); when
  nothing resolves, the JSON's folder is scanned instead;
- a file's record is looked up by its path, then by its name (`filename`, else the basename of
  `audio_path`); JSON values are used as given except `duration` (whole seconds, 0 when absent)
  and an empty `custom_tag`, which takes the dataset-level tag;
- `select_genre_indices` picks which of the sorted files use their genre as the prompt text.

One tolerance: a non-numeric `duration` ("95.5" as a string) reads as its whole seconds, or 0;
Side-Step's `int(x or 0)` would stop the whole run on it.

Building follows HOT-Step's `datasetBuilder`: `{metadata, samples}` dumped with
`json.dumps(indent=2, ensure_ascii=False)` (no trailing newline, as Side-Step writes it). A rebuild
keeps every key it does not own, per sample (matched by lower-cased `audio_path`) and in the
metadata, and never restamps `created_at`. Values are normalised at this training boundary
(keyscale "F# major", timesignature numerator, ISO language); sidecars keep the human forms.
"""

from __future__ import annotations

import json
import posixpath
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hotstep_ray.core.contracts import DatasetSummary, Sample
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage
from hotstep_ray.dataset.ids import dataset_json_id
from hotstep_ray.dataset.scan import list_audio_keys
from hotstep_ray.dataset.sidecar import INSTRUMENTAL_LYRICS, caption_from_filename
from hotstep_ray.models.prompts import (
    DEFAULT_DIT_INSTRUCTION,
    apply_custom_tag,
    build_dit_caption_prompt,
    sidestep_metas_string,
)

DEFAULT_TAG_POSITION = "prepend"
GENRE_SEED = 42


# -- reading -------------------------------------------------------------------------------------
def parse_dataset_json(data: bytes | str) -> Any:
    try:
        return json.loads(data)
    except json.JSONDecodeError as exc:
        raise InputError(f"dataset.json is not valid JSON: {exc}") from exc


def split_dataset_json(doc: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(metadata, samples) of any accepted shape; InputError for anything else."""
    if isinstance(doc, list):
        metadata, samples = {}, doc
    elif isinstance(doc, dict) and isinstance(doc.get("samples"), list):
        metadata, samples = doc.get("metadata") or {}, doc["samples"]
    else:
        raise InputError("dataset.json must be a list of samples or an object with 'samples'")
    if not isinstance(metadata, dict):
        raise InputError("dataset.json 'metadata' must be an object")
    return metadata, [s for s in samples if isinstance(s, dict)]


def load_dataset_metadata(doc: Any) -> dict[str, Any]:
    """The three metadata keys preprocessing reads, with Side-Step's defaults."""
    metadata, _ = split_dataset_json(doc)
    return {
        "tag_position": metadata.get("tag_position") or DEFAULT_TAG_POSITION,
        "genre_ratio": int(metadata.get("genre_ratio") or 0),
        "custom_tag": metadata.get("custom_tag") or "",
    }


def apply_caller_overrides(
    metadata: Mapping[str, Any], custom_tag: str = "", tag_position: str = "", genre_ratio: int = 0
) -> dict[str, Any]:
    """A caller's (GUI/CLI) non-empty tag and position, or a ratio > 0, win over the JSON."""
    effective = dict(metadata)
    if custom_tag:
        effective["custom_tag"] = custom_tag
    if tag_position:
        effective["tag_position"] = tag_position
    if genre_ratio > 0:
        effective["genre_ratio"] = genre_ratio
    return effective


def select_genre_indices(num_samples: int, genre_ratio: int | float) -> list[int]:
    """Indices (into the sorted file list) whose prompt text is the genre: the first
    `int(n * ratio / 100)` of `range(n)` shuffled by `random.Random(42)`, sorted."""
    count = int(num_samples * genre_ratio / 100)
    if count <= 0:
        return []
    order = list(range(num_samples))
    random.Random(GENRE_SEED).shuffle(order)
    return sorted(order[:count])


# -- resolving samples against files -------------------------------------------------------------
def _url(storage: Storage, path: str) -> str:
    """A filesystem path of `storage.fs` as the user sees it (plain locally, else with protocol)."""
    return path if storage.is_local else storage.url.removesuffix(storage.root_path) + path


def _candidate_path(json_dir: Storage, ref: Any) -> str | None:
    """The filesystem path `ref` (an `audio_path` or `filename`) names, relative to the JSON's
    folder unless absolute; None when it is empty or on another filesystem."""
    if not isinstance(ref, str) or not ref.strip():
        return None
    ref = ref.replace("\\", "/")
    if "://" in ref:
        prefix = json_dir.url.removesuffix(json_dir.root_path)
        if json_dir.is_local or not ref.startswith(prefix):
            return None
        return ref[len(prefix) :]
    if ref.startswith("/") or re.match(r"^[A-Za-z]:/", ref):
        return posixpath.normpath(ref)
    return posixpath.normpath(f"{json_dir.root_path}/{ref}")


def _resolve(json_dir: Storage, sample: Mapping[str, Any]) -> str | None:
    for ref in (sample.get("audio_path"), sample.get("filename")):
        path = _candidate_path(json_dir, ref)
        if path is not None and json_dir.fs.isfile(path):
            return _url(json_dir, path)
    return None


def _sample_name(sample: Mapping[str, Any]) -> str:
    name = sample.get("filename") or posixpath.basename(str(sample.get("audio_path") or ""))
    return str(name).replace("\\", "/").rsplit("/", 1)[-1]


def discover_audio_files(json_dir: Storage, samples: Sequence[Mapping[str, Any]]) -> list[str]:
    """Sorted, de-duplicated paths (URLs off a local disk) of the files the samples resolve to;
    the JSON folder's own audio files when none does."""
    found = {path for path in (_resolve(json_dir, s) for s in samples) if path}
    if not found:
        found = {json_dir.url_of(key) for key in list_audio_keys(json_dir, recursive=True)}
    return sorted(found)


def build_sample_meta(
    json_dir: Storage, samples: Sequence[Mapping[str, Any]]
) -> dict[str, Mapping[str, Any]]:
    """Lookup table: resolved path -> record, and name -> record."""
    table: dict[str, Mapping[str, Any]] = {}
    for sample in samples:
        name = _sample_name(sample)
        if name:
            table[name] = sample
        path = _resolve(json_dir, sample)
        if path:
            table[path] = sample
    return table


def _whole_seconds(value: Any) -> int:
    try:
        return int(float(value or 0))
    except (TypeError, ValueError, OverflowError):
        return 0


def resolve_sample_record(
    sample_meta: Mapping[str, Mapping[str, Any]], path: str, dataset_custom_tag: str
) -> dict[str, Any]:
    """The record preprocessing uses for one discovered file."""
    name = path.rsplit("/", 1)[-1]
    record = dict(sample_meta.get(path) or sample_meta.get(name) or {})
    record["duration"] = _whole_seconds(record.get("duration"))
    if dataset_custom_tag and not record.get("custom_tag"):
        record["custom_tag"] = dataset_custom_tag
    return record


# -- prompt and .pt metadata ---------------------------------------------------------------------
def prompt_text(record: Mapping[str, Any], use_genre: bool) -> str:
    """Side-Step's choice of caption text: a `prompt_override` wins; a file not picked for
    genre uses its caption; a picked one its genre, or its caption when the genre is empty."""
    caption = record.get("caption") or ""
    genre = record.get("genre") or ""
    override = record.get("prompt_override")
    if override == "genre":
        return genre
    if override == "caption" or not use_genre:
        return caption
    return genre or caption


def build_text_prompt(record: Mapping[str, Any], tag_position: str, use_genre: bool) -> str:
    """The exact text-encoder prompt Side-Step builds for one sample record. The template and the
    tag rule live in `models.prompts`; the choice of text and tag is Side-Step's, made here."""
    text = prompt_text(record, use_genre)
    tag = record.get("custom_tag") or record.get("trigger") or ""
    if tag:
        try:
            text = apply_custom_tag(text, tag, tag_position)
        except ValueError as exc:
            raise InputError(f"dataset.json: {exc}") from exc
    metas = sidestep_metas_string(
        record.get("bpm"),
        record.get("timesignature"),
        record.get("keyscale"),
        record.get("duration"),
    )
    return build_dit_caption_prompt(text, metas, DEFAULT_DIT_INSTRUCTION)


def pt_metadata(path: str, record: Mapping[str, Any]) -> dict[str, Any]:
    """The `metadata` dict pass 1 stores in `<stem>.pt` (caption un-tagged, `repeat` always 1)."""
    return {
        "audio_path": path,
        "filename": path.rsplit("/", 1)[-1],
        "caption": record.get("caption", ""),
        "lyrics": record.get("lyrics", INSTRUMENTAL_LYRICS),
        "duration": _whole_seconds(record.get("duration")),
        "bpm": record.get("bpm"),
        "keyscale": record.get("keyscale", ""),
        "timesignature": record.get("timesignature", ""),
        "genre": record.get("genre", ""),
        "is_instrumental": record.get("is_instrumental", True),
        "custom_tag": record.get("custom_tag", ""),
        "prompt_override": record.get("prompt_override"),
        "repeat": 1,
    }


@dataclass(frozen=True)
class PreprocessEntry:
    index: int  # position in the sorted file list
    path: str
    record: dict[str, Any]
    use_genre: bool
    text_prompt: str
    pt_metadata: dict[str, Any]


@dataclass(frozen=True)
class PreprocessPlan:
    files: list[str]
    dataset_metadata: dict[str, Any]  # as read from the JSON
    effective_metadata: dict[str, Any]  # after caller overrides
    genre_indices: list[int]
    sample_meta: dict[str, Mapping[str, Any]]
    entries: list[PreprocessEntry]


def plan_preprocess(
    storage: Storage,
    json_key: str,
    custom_tag: str = "",
    tag_position: str = "",
    genre_ratio: int = 0,
) -> PreprocessPlan:
    """Everything Side-Step's preprocessing derives from a `dataset.json` before touching audio."""
    doc = parse_dataset_json(storage.read_bytes(json_key))
    _, samples = split_dataset_json(doc)
    json_dir = storage.child(posixpath.dirname(json_key))
    loaded = load_dataset_metadata(doc)
    effective = apply_caller_overrides(loaded, custom_tag, tag_position, genre_ratio)
    files = discover_audio_files(json_dir, samples)
    genre_indices = select_genre_indices(len(files), effective["genre_ratio"])
    chosen = set(genre_indices)
    sample_meta = build_sample_meta(json_dir, samples)
    entries = []
    for index, path in enumerate(files):
        record = resolve_sample_record(sample_meta, path, effective["custom_tag"])
        use_genre = index in chosen
        entries.append(
            PreprocessEntry(
                index=index,
                path=path,
                record=record,
                use_genre=use_genre,
                text_prompt=build_text_prompt(record, effective["tag_position"], use_genre),
                pt_metadata=pt_metadata(path, record),
            )
        )
    return PreprocessPlan(files, loaded, effective, genre_indices, sample_meta, entries)


# -- normalisation at the training boundary ------------------------------------------------------
_LANGUAGES = {
    "english": "en",
    "chinese": "zh",
    "mandarin": "zh",
    "cantonese": "yue",
    "japanese": "ja",
    "korean": "ko",
    "spanish": "es",
    "french": "fr",
    "german": "de",
    "italian": "it",
    "portuguese": "pt",
    "russian": "ru",
    "dutch": "nl",
    "swedish": "sv",
    "polish": "pl",
    "turkish": "tr",
    "arabic": "ar",
    "hindi": "hi",
    "vietnamese": "vi",
    "thai": "th",
    "indonesian": "id",
}
_KEY_RE = re.compile(r"^([A-Ga-g])\s*([#♯b♭]?)\s*([A-Za-z]*)$")
_SIGNATURE_RE = re.compile(r"^(\d+)\s*(?:/\s*\d+)?$")


def normalize_language(language: str) -> str:
    """ISO 639-1 for common language names ("English" -> "en"); other text lower-cased."""
    text = (language or "").strip().lower()
    return _LANGUAGES.get(text, text)


def normalize_keyscale(key: str) -> str:
    """ "c# min" -> "C# minor"; a bare note or anything unparsable -> "" (the model needs a mode)."""
    match = _KEY_RE.match((key or "").strip())
    if not match:
        return ""
    note, accidental, mode = match.groups()
    accidental = {"♯": "#", "♭": "b"}.get(accidental, accidental)
    if mode.lower() in ("major", "maj") or mode == "M":
        return f"{note.upper()}{accidental} major"
    if mode.lower() in ("minor", "min") or mode == "m":
        return f"{note.upper()}{accidental} minor"
    return ""


def normalize_timesignature(signature: str) -> str:
    """The numerator when it is 2, 3, 4 or 6 ("6/8" -> "6"), else ""."""
    match = _SIGNATURE_RE.match((signature or "").strip())
    return match.group(1) if match and int(match.group(1)) in (2, 3, 4, 6) else ""


# -- building ------------------------------------------------------------------------------------
def _record(sample: Sample, summary: DatasetSummary, prior: Mapping[str, Any]) -> dict[str, Any]:
    own = {
        "id": dataset_json_id(sample.rel_path),
        "audio_path": sample.audio_path,
        "filename": sample.filename,
        "caption": sample.caption or caption_from_filename(sample.filename),
        "genre": sample.genre,
        "lyrics": sample.lyrics or INSTRUMENTAL_LYRICS,
        "raw_lyrics": sample.lyrics,
        "formatted_lyrics": prior.get("formatted_lyrics", ""),
        "bpm": sample.bpm,
        "keyscale": normalize_keyscale(sample.key),
        "timesignature": normalize_timesignature(sample.signature),
        "duration": int(sample.duration),
        "language": normalize_language(sample.language)
        or prior.get("language")
        or normalize_language(summary.default_language)
        or "unknown",
        "is_instrumental": sample.is_instrumental,
        "custom_tag": sample.custom_tag or summary.custom_tag,
        "labeled": bool(sample.caption),
        "prompt_override": sample.prompt_override,
        "repeat": sample.repeat,
    }
    return {**own, **{k: v for k, v in prior.items() if k not in own}}


def build_dataset_json(
    summary: DatasetSummary, samples: Sequence[Sample], previous: Any, now: str
) -> dict[str, Any]:
    """The `{metadata, samples}` document for `samples` (already filtered: no excluded or
    missing files). `previous` is the parsed file being replaced (None if there is none); `now`
    is the local-time ISO stamp used only when it has no `created_at`."""
    prior_meta, prior_samples = split_dataset_json(previous) if previous is not None else ({}, [])
    prior_by_path = {str(s.get("audio_path", "")).lower(): s for s in prior_samples}
    records = [_record(s, summary, prior_by_path.get(s.audio_path.lower(), {})) for s in samples]
    metadata = {
        "name": summary.name,
        "custom_tag": summary.custom_tag,
        "tag_position": summary.tag_position,
        "created_at": prior_meta.get("created_at") or now,
        "num_samples": len(records),
        "all_instrumental": bool(records) and all(r["is_instrumental"] for r in records),
        "genre_ratio": summary.genre_ratio,
        "default_artist": summary.default_artist,
        "default_album": summary.default_album,
        "default_genre": summary.default_genre,
        "default_language": normalize_language(summary.default_language),
    }
    carried = {k: v for k, v in prior_meta.items() if k not in metadata}
    return {"metadata": {**metadata, **carried}, "samples": records}


def dumps_dataset_json(doc: Any) -> str:
    return json.dumps(doc, indent=2, ensure_ascii=False)
