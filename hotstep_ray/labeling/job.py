"""The label job: Pass A (analysis) then Pass B (Genius, captions) per sample, merged into the
sidecar next to the song, every sample persisted the moment its last step finishes.

The steps are chained lazily — `caption_map(step, genius_map(step, analysis_map(step, work)))` —
so with builtin `map` each sample goes through every step before the next starts, and with Ray
actor pools (`ray_pool`) the stages overlap while results still stream back one by one.

Persistence and resume:
- Pass A's result goes to the label store (`labels/<id>.json`: `essentia`, `durationCache`,
  `tags`) as soon as it arrives; a later run reuses it while the file's size and mtime match.
- After Pass B the merged fields are written to `<stem>.txt` once (atomic, previous kept as
  `.bak`), then the label record (status, error, provenance, labeledAt).
- "Labeled" means the sidecar has a caption, so a job killed half-way and rerun with
  `scope=unlabeled` picks up exactly the samples that did not finish.
- A sample whose Pass A failed (unreadable, NaN or Inf samples, silent, too short, more than two
  channels, over the analysis time limit) gets no sidecar written or changed — no values are
  made up for audio that cannot train — and its record says why (`error`, `analysisError`).

One label run per dataset at a time: a run holds the dataset's lock (`core.locks.label_lock`)
from before it selects its samples until it ends, and a second one refuses at once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from hotstep_ray.core.contracts import DatasetSummary, FieldSource, LabelOptions, Sample
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.events import EventLog, EventSink, LogEvent, SampleEvent
from hotstep_ray.core.jobs import Job
from hotstep_ray.core.locks import StorageLock, label_lock
from hotstep_ray.core.storage import Storage
from hotstep_ray.dataset.dataset_json import normalize_language
from hotstep_ray.dataset.scan import SOURCED_FIELDS, probe_sample
from hotstep_ray.dataset.sidecar import load_sidecar, sidecar_key, stem_key, write_sidecar
from hotstep_ray.dataset.store import (
    apply_label,
    load_dataset,
    local_now_iso,
    patch_label,
    read_label,
    save_summary,
)
from hotstep_ray.labeling.analysis import file_stamp
from hotstep_ray.labeling.merge import Proposal, may_write, merge_fields
from hotstep_ray.labeling.providers import Providers, resolve_providers
from hotstep_ray.labeling.steps import AnalyzeStep, CaptionStep, GeniusStep, SampleWork

MapFn = Callable[[Callable[[Any], Any], Iterable[Any]], Iterable[Any]]


@dataclass(frozen=True)
class LabelExecutors:
    """How each stage fans out: builtin `map` here, Ray actor pools in `ray_pool`."""

    analysis: MapFn = map
    genius: MapFn = map
    caption: MapFn = map


@dataclass
class LabelReport:
    job_id: str = ""
    total: int = 0
    labeled: int = 0
    failed: int = 0
    unlabeled: int = 0  # finished without a caption and without an error (e.g. captions off)
    analysed: int = 0  # audio actually analysed (not served from the cache)
    warnings: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # sample id -> error
    skipped: str = ""  # why nothing ran ("nothing-to-label"), when allow_empty


def select_samples(samples: Iterable[Sample], options: LabelOptions) -> list[Sample]:
    """The samples a job labels: on disk, not excluded (unless asked for by id), and for
    `scope=unlabeled` without a caption yet."""
    wanted = set(options.sample_ids) if options.sample_ids is not None else None
    chosen = []
    for sample in samples:
        if sample.file_missing:
            continue
        if wanted is not None and sample.sample_id not in wanted:
            continue
        if wanted is None and sample.excluded:
            continue
        if options.scope == "unlabeled" and sample.label_status == "labeled":
            continue
        chosen.append(sample)
    return chosen


def current_sources(fields: Mapping[str, str], record: Mapping[str, Any]) -> dict[str, str]:
    """Provenance as the studio shows it: non-empty sidecar fields are `sidecar`, overlaid by
    what the label store recorded."""
    sources = {name: "sidecar" for name in SOURCED_FIELDS if fields.get(name)}
    return {**sources, **(record.get("sources") or {})}


def proposals_for(work: SampleWork) -> dict[str, Proposal]:
    """Every value the steps found, by field, in precedence order: Essentia before the model
    for BPM and key (measured beats guessed); the model before tags for genre."""
    found: dict[str, Proposal] = {}

    def offer(name: str, value: Any, source: FieldSource) -> None:
        if name not in found and value not in (None, ""):
            found[name] = Proposal(value, source)

    if work.features is not None:
        offer("bpm", work.features.bpm, "essentia")
        offer("key", work.features.keyscale, "essentia")
    if work.lyrics is not None:
        offer("lyrics", work.lyrics.lyrics, "genius")
    if work.caption is not None:
        # The offline captioner writes from the Essentia analysis, so that is its provenance.
        source: FieldSource = "essentia" if work.caption.provider == "offline" else "llm"
        for name, value in work.caption.fields.items():
            offer(name, value, source)
    offer("genre", work.tags.get("genre", ""), "tags")
    return found


class _LabelRun:
    """One job's driver side: prepares work items, persists results, reports events."""

    def __init__(
        self,
        storage: Storage,
        summary: DatasetSummary,
        options: LabelOptions,
        providers: Providers,
        log: EventLog,
        total: int,
    ) -> None:
        self.storage, self.summary, self.options = storage, summary, options
        self.providers, self.log = providers, log
        self.source = Storage(summary.source_dir)
        self.language = normalize_language(summary.default_language)
        self.report = LabelReport(total=total)

    # -- before the steps ----------------------------------------------------------------------
    def prepare(self, sample: Sample) -> SampleWork:
        record = read_label(self.storage, self.summary.slug, sample.sample_id)
        try:
            current = dict(load_sidecar(self.source, stem_key(sample.rel_path)).fields)
        except InputError as exc:
            # An unreadable sidecar is never overwritten blind: the sample is reported, not run.
            return SampleWork(
                sample.sample_id,
                sample.rel_path,
                self.source.url,
                None,
                {},
                {},
                from_cache=True,
                analysis_error=f"sidecar: {exc}",
            )
        sources = current_sources(current, record)
        try:
            stamp = file_stamp(self.source, sample.rel_path)
        except (OSError, FileNotFoundError):
            stamp = None
        policy = self.options.merge_policy
        explicit_instrumental = current.get("is_instrumental", "").strip().lower() == "true"
        work = SampleWork(
            sample_id=sample.sample_id,
            rel_path=sample.rel_path,
            source_url=self.source.url,
            stamp=stamp,
            current=current,
            sources=sources,
            default_artist=self.summary.default_artist,
            # Only ask a provider when the policy would let its answer land.
            want_genius=self.providers.genius is not None
            and not explicit_instrumental
            and may_write("lyrics", policy, current, sources),
            want_caption=self.providers.captioner is not None
            and any(
                may_write(f, policy, current, sources) for f in ("caption", "genre", "signature")
            ),
        )
        return self._from_cache(work, record)

    def _from_cache(self, work: SampleWork, record: Mapping[str, Any]) -> SampleWork:
        if work.stamp is None or not work.stamp.matches(record.get("durationCache")):
            return work
        tags = dict(record.get("tags") or {})
        seconds = float((record.get("durationCache") or {}).get("seconds") or 0.0)
        analyzer = self.providers.analyzer
        if analyzer is None:
            work.tags, work.duration_s, work.from_cache = tags, seconds, True
            return work
        features = analyzer.cached(dict(record), work.stamp)
        if features is not None:
            work.features, work.tags, work.duration_s = features, tags, seconds
            work.from_cache = True
        return work

    # -- after Pass A --------------------------------------------------------------------------
    def analysed(self, work: SampleWork) -> SampleWork:
        """Persist fresh analysis right away, so a kill after this point never redoes it; report
        values the analysis left out."""
        for note in work.features.notes if work.features else ():
            message = f"{work.rel_path}: {note}"
            self.report.warnings.append(message)
            self.log.log(message, level="warn")
        if not work.from_cache and not work.analysis_error:
            self.report.analysed += work.features is not None
            patch: dict[str, Any] = {"relPath": work.rel_path, "tags": work.tags}
            if work.stamp is not None:
                patch["durationCache"] = work.stamp.to_record(work.duration_s)
            # Without features (Essentia off) an older analysis must go: the new stamp would
            # otherwise vouch for it on the next run even if the file changed in between.
            patch["essentia"] = work.features.to_record() if work.features else None
            patch_label(self.storage, self.summary.slug, work.sample_id, patch)
        self._progress("essentia", work.sample_id)
        return work

    def _progress(self, phase: str, sample_id: str = "") -> None:
        done = self.report.labeled + self.report.failed + self.report.unlabeled
        self.log.progress(done, self.report.total, phase, self.report.failed, sample_id)

    def stage_done(self, phase: str) -> Callable[[SampleWork], SampleWork]:
        def note(work: SampleWork) -> SampleWork:
            self._progress(phase, work.sample_id)
            return work

        return note

    # -- after Pass B --------------------------------------------------------------------------
    def finish(self, work: SampleWork) -> None:
        """Merge into the sidecar (read fresh: a user edit made meanwhile is respected), then
        record status and provenance."""
        errors = list(work.errors)
        record: dict[str, Any] = {"relPath": work.rel_path}
        captioned = False
        # An unusable sample's sidecar is left as it is (see the module docstring).
        if work.usable:
            try:
                record["sources"], captioned = self._merge(work)
            except Exception as exc:  # e.g. a value the sidecar format cannot hold
                errors.append(f"write: {exc}")
        status = "labeled" if captioned else ("error" if errors else "unlabeled")
        record.update(
            labelStatus=status,
            # A labeled sample carries no sample error: the build would drop it. Step failures
            # stay visible in their own keys.
            error="" if captioned else "; ".join(errors),
            lyricsError=work.lyrics_error,
            captionError=work.caption_error,
            analysisError=work.analysis_error,
            labeledAt=local_now_iso() if captioned else "",
        )
        if work.lyrics is not None:
            lyr = work.lyrics
            record["genius"] = {
                "url": lyr.url,
                "title": lyr.title,
                "artist": lyr.artist,
                "step": lyr.step,
            }
        if work.caption is not None:
            cap = work.caption
            record["caption"] = {"provider": cap.provider, "model": cap.model, "audio": cap.audio}
        label = patch_label(self.storage, self.summary.slug, work.sample_id, record)
        self._count(work.sample_id, status, record["error"])
        sample = apply_label(probe_sample(self.source, work.rel_path), label)
        self.log.emit(
            SampleEvent(
                sample_id=work.sample_id, status=status, sample=sample, error=record["error"]
            )
        )
        self._progress("writing", work.sample_id)

    def _merge(self, work: SampleWork) -> tuple[dict[str, str], bool]:
        """Write the steps' proposals into the sidecar; (provenance, whether it has a caption)."""
        fresh = dict(load_sidecar(self.source, stem_key(work.rel_path)).fields)
        stored = read_label(self.storage, self.summary.slug, work.sample_id)
        merged = merge_fields(
            fresh,
            current_sources(fresh, stored),
            proposals_for(work),
            self.options.merge_policy,
            self.language,
        )
        if merged.written:
            write_sidecar(self.source, sidecar_key(work.rel_path), merged.fields)
        return merged.sources, bool(str(merged.fields.get("caption") or "").strip())

    def _count(self, sample_id: str, status: str, error: str) -> None:
        if status == "labeled":
            self.report.labeled += 1
        elif status == "error":
            self.report.failed += 1
            self.report.errors[sample_id] = error
        else:
            self.report.unlabeled += 1

    # -- the chain -----------------------------------------------------------------------------
    def run(self, samples: list[Sample], executors: LabelExecutors) -> LabelReport:
        p = self.providers
        work: Iterator[SampleWork] = (self.prepare(s) for s in samples)
        work = (self.analysed(w) for w in executors.analysis(AnalyzeStep(p.analyzer), work))
        if p.genius is not None:
            step = GeniusStep(p.genius)
            work = map(self.stage_done("genius"), executors.genius(step, work))
        if p.captioner is not None:
            step_c = CaptionStep(p.captioner)
            work = map(self.stage_done("llm"), executors.caption(step_c, work))
        for item in work:
            self.finish(item)
        return self.report


