"""Dataset records under a storage root, the label store, and the build of `dataset.json`.

    datasets/<slug>/dataset_meta.json        DatasetSummary (camelCase, like the wire format)
    datasets/<slug>/labels/<sample_id>.json  studio-private label record (HOT-Step field names)
    datasets/<slug>/dataset.json             the default build output

The songs and their sidecars stay in the source folder, which may itself be a URL: every read and
write there goes through a `Storage` rooted at that folder. Disk is the source of truth: a dataset
is rescanned whenever it is loaded, and only settings and counts are stored in its record.
"""

from __future__ import annotations

import posixpath
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from hotstep_ray.audio.io import probe_audio
from hotstep_ray.core import layout
from hotstep_ray.core.contracts import (
    BuildOptions,
    CreateDatasetInput,
    DatasetDetail,
    DatasetSummary,
    PatchSampleInput,
    Sample,
)
from hotstep_ray.core.errors import InputError, PathNotAllowedError, StorageError
from hotstep_ray.core.storage import Storage
from hotstep_ray.dataset.dataset_json import (
    build_dataset_json,
    dumps_dataset_json,
    normalize_language,
    parse_dataset_json,
    split_dataset_json,
)
from hotstep_ray.dataset.ids import sample_id as make_sample_id
from hotstep_ray.dataset.scan import (
    SOURCED_FIELDS,
    MapFn,
    Probe,
    ensure_folder,
    list_audio_keys,
    pick_audio_files,
    probe_sample,
    scan_folder,
)
from hotstep_ray.dataset.sidecar import (
    caption_from_filename,
    load_sidecar,
    sidecar_key,
    stem_key,
    write_sidecar,
)

# Dataset settings a user may change after creation (slug, id and source folder are fixed).
MUTABLE_SETTINGS = frozenset(
    {
        "name",
        "recursive",
        "custom_tag",
        "tag_position",
        "genre_ratio",
        "default_artist",
        "default_album",
        "default_genre",
        "default_language",
    }
)
# DatasetDetail fields that are not stored in the record.
_DETAIL_ONLY = {"samples", "warnings", "active_job_id", "preprocessed_variants"}
# Settings an existing `dataset.json` in the source folder may seed (when the caller left them).
_SEEDABLE = ("custom_tag", "tag_position", "genre_ratio") + tuple(
    f"default_{k}" for k in ("artist", "album", "genre", "language")
)


def local_now_iso() -> str:
    return datetime.now().astimezone().isoformat(timespec="seconds")


# -- label store ---------------------------------------------------------------------------------
def read_label(storage: Storage, slug: str, sample_id: str) -> dict[str, Any]:
    key = layout.label_record(slug, sample_id)
    return storage.read_json(key) if storage.exists(key) else {}


def read_labels(storage: Storage, slug: str) -> dict[str, dict[str, Any]]:
    """Every label record of a dataset, by sample id."""
    records: dict[str, dict[str, Any]] = {}
    for key in storage.list(f"{layout.dataset_dir(slug)}/labels"):
        name = posixpath.basename(key)
        if name.endswith(".json") and not name.startswith("."):
            records[name[: -len(".json")]] = storage.read_json(key)
    return records


def patch_label(
    storage: Storage, slug: str, sample_id: str, patch: Mapping[str, Any]
) -> dict[str, Any]:
    """Shallow-merge `patch` into the record (`sources` merged by field); atomic write."""
    record = read_label(storage, slug, sample_id)
    merged = {"sampleId": sample_id, **record, **patch}
    if "sources" in patch:
        merged["sources"] = {**record.get("sources", {}), **patch["sources"]}
    storage.write_json(layout.label_record(slug, sample_id), merged)
    return merged


