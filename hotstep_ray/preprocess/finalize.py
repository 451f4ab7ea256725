"""Merge a run's per-sample outputs with the cached entries and write the three variant files
(`preprocess_meta.json`, `lm_codes.jsonl`, `channel_stats.json`). Shared by both executors.

A file is rewritten only when its content changes (timestamps are not content), so a rerun that
finds everything cached writes nothing at all. A killed run leaves these three files as they
were; the next run's plan rebuilds the entries of the songs that landed from their own headers
(`plan.make_plan`, "recovered"), so its meta is the one an uninterrupted run would have written.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from pydantic import Field

from hotstep_ray.core.contracts import LATENT_HZ, Contract
from hotstep_ray.core.errors import StorageError
from hotstep_ray.core.events import EventLog
from hotstep_ray.core.storage import Storage
from hotstep_ray.preprocess.cache import (
    CODE_LINE_FIELDS,
    CODES_FILE,
    STATS_FILE,
    SampleOutputs,
    merge_channel_stats,
    read_sample,
)
from hotstep_ray.preprocess.plan import META_FILE, RunPlan
from hotstep_ray.preprocess.sample_job import FORMAT

_RUN_ONLY_OPTIONS = {"overwrite", "sample_ids"}  # steer one run; not a property of the cache
_STAMPS = ("created_at", "updated_at")


class PreprocessResult(Contract):
    slug: str
    variant_key: str
    tensor_dir: str  # URL of tensors/<slug>/<variant_key>
    total: int  # samples in the variant's meta
    processed: int  # encoded and written by this run
    cached: int  # left as they were
    failed: int  # samples whose entry is a failure (this run's and carried ones)
    errors: dict[str, str] = Field(default_factory=dict)  # sample id -> error
    written: list[str] = Field(default_factory=list)  # sample ids (re)written by this run
    removed: list[str] = Field(default_factory=list)  # sample ids dropped from the dataset
    # sample ids whose cached file held other settings than the meta said: re-encoded
    stale: list[str] = Field(default_factory=list)
    # sample ids a killed run had encoded but not recorded: kept from their files (in `cached`)
    recovered: list[str] = Field(default_factory=list)
    # sample ids outside `sample_ids` whose file disagreed with their entry: entry and file gone
    dropped: list[str] = Field(default_factory=list)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _write_if_changed(storage: Storage, key: str, text: str) -> bool:
    if storage.exists(key):
        try:
            if storage.read_text(key) == text:
                return False
        except (StorageError, UnicodeDecodeError):
            pass
    storage.write_text(key, text)
    return True


def _old_code_lines(storage: Storage, key: str) -> dict[str, str]:
    if not storage.exists(key):
        return {}
    lines = {}
    for line in storage.read_text(key).splitlines():
        try:
            lines[json.loads(line)["sample_id"]] = line
        except (ValueError, KeyError, TypeError):
            continue
    return lines


def _code_line_from_file(storage: Storage, tensor_dir: str, entry: dict[str, Any]) -> str:
    """Rebuild a lost codes line from the sample's own safetensors."""
    tensors, meta = read_sample(storage, f"{tensor_dir}/{entry['file']}")
    line = {"sample_id": entry["sample_id"], "file": entry["file"]}
    line["codes"] = tensors["audio_codes"].tolist()
    line.update({key: meta.get(key) for key in CODE_LINE_FIELDS})
    return json.dumps(line, ensure_ascii=False)


TENSOR_SUFFIXES = (".safetensors", ".pt")


def _sweep(storage: Storage, tensor_dir: str, entries: list[dict[str, Any]]) -> None:
    """The folder holds exactly the meta's good samples: a song that encoded before and fails
    now loses its old tensors, and files no entry names (a crashed run's) go. The trainers read
    every tensor file in the folder, so a stale one would train a song the cache calls failed.
    Runs under the preprocess lock, so no other run is writing here."""
    keep = {
        name
        for entry in entries
        if entry.get("ok")
        for name in (entry.get("file"), entry.get("pt_file"))
        if name
    }
    for key in storage.list(tensor_dir):
        name = key.rsplit("/", 1)[-1]
        if name.endswith(TENSOR_SUFFIXES) and name not in keep:
            storage.delete(key)