def _update_summary(storage: Storage, slug: str) -> None:
    """Refresh the dataset record's counts; `labeled` once every included song has a caption."""
    detail = load_dataset(storage, slug)
    present = [s for s in detail.samples if not s.file_missing and not s.excluded]
    status = detail.status
    if present and all(s.label_status == "labeled" for s in present) and status != "built":
        status = "labeled"
    values = {k: v for k, v in detail.model_dump().items() if k in DatasetSummary.model_fields}
    save_summary(
        storage, DatasetSummary(**{**values, "status": status, "updated_at": local_now_iso()})
    )


def label_dataset(
    storage: Storage,
    slug: str,
    options: LabelOptions | None = None,
    map_fn: MapFn = map,
    providers: Providers | None = None,
    events: EventSink | None = None,
    executors: LabelExecutors | None = None,
    env: Mapping[str, str] | None = None,
) -> LabelReport:
    """Label the samples of dataset `slug` (see the module docstring).

    Args:
        options: what to label and how (defaults: `LabelOptions()`).
        map_fn: how every stage fans out when `executors` is not given (builtin `map`).
        providers: analyzers/providers to use; default resolved from `options` and `env`.
        events: an extra sink for the job's events (the CLI's progress bar).
        executors: one map function per stage (Ray actor pools, see `ray_pool`).
        env: where keys are read (default `os.environ`).
    """
    with dataset_label_lock(storage, slug, events):
        return label_dataset_locked(
            storage, slug, options, map_fn, providers, events, executors, env
        )


