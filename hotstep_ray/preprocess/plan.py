"""What a preprocessing run must do: resolve models, read the dataset's `dataset.json`, decide per
sample whether the cached tensors are still good, and build each sample's prompts.

A sample is redone when it is new, its output file is gone, its source file's size or mtime
changed, or its settings hash changed (run options that change tensors, the model fingerprint,
and the sample's own prompt fields). A sample that failed before and is unchanged keeps its
recorded error (`overwrite` retries it). Both executors (plain and Ray) run the same plan.

The meta is not taken on trust: each file it counts as cached must carry the same settings hash
in its own safetensors header (read without the tensors), else it is redone ("stale": a run with
other settings was killed after overwriting it). The header is also the record of a song that a
killed run encoded but never got to put in the meta: a sample that would be redone ("new",
"changed", "settings") whose file is not the one its entry describes but has this run's settings
hash and its source file's checksum is kept as it is ("recovered"). A sample outside `sample_ids` keeps its entry only while
its file agrees with it; otherwise the entry and the file go ("dropped"), and the next run over
that sample encodes it.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any

from hotstep_ray.audio.resample import RESAMPLER
from hotstep_ray.core import layout
from hotstep_ray.core.contracts import DatasetSummary, PreprocessOptions
from hotstep_ray.core.errors import InputError, StorageError
from hotstep_ray.core.events import EventLog
from hotstep_ray.core.storage import Storage
from hotstep_ray.dataset.dataset_json import build_text_prompt, plan_preprocess
from hotstep_ray.dataset.ids import sample_id as make_sample_id
from hotstep_ray.dataset.store import build_dataset, load_summary
from hotstep_ray.models.prompts import build_lyric_prompt, normalize_lyrics
from hotstep_ray.preprocess.model_paths import ModelPaths, model_fingerprint, resolve_models
from hotstep_ray.preprocess.sample_job import FORMAT, SampleJob

META_FILE = layout.PREPROCESS_META_FILE
# Record fields that change a sample's tensors or its stored metadata.
_RECORD_FIELDS = (
    "caption",
    "genre",
    "lyrics",
    "bpm",
    "keyscale",
    "timesignature",
    "language",
    "is_instrumental",
    "custom_tag",
    "trigger",
    "prompt_override",
    "repeat",
)
# Options that change tensors (the rest, e.g. `overwrite`, `sample_ids`, only steer the run).
_SETTING_FIELDS = (
    "max_duration_s",
    "normalize",
    "target_db",
    "dtype",
    "compat",
    "max_caption_tokens",
    "max_lyric_tokens",
    "vae_chunk_frames",
    "vae_overlap_frames",
    "seed",
)
_STEM_BAD = re.compile(r"[^A-Za-z0-9._-]")


@dataclass
class RunPlan:
    slug: str
    tensor_dir: str  # storage key of tensors/<slug>/<variant_key>
    paths: ModelPaths
    fingerprint: str
    options: PreprocessOptions
    settings: dict[str, Any]  # the hashed run settings
    dataset_json: str
    jobs: list[SampleJob]  # to encode, shortest first
    carried: dict[str, dict[str, Any]]  # sample id -> previous entry kept as is
    order: list[str]  # every sample id of the variant, in file order
    previous: dict[str, Any] | None = None
    removed: list[dict[str, Any]] = field(default_factory=list)  # entries of dropped samples
    # sample ids whose cached file holds other settings than its entry (re-encoded)
    stale: list[str] = field(default_factory=list)
    # sample ids kept from a file no meta entry vouched for (a killed run's), now in `carried`
    recovered: list[str] = field(default_factory=list)
    # sample ids outside `sample_ids` whose file disagrees with their entry (entry and file go)
    dropped: list[str] = field(default_factory=list)


def safe_stem(rel_path: str, sample_id: str) -> str:
    """`sub/My Song.flac` -> `sub__My_Song-<sample id>`: readable, unique, storage-safe."""
    stem = posixpath.splitext(rel_path.replace("\\", "/"))[0].replace("/", "__")
    return f"{_STEM_BAD.sub('_', stem)[:96]}-{sample_id}"


def settings_hash(settings: dict[str, Any], job_fields: dict[str, Any]) -> str:
    text = json.dumps({"run": settings, "sample": job_fields}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def caption_prompt(job: SampleJob, duration_s: float, genre: bool = False) -> str:
    """The DiT caption prompt. Metas carry the seconds actually encoded (inference writes the
    requested length; Side-Step writes the whole file's length even when it cuts)."""
    record = {**job.record, "duration": int(duration_s)}
    if genre:
        record["prompt_override"] = "genre"
    return build_text_prompt(record, job.tag_position, job.use_genre)


def genre_prompt(job: SampleJob, duration_s: float) -> str | None:
    """The genre variant of the caption prompt, when it differs from the main one."""
    if not job.record.get("genre") or job.record.get("prompt_override"):
        return None
    text = caption_prompt(job, duration_s, genre=True)
    return None if text == caption_prompt(job, duration_s) else text


def lyric_prompt(job: SampleJob, compat: str) -> str:
    """Inference form `# Languages\\n{lang}\\n\\n# Lyric\\n{lyrics}<|endoftext|>`; compat
    "sidestep" keeps Side-Step's raw lyrics (for parity runs only)."""
    record = job.record
    lyrics = normalize_lyrics(record.get("lyrics"), bool(record.get("is_instrumental", False)))
    if compat == "sidestep":
        return lyrics
    return build_lyric_prompt(lyrics, record.get("language") or None)


def _dataset_json_location(
    storage: Storage, slug: str, events: EventLog | None
) -> tuple[DatasetSummary, Storage, str]:
    """(summary, storage, key) of the dataset's dataset.json, building it when there is none."""
    summary = load_summary(storage, slug)
    url = summary.dataset_json_path
    if url:
        parent, name = posixpath.split(url)
        target = Storage(parent)
        if target.exists(name):
            return summary, target, name
    if not storage.exists(layout.dataset_json(slug)):
        if events:
            events.log(f"dataset {slug!r} has no dataset.json yet: building it")
        url = build_dataset(storage, slug)
        parent, name = posixpath.split(url)
        return load_summary(storage, slug), Storage(parent), name
    return summary, storage, layout.dataset_json(slug)


def _source_location(source: Storage, path: str) -> tuple[str, str, str]:
    """(root URL, key, rel_path) of a file dataset.json resolved to."""
    try:
        key = source.key_of(path)
        return source.url, key, key
    except StorageError:
        parent, name = posixpath.split(path)
        return Storage(parent).url, name, name


def _previous_meta(storage: Storage, tensor_dir: str) -> dict[str, Any] | None:
    key = f"{tensor_dir}/{META_FILE}"
    if not storage.exists(key):
        return None
    try:
        meta = storage.read_json(key)
    except StorageError:
        return None  # unreadable: everything is redone and the file rewritten
    return meta if isinstance(meta, dict) and meta.get("format") == FORMAT else None


def _stat(root: str, key: str) -> tuple[int, int]:
    source = Storage(root)
    try:
        return source.size(key), source.mtime_ns(key)
    except (OSError, StorageError):
        return -1, -1


def _reason(
    job: SampleJob, old: dict | None, present: set[str], opts: PreprocessOptions
) -> str | None:
    """Why `job` must run, or None when its previous entry stands."""
    if old is None:
        return "new"
    if opts.overwrite:
        return "overwrite"
    if (old.get("src_size"), old.get("src_mtime_ns")) != (job.src_size, job.src_mtime_ns):
        return "changed"
    if old.get("settings_hash") != job.settings_hash:
        return "settings"
    if not old.get("ok"):
        return None  # failed before, unchanged since: the recorded error stands
    wanted = [old.get("file")] + ([old.get("pt_file")] if opts.sidestep_pt else [])
    if not all(name and name in present for name in wanted):
        return "missing"
    return None


# Reasons to redo a sample that a file already holding this run's result can answer.
_RECOVERABLE = ("new", "changed", "settings")


def _file_agrees(storage: Storage, tensor_dir: str, entry: dict[str, Any], want: str) -> bool:
    """Whether a good entry's file says, in its own header, that it holds sample
    `entry["sample_id"]` made with settings hash `want`. Failed entries have no file."""
    # cache imports torch; this module is read when the CLI starts (`preprocess --help`)
    from hotstep_ray.preprocess.cache import read_header

    if not entry.get("ok"):
        return True
    header = read_header(storage, f"{tensor_dir}/{entry.get('file')}")
    return (
        header is not None
        and header.get("settings_hash") == want
        and header.get("sample_id") == entry["sample_id"]
    )


def _source_checksum(job: SampleJob, old: dict[str, Any] | None) -> str | None:
    """sha256 of the job's source file: the previous entry's when the file's size and mtime are
    the ones it recorded (the same test that keeps a cached sample), else read now."""

    if old and (old.get("src_size"), old.get("src_mtime_ns")) == (job.src_size, job.src_mtime_ns):
        if old.get("checksum"):
            return old["checksum"]
    if job.src_size < 0:
        return None
    from hotstep_ray.preprocess.cache import file_checksum  # torch-free start-up, as above

    try:
        return file_checksum(Storage(job.source_root), job.source_key)
    except (OSError, StorageError):
        return None


def _recover(
    storage: Storage,
    tensor_dir: str,
    job: SampleJob,
    old: dict[str, Any] | None,
    present: set[str],
    opts: PreprocessOptions,
) -> dict[str, Any] | None:
    """The entry of a file that already holds what `job` would write (a killed run encoded it
    and never wrote the meta), or None. Its header must carry the job's settings hash and the
    source's current checksum, and be another file than the one `old` describes (a file the meta
    already knew gets no second chance: a touched source is redone as it always was); with
    `sidestep_pt` the `.pt` must be there too (`write_outputs` writes it before the
    safetensors)."""
    from hotstep_ray.preprocess.cache import entry_from_file, read_header  # as above

    name = f"{job.stem}.safetensors"
    pt_file = f"{job.stem}.pt" if opts.sidestep_pt else None
    if name not in present or (pt_file and pt_file not in present):
        return None
    key = f"{tensor_dir}/{name}"
    header = read_header(storage, key)
    if header is None or header.get("settings_hash") != job.settings_hash:
        return None
    if header.get("sample_id") != job.sample_id:
        return None
    made = (header.get("settings_hash"), header.get("checksum"))
    if old and made == (old.get("settings_hash"), old.get("checksum")):
        return None  # the file the meta already describes: the reason to redo it stands
    if header.get("checksum") != _source_checksum(job, old):
        return None
    return entry_from_file(storage, key, job, header, pt_file)


def make_plan(
    storage: Storage,
    slug: str,
    options: PreprocessOptions,
    checkpoints_dir: str,
    events: EventLog | None = None,
) -> RunPlan:
    opts = options
    if opts.vae_chunk_frames <= 2 * opts.vae_overlap_frames:
        raise InputError(
            f"vae_chunk_frames ({opts.vae_chunk_frames}) must exceed twice vae_overlap_frames "
            f"({opts.vae_overlap_frames})"
        )
    paths = resolve_models(checkpoints_dir, opts)
    fingerprint = model_fingerprint(paths)
    settings = {name: getattr(opts, name) for name in _SETTING_FIELDS}
    # The resampler is part of what a cached latent depends on (a source at 44.1 kHz is resampled
    # before encoding): a change of it must re-encode, not reuse.
    settings.update(
        format=FORMAT,
        fingerprint=fingerprint,
        model_variant=paths.model_variant,
        resampler=RESAMPLER,
    )
    summary, json_storage, json_key = _dataset_json_location(storage, slug, events)
    plan = plan_preprocess(json_storage, json_key)
    tensor_dir = layout.tensor_dir(slug, paths.variant_key)
    previous = _previous_meta(storage, tensor_dir)
    old_entries = {e["sample_id"]: e for e in (previous or {}).get("samples", [])}
    present = {posixpath.basename(k) for k in storage.list(tensor_dir)}
    source = Storage(summary.source_dir)
    wanted = set(opts.sample_ids) if opts.sample_ids is not None else None
    jobs: list[SampleJob] = []
    carried: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    stale: list[str] = []
    recovered: list[str] = []
    dropped: list[str] = []
    tag_position = plan.effective_metadata["tag_position"]
    for entry in plan.entries:
        root, key, rel_path = _source_location(source, entry.path)
        sid = make_sample_id(rel_path)
        order.append(sid)
        if wanted is not None and sid not in wanted:
            old = old_entries.get(sid)
            if old is None:
                order.pop()
            elif _file_agrees(storage, tensor_dir, old, old.get("settings_hash", "")):
                carried[sid] = old
            else:  # not this run's to encode, and its entry no longer describes its file
                dropped.append(sid)
            continue
        size, mtime = _stat(root, key)
        fields = {name: entry.record.get(name) for name in _RECORD_FIELDS}
        fields.update(use_genre=entry.use_genre, tag_position=tag_position)
        if opts.sidestep_pt:
            fields["pt_metadata"] = entry.pt_metadata
        job = SampleJob(
            index=entry.index,
            sample_id=sid,
            rel_path=rel_path,
            audio_path=entry.path,
            source_root=root,
            source_key=key,
            stem=safe_stem(rel_path, sid),
            src_size=size,
            src_mtime_ns=mtime,
            record=entry.record,
            use_genre=entry.use_genre,
            tag_position=tag_position,
            pt_metadata=entry.pt_metadata,
            settings_hash=settings_hash(settings, fields),
        )
        old = old_entries.get(sid)
        reason = _reason(job, old, present, opts)
        if reason is None and not _file_agrees(storage, tensor_dir, old, job.settings_hash):
            reason = "stale"
            stale.append(sid)
        if reason in _RECOVERABLE:
            found = _recover(storage, tensor_dir, job, old, present, opts)
            if found is not None:
                carried[sid] = found
                recovered.append(sid)
                continue
        if reason is None:
            carried[sid] = old
        else:
            job.reason = reason
            jobs.append(job)
    kept = set(order)
    removed = [entry for sid, entry in old_entries.items() if sid not in kept]
    # Shortest first: neighbouring samples batch together with little padding.
    jobs.sort(key=lambda j: (float(j.record.get("duration") or 0), j.index))
    return RunPlan(
        slug=slug,
        tensor_dir=tensor_dir,
        paths=paths,
        fingerprint=fingerprint,
        options=opts,
        settings=settings,
        dataset_json=json_storage.url_of(json_key),
        jobs=jobs,
        carried=carried,
        order=order,
        previous=previous,
        removed=removed,
        stale=stale,
        recovered=recovered,
        dropped=dropped,
    )