def apply_label(sample: Sample, record: Mapping[str, Any]) -> Sample:
    """Overlay a label record on a scanned sample. The sidecar stays the truth for fields and
    for "labeled"; the record adds exclusion, errors, provenance and analyzer data."""
    if not record:
        return sample
    status = sample.label_status
    # A caption that is only the file-name placeholder (written so Side-Step keeps the sidecar's
    # other fields) does not make a song labeled when its label run said otherwise.
    placeholder = sample.caption == caption_from_filename(sample.rel_path)
    if record.get("labelStatus") in ("error", "unlabeled") and (status != "labeled" or placeholder):
        status = record["labelStatus"]
    tags = record.get("tags") or {}
    return sample.model_copy(
        update={
            "excluded": bool(record.get("excluded", False)),
            "label_status": status,
            "error": "; ".join(e for e in (sample.error, record.get("error") or "") if e),
            "labeled_at": record.get("labeledAt") or "",
            "sources": {**sample.sources, **(record.get("sources") or {})},
            "has_audio_codes": bool(record.get("audioCodes")),
            "tag_artist": tags.get("artist") or "",
            "tag_title": tags.get("title") or "",
            "tag_album": tags.get("album") or "",
        }
    )


# -- dataset records -----------------------------------------------------------------------------
def save_summary(storage: Storage, summary: DatasetSummary) -> None:
    storage.write_json(layout.dataset_meta(summary.slug), summary.to_json_dict())


def load_summary(storage: Storage, slug: str) -> DatasetSummary:
    key = layout.dataset_meta(slug)
    if not storage.exists(key):
        raise InputError(f"no dataset {slug!r} in {storage.url}")
    return DatasetSummary.model_validate(storage.read_json(key))


def list_datasets(storage: Storage) -> list[DatasetSummary]:
    """Every dataset record under the root, newest first."""
    summaries = []
    for key in storage.list("datasets"):
        slug = posixpath.basename(key)
        if not slug.startswith(".") and storage.exists(f"{key}/dataset_meta.json"):
            summaries.append(load_summary(storage, slug))
    return sorted(summaries, key=lambda s: (s.created_at, s.slug), reverse=True)


def find_dataset_by_source(storage: Storage, source_url: str) -> str | None:
    """The slug of the dataset built from this folder (one dataset per folder), if any."""
    for summary in list_datasets(storage):
        if summary.source_dir == source_url:
            return summary.slug
    return None


def unique_slug(storage: Storage, base: str) -> str:
    """`base`, else `base-2`, `base-3`, ... (kept within 64 characters)."""
    slug, n = base, 1
    while storage.exists(layout.dataset_dir(slug)):
        n += 1
        suffix = f"-{n}"
        slug = base[: 64 - len(suffix)] + suffix
    return slug


def _seed_from_dataset_json(source: Storage, inp: CreateDatasetInput) -> dict[str, Any]:
    """Settings the caller did not give, taken from a `dataset.json` already in the folder."""
    if not source.exists("dataset.json"):
        return {}
    try:
        metadata, _ = split_dataset_json(parse_dataset_json(source.read_bytes("dataset.json")))
    except InputError:
        return {}
    seeds: dict[str, Any] = {}
    for name in _SEEDABLE:
        value = metadata.get(name)
        if name in inp.model_fields_set or not value:
            continue
        if name == "tag_position" and value not in ("prepend", "append", "replace"):
            continue
        if name == "genre_ratio" and not (isinstance(value, int) and 0 <= value <= 100):
            continue
        seeds[name] = value if name == "genre_ratio" else str(value)
    return seeds


def _with_counts(detail: DatasetDetail) -> DatasetDetail:
    present = [s for s in detail.samples if not s.file_missing]
    return detail.model_copy(
        update={
            "sample_count": len(present),
            "labeled_count": sum(1 for s in present if s.label_status == "labeled"),
            "excluded_count": sum(1 for s in present if s.excluded),
        }
    )


