"""Dataset routes: scan preview, create, list, detail, settings, samples, bulk edits, build, and
the songs grid (`/datasets/{id}/songs`: one row per song, one song's fields fixed by hand).

Thin: each handler checks the paths a request names, finds the dataset, and calls
`dataset.store`. Status codes: 201 created, 202 job started, 403 path outside the allowed roots,
404 unknown dataset/sample, 409 folder already registered / file missing / job running, 422 invalid
body (the contracts refuse unknown keys).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body
from fastapi.responses import JSONResponse

from hotstep_ray.core import layout
from hotstep_ray.core.contracts import (
    BuildOptions,
    CreateDatasetInput,
    DatasetSummary,
    PatchSampleInput,
)
from hotstep_ray.core.errors import HotstepError, InputError, StorageError
from hotstep_ray.core.storage import Storage
from hotstep_ray.dataset import store
from hotstep_ray.dataset.scan import probe_sample, scan_preview
from hotstep_ray.studio.context import Studio
from hotstep_ray.studio.errors import ConflictError, NotFoundError
from hotstep_ray.studio.models import (
    IMMUTABLE_DATASET_FIELDS,
    BulkFailure,
    BulkInput,
    BulkResult,
    PatchDatasetInput,
    Song,
    SongPatch,
)

# Jobs that write songs' sidecars: an edit made while one runs could be overwritten by it, or
# overwrite what it just wrote.
SIDECAR_WRITING_KINDS = frozenset({"label", "make"})


def _folder(studio: Studio, raw: str, what: str) -> Storage:
    """A folder a request names: inside the allowed roots, and existing."""
    source = Storage(studio.guard.check(raw, what))
    if not source.exists("") or not source.is_dir(""):
        raise NotFoundError(f"{what} not found: {source.url}")
    return source


def find_dataset(studio: Studio, ref: str) -> DatasetSummary:
    """A dataset by slug (what the CLI shows) or by id (what the seed's UI sends)."""
    try:
        if studio.storage.exists(layout.dataset_meta(ref)):
            return store.load_summary(studio.storage, ref)
    except InputError:
        pass  # not a valid slug: maybe an id
    for summary in store.list_datasets(studio.storage):
        if summary.id == ref:
            return summary
    raise NotFoundError(f"no dataset {ref!r}")


def _variants(storage: Storage, slug: str) -> list[str]:
    parent = layout.tensor_dir(slug, "x").rsplit("/", 1)[0]
    return sorted(k.rsplit("/", 1)[-1] for k in storage.list(parent) if storage.is_dir(k))


def router(studio: Studio) -> APIRouter:
    api = APIRouter()
    storage = studio.storage

    @api.get("/scan-preview")
    def get_scan_preview(path: str, recursive: bool = True) -> dict[str, Any]:
        return scan_preview(_folder(studio, path, "path"), recursive).to_json_dict()

    @api.get("/datasets")
    def list_datasets() -> dict[str, Any]:
        return {"datasets": [s.to_json_dict() for s in store.list_datasets(storage)]}

    @api.post("/datasets", status_code=201)
    def create_dataset(inp: CreateDatasetInput) -> JSONResponse:
        source = _folder(studio, inp.source_dir, "sourceDir")
        existing = store.find_dataset_by_source(storage, source.url)
        if existing:
            raise ConflictError(f"{source.url} already has a dataset: {existing!r}")
        inp = inp.model_copy(update={"source_dir": source.url})
        detail = store.create_dataset(storage, inp)
        return JSONResponse({"dataset": detail.to_json_dict()}, status_code=201)

    @api.get("/datasets/{dataset_id}")
    def get_dataset(dataset_id: str) -> dict[str, Any]:
        summary = find_dataset(studio, dataset_id)
        detail = store.scan_dataset(storage, summary)
        detail = detail.model_copy(
            update={
                "active_job_id": studio.jobs.active_job_for(summary.id),
                "preprocessed_variants": _variants(storage, summary.slug),
            }
        )
        return detail.to_json_dict()

    @api.patch("/datasets/{dataset_id}")
    def patch_dataset(dataset_id: str, body: dict[str, Any] = Body(...)) -> dict[str, Any]:
        summary = find_dataset(studio, dataset_id)
        fixed = sorted(IMMUTABLE_DATASET_FIELDS & set(body))
        if fixed:
            raise InputError(f"{', '.join(fixed)} cannot be changed after creation")
        changes = PatchDatasetInput.model_validate(body).model_dump(exclude_unset=True)
        return {"dataset": store.update_dataset(storage, summary.slug, changes).to_json_dict()}

    @api.delete("/datasets/{dataset_id}")
    def delete_dataset(dataset_id: str) -> dict[str, Any]:
        """Forget a dataset: its record and labels go; the songs folder is never touched."""
        summary = find_dataset(studio, dataset_id)
        running = studio.jobs.active_job_for(summary.id)
        if running:
            raise ConflictError(f"a job is already running for this dataset ({running})")
        storage.delete(layout.dataset_dir(summary.slug), recursive=True)
        return {"ok": True}

    @api.patch("/datasets/{dataset_id}/samples/{sample_id}")
    def patch_sample(dataset_id: str, sample_id: str, patch: PatchSampleInput) -> dict[str, Any]:
        summary = find_dataset(studio, dataset_id)
        return {"sample": _patch_one(studio, summary, sample_id, patch).to_json_dict()}

    @api.get("/datasets/{dataset_id}/songs")
    def list_songs(dataset_id: str) -> dict[str, Any]:
        summary = find_dataset(studio, dataset_id)
        detail = store.scan_dataset(storage, summary)
        return {
            "datasetId": summary.id,
            "slug": summary.slug,
            "songs": [Song.of(s).to_json_dict() for s in detail.samples],
            "warnings": detail.warnings,
        }

    @api.get("/datasets/{dataset_id}/songs/{sample_id}")
    def get_song(dataset_id: str, sample_id: str) -> dict[str, Any]:
        summary = find_dataset(studio, dataset_id)
        return {"song": _one_song(studio, summary, sample_id).to_json_dict()}

    @api.patch("/datasets/{dataset_id}/songs/{sample_id}")
    def patch_song(dataset_id: str, sample_id: str, patch: SongPatch) -> dict[str, Any]:
        """Write the given fields into the song's sidecar (atomically, the original kept as
        `<stem>.txt.bak`: `dataset.sidecar.write_sidecar`) and return the song as re-read."""
        summary = find_dataset(studio, dataset_id)
        changes = patch.model_dump(exclude_unset=True)
        if not changes:
            raise InputError(f"name a field to change: {', '.join(SongPatch.model_fields)}")
        running = studio.jobs.active_job_for(summary.id)
        if running and studio.jobs.get(running).kind in SIDECAR_WRITING_KINDS:
            raise ConflictError(
                f"job {running} is writing this dataset's sidecars; edit the song when it ends"
            )
        sample = _patch_one(studio, summary, sample_id, PatchSampleInput(**changes))
        return {"song": Song.of(sample, full=True).to_json_dict()}

    @api.post("/datasets/{dataset_id}/samples/bulk")
    def bulk_set(dataset_id: str, body: BulkInput) -> dict[str, Any]:
        summary = find_dataset(studio, dataset_id)
        patch = PatchSampleInput(**body.set.model_dump(exclude_unset=True))
        if not patch.model_fields_set:
            raise InputError("set names no field to change")
        result = BulkResult()
        for sample_id in dict.fromkeys(body.sample_ids):
            try:
                _patch_one(studio, summary, sample_id, patch)
                result.updated += 1
            except HotstepError as exc:  # one bad sample must not stop the others
                result.failed.append(BulkFailure(sample_id=sample_id, error=str(exc)))
        return result.to_json_dict()

    @api.post("/datasets/{dataset_id}/build", status_code=202)
    def build(dataset_id: str, options: BuildOptions | None = None) -> JSONResponse:
        summary = find_dataset(studio, dataset_id)
        options = options or BuildOptions()
        if options.output_path:
            checked = studio.guard.check(options.output_path, "outputPath")
            # The store's own rule on top: inside the songs folder or the storage root.
            store.resolve_output(storage, Storage(summary.source_dir), summary.slug, checked)
            options = options.model_copy(update={"output_path": checked})
        job = studio.jobs.submit("build", summary, options)
        return JSONResponse({"jobId": job.id, "job": job.to_json_dict()}, status_code=202)

    @api.get("/datasets/{dataset_id}/dataset-json")
    def get_dataset_json(dataset_id: str) -> dict[str, Any]:
        summary = find_dataset(studio, dataset_id)
        if not summary.dataset_json_path:
            raise NotFoundError(f"dataset {summary.slug!r} is not built yet")
        return {
            "path": summary.dataset_json_path,
            "builtAt": summary.built_at,
            "dataset": _read_built(storage, summary),
        }

    return api


def _patch_one(studio: Studio, summary: DatasetSummary, sample_id: str, patch: PatchSampleInput):
    source = Storage(summary.source_dir)
    try:
        rel_path = store.find_rel_path(studio.storage, summary, source, sample_id)
    except InputError as exc:
        raise NotFoundError(str(exc)) from exc
    if not source.exists(rel_path):
        raise ConflictError(f"{rel_path} is missing from disk; it cannot be edited")
    return store.patch_sample(studio.storage, summary.slug, sample_id, patch)


def _one_song(studio: Studio, summary: DatasetSummary, sample_id: str) -> Song:
    """One song as a scan of the whole folder would show it, reading only its own files."""
    source = Storage(summary.source_dir)
    try:
        rel_path = store.find_rel_path(studio.storage, summary, source, sample_id)
    except InputError as exc:
        raise NotFoundError(str(exc)) from exc
    label = store.read_label(studio.storage, summary.slug, sample_id)
    return Song.of(store.apply_label(probe_sample(source, rel_path), label), full=True)


def _read_built(storage: Storage, summary: DatasetSummary) -> Any:
    """The built `dataset.json`: under the storage root, or in the songs folder."""
    path = summary.dataset_json_path
    for root in (storage, Storage(summary.source_dir)):
        try:
            key = root.key_of(path)
        except StorageError:
            continue
        if root.exists(key):
            return root.read_json(key)
    raise NotFoundError(f"{path} is gone; build the dataset again")