def dataset_label_lock(storage: Storage, slug: str, events: EventSink | None) -> StorageLock:
    """The dataset's label lock, its takeover warning sent to `events`."""

    def warn(message: str) -> None:
        if events is not None:
            events(LogEvent(level="warn", message=message))

    return label_lock(storage, slug, warn=warn if events is not None else None)


def label_dataset_locked(
    storage: Storage,
    slug: str,
    options: LabelOptions | None = None,
    map_fn: MapFn = map,
    providers: Providers | None = None,
    events: EventSink | None = None,
    executors: LabelExecutors | None = None,
    env: Mapping[str, str] | None = None,
) -> LabelReport:
    """`label_dataset` for a caller that holds the dataset's label lock already."""
    options = options or LabelOptions()
    if options.use_understand:
        raise InputError("use_understand (the legacy ace-understand step) is not supported")
    detail = load_dataset(storage, slug)
    warnings: list[str] = []
    if providers is None:
        providers, warnings = resolve_providers(options, os.environ if env is None else env)
    samples = select_samples(detail.samples, options)
    if not samples:
        if options.allow_empty:
            return LabelReport(warnings=warnings, skipped="nothing-to-label")
        raise InputError(f"nothing to label in {slug!r} (scope {options.scope})")
    if not providers.any:
        raise InputError("no labeling step is enabled or available")
    executors = executors or LabelExecutors(map_fn, map_fn, map_fn)
    with Job(storage, "label", dataset_id=detail.id, sinks=(events,) if events else ()) as job:
        job.summary.total = len(samples)
        for warning in warnings:
            job.events.log(warning, level="warn")
        steps = [
            name
            for name, on in (
                ("essentia", providers.analyzer),
                ("genius", providers.genius),
                (getattr(providers.captioner, "name", ""), providers.captioner),
            )
            if on
        ]
        job.events.log(f"labeling {len(samples)} sample(s) of {slug!r}: {', '.join(steps)}")
        run = _LabelRun(storage, detail, options, providers, job.events, len(samples))
        report = run.run(samples, executors)
        report.job_id, report.warnings = job.id, warnings + report.warnings
        _update_summary(storage, slug)
        job.events.log(
            f"{report.labeled} labeled, {report.failed} failed, {report.unlabeled} without caption"
            f"; {report.analysed} analysed, {len(samples) - report.analysed} from cache or skipped"
        )
    return report