def scan_dataset(
    storage: Storage, summary: DatasetSummary, probe: Probe = probe_audio, map_fn: MapFn = map
) -> DatasetDetail:
    """Rescan the source folder and overlay the label store (a missing folder is a warning)."""
    labels = read_labels(storage, summary.slug)
    known = [r["relPath"] for r in labels.values() if isinstance(r.get("relPath"), str)]
    source = Storage(summary.source_dir)
    try:
        result = scan_folder(source, summary.recursive, probe, map_fn, known_rel_paths=known)
    except InputError as exc:
        return DatasetDetail(**summary.model_dump(), warnings=[str(exc)])
    samples = [apply_label(s, labels.get(s.sample_id, {})) for s in result.samples]
    detail = DatasetDetail(**summary.model_dump(), samples=samples, warnings=result.warnings)
    return _with_counts(detail)


def create_dataset(
    storage: Storage,
    inp: CreateDatasetInput,
    probe: Probe = probe_audio,
    map_fn: MapFn = map,
) -> DatasetDetail:
    """Register a folder of songs as a dataset: unique slug, scan, write its record."""
    source = Storage(inp.source_dir)
    ensure_folder(source)
    existing = find_dataset_by_source(storage, source.url)
    if existing:
        raise InputError(f"{source.url} already has a dataset: {existing!r}")
    if not list_audio_keys(source, inp.recursive):
        raise InputError(f"no audio files in {source.url}")
    name = inp.name.strip() or posixpath.basename(source.root_path.rstrip("/")) or "dataset"
    settings = {
        **inp.model_dump(exclude={"name", "source_dir"}),
        **_seed_from_dataset_json(source, inp),
    }
    settings["default_language"] = normalize_language(settings["default_language"])
    now = local_now_iso()
    summary = DatasetSummary(
        id=str(uuid.uuid4()),
        slug=unique_slug(storage, layout.slugify(name)),
        name=name,
        source_dir=source.url,
        created_at=now,
        updated_at=now,
        **settings,
    )
    detail = scan_dataset(storage, summary, probe, map_fn)
    save_summary(storage, DatasetSummary(**detail.model_dump(exclude=_DETAIL_ONLY)))
    return detail


def load_dataset(
    storage: Storage, slug: str, probe: Probe = probe_audio, map_fn: MapFn = map
) -> DatasetDetail:
    """The stored record plus a fresh scan (read-only: nothing is written)."""
    return scan_dataset(storage, load_summary(storage, slug), probe, map_fn)


def update_dataset(storage: Storage, slug: str, changes: Mapping[str, Any]) -> DatasetSummary:
    """Change settings (`MUTABLE_SETTINGS`); validated by the contract, written atomically."""
    unknown = set(changes) - MUTABLE_SETTINGS
    if unknown:
        raise InputError(f"cannot change {sorted(unknown)} of a dataset")
    summary = load_summary(storage, slug)
    values = {**summary.model_dump(), **changes, "updated_at": local_now_iso()}
    values["default_language"] = normalize_language(values["default_language"])
    updated = DatasetSummary.model_validate(values)
    save_summary(storage, updated)
    return updated


# -- build ---------------------------------------------------------------------------------------
def _key_under(root: Storage, path: str) -> str | None:
    """The key of `path` under `root`, or None when it lies elsewhere."""
    if "://" in path:
        prefix = root.url.removesuffix(root.root_path)
        if root.is_local or not path.startswith(prefix):
            return None
        full = posixpath.normpath(path[len(prefix) :])
    elif root.is_local:
        full = str(Path(path).expanduser().resolve())
    else:
        return None
    try:
        return root.key_of(full)
    except StorageError:
        return None


def resolve_output(
    storage: Storage, source: Storage, slug: str, output_path: str
) -> tuple[Storage, str]:
    """(storage, key) to write `dataset.json` at. Default: `datasets/<slug>/dataset.json`; a
    given path must lie inside the source folder or the storage root (a folder gets
    `dataset.json` appended)."""
    if not output_path:
        return storage, layout.dataset_json(slug)
    for root in (source, storage):
        key = _key_under(root, output_path)
        if key is None:
            continue
        if not key or output_path.endswith("/") or root.is_dir(key):
            key = posixpath.join(key, "dataset.json") if key else "dataset.json"
        return root, key
    raise PathNotAllowedError(
        f"output path {output_path} is outside the source folder {source.url} "
        f"and the storage root {storage.url}"
    )