def finalize(
    storage: Storage,
    plan: RunPlan,
    outputs: dict[str, SampleOutputs],
    events: EventLog | None = None,
) -> PreprocessResult:
    tensor_dir = plan.tensor_dir
    entries: list[dict[str, Any]] = []
    for sid in plan.order:
        if sid in outputs:
            entries.append(outputs[sid].entry)
        elif sid in plan.carried:
            entries.append(plan.carried[sid])
    for old in plan.removed:  # no longer in the dataset: its files go too
        for name in (old.get("file"), old.get("pt_file")):
            if name:
                storage.delete(f"{tensor_dir}/{name}")
    _sweep(storage, tensor_dir, entries)

    old_lines = _old_code_lines(storage, f"{tensor_dir}/{CODES_FILE}")
    for sid in plan.recovered:  # an old line is another run's codes: rebuilt from the file
        old_lines.pop(sid, None)
    lines = []
    for entry in entries:
        if not entry.get("ok"):
            continue
        sid = entry["sample_id"]
        if sid in outputs and outputs[sid].codes_line:
            lines.append(outputs[sid].codes_line)
        elif sid in old_lines:
            lines.append(old_lines[sid])
        else:
            lines.append(_code_line_from_file(storage, tensor_dir, entry))
    _write_if_changed(storage, f"{tensor_dir}/{CODES_FILE}", "".join(f"{x}\n" for x in lines))

    stats = {
        "format": FORMAT,
        "variant_key": plan.paths.variant_key,
        **merge_channel_stats(entries),
    }
    _write_if_changed(storage, f"{tensor_dir}/{STATS_FILE}", json.dumps(stats, indent=2) + "\n")

    failed = {e["sample_id"]: e.get("error", "") for e in entries if not e.get("ok")}
    options = plan.options.model_dump(mode="json", exclude=_RUN_ONLY_OPTIONS)
    meta = {
        "format": FORMAT,
        "producer": "hotstep-ray",
        "slug": plan.slug,
        "dataset_json": plan.dataset_json,
        "variant_key": plan.paths.variant_key,
        "model_variant": plan.paths.model_variant,
        "models": plan.paths.to_dict(),
        "model_fingerprint": plan.fingerprint,
        "options": options,
        "settings": plan.settings,
        "latent_hz": LATENT_HZ,
        "total": len(entries),
        "ok": len(entries) - len(failed),
        "failed": len(failed),
        "samples": entries,
    }
    previous = plan.previous or {}
    unchanged = {k: v for k, v in previous.items() if k not in _STAMPS} == json.loads(
        json.dumps(meta)
    )
    if not unchanged:
        now = _now()
        stamped = {"created_at": previous.get("created_at") or now, "updated_at": now, **meta}
        storage.write_json(f"{tensor_dir}/{META_FILE}", stamped)
    written = [sid for sid, out in outputs.items() if out.entry.get("ok")]
    if events:
        events.log(
            f"preprocess {plan.slug}/{plan.paths.variant_key}: {len(written)} written, "
            f"{len(plan.carried)} cached, {len(failed)} failed"
        )
    return PreprocessResult(
        slug=plan.slug,
        variant_key=plan.paths.variant_key,
        tensor_dir=storage.url_of(tensor_dir),
        total=len(entries),
        processed=len(written),
        cached=len(plan.carried),
        failed=len(failed),
        errors=failed,
        written=written,
        removed=[old["sample_id"] for old in plan.removed],
        stale=list(plan.stale),
        recovered=list(plan.recovered),
        dropped=list(plan.dropped),
    )