def build_from_detail(
    storage: Storage, detail: DatasetDetail, options: BuildOptions | None = None
) -> str:
    """Write `dataset.json` for a freshly scanned dataset (merging the previous file) and mark
    the dataset built; returns where the file is. Excluded, missing and unreadable files are
    left out."""
    options = options or BuildOptions()
    source = Storage(detail.source_dir)
    target, key = resolve_output(storage, source, detail.slug, options.output_path)
    included = included_samples(detail.samples)
    if not included:
        raise InputError(f"nothing to build in {detail.source_dir}: no readable, included songs")
    previous = None
    if target.exists(key):
        # A broken file is not silently replaced: it may hold fields we would lose.
        previous = parse_dataset_json(target.read_bytes(key))
        split_dataset_json(previous)
    now = local_now_iso()
    target.write_text(key, dumps_dataset_json(build_dataset_json(detail, included, previous, now)))
    url = target.url_of(key)
    built = detail.model_copy(
        update={"status": "built", "built_at": now, "dataset_json_path": url, "updated_at": now}
    )
    save_summary(storage, DatasetSummary(**built.model_dump(exclude=_DETAIL_ONLY)))
    return url


def build_dataset(
    storage: Storage,
    slug: str,
    options: BuildOptions | None = None,
    probe: Probe = probe_audio,
    map_fn: MapFn = map,
) -> str:
    """Rescan the dataset and write its `dataset.json`; returns where the file is."""
    return build_from_detail(storage, load_dataset(storage, slug, probe, map_fn), options)


# -- samples -------------------------------------------------------------------------------------
def find_rel_path(
    storage: Storage, summary: DatasetSummary, source: Storage, sample_id: str
) -> str:
    """A sample's relative path: from its label record, else from a listing of the folder."""
    rel_path = read_label(storage, summary.slug, sample_id).get("relPath")
    if isinstance(rel_path, str):
        return rel_path
    keys, _ = pick_audio_files(list_audio_keys(source, summary.recursive))
    for key in keys:
        if make_sample_id(key) == sample_id:
            return key
    raise InputError(f"no sample {sample_id!r} in dataset {summary.slug!r}")


def patch_sample(
    storage: Storage,
    slug: str,
    sample_id: str,
    patch: PatchSampleInput,
    probe: Probe = probe_audio,
) -> Sample:
    """Apply a user edit: sidecar fields go to `<stem>.txt` (keeping `.bak`), `excluded` and
    provenance (`sources: user`) to the label store. Only the fields the caller set change."""
    summary = load_summary(storage, slug)
    source = Storage(summary.source_dir)
    rel_path = find_rel_path(storage, summary, source, sample_id)
    if not source.exists(rel_path):
        raise InputError(f"{rel_path} is missing from disk; it cannot be edited")
    changes = patch.model_dump(exclude_unset=True)
    excluded = changes.pop("excluded", None)
    record: dict[str, Any] = {"relPath": rel_path}
    if excluded is not None:
        record["excluded"] = excluded
    if changes:
        fields = {**load_sidecar(source, stem_key(rel_path)).fields, **changes}
        write_sidecar(source, sidecar_key(rel_path), fields)
        record["sources"] = {name: "user" for name in changes if name in SOURCED_FIELDS}
    label = patch_label(storage, slug, sample_id, record)
    return apply_label(probe_sample(source, rel_path, probe), label)


def included_samples(samples: Iterable[Sample]) -> list[Sample]:
    """The samples a build writes: not excluded, on disk and readable."""
    return [s for s in samples if not (s.excluded or s.file_missing or s.error)]
