"""The per-sample steps of a label job, as picklable callables over one `SampleWork` each.

A step never raises for a sample's own trouble (bad audio, no lyrics, a provider outage): it
records the problem on the work item and hands it on, so a map over many samples — builtin `map`
or a Ray actor pool — always runs to the end. Only a bug or a kill stops it.

Pass A runs in a helper process with a time limit (`isolation`): Essentia's C++ can loop forever
on a bad input, and only a process can be stopped mid-call. A sample whose Pass A failed (audio
that cannot be used, a timeout) skips Pass B: nothing is asked about audio that will not train.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

from hotstep_ray.core.storage import Storage
from hotstep_ray.labeling.analysis import (
    AudioFeatures,
    EssentiaAnalyzer,
    FileStamp,
    analyze_file,
    read_tags,
)
from hotstep_ray.labeling.captions import CaptionProvider, CaptionRequest, CaptionResult
from hotstep_ray.labeling.genius import (
    GeniusClient,
    GeniusNoArtistError,
    GeniusNotFoundError,
    LyricsMatch,
)
from hotstep_ray.labeling.isolation import run_isolated
from hotstep_ray.labeling.tags import identify


@dataclass
class SampleWork:
    """One sample on its way through the steps: the inputs the driver read, then each step's
    outcome."""

    sample_id: str
    rel_path: str
    source_url: str
    stamp: FileStamp | None
    current: dict[str, str]  # the sidecar fields when the job picked the sample up
    sources: dict[str, str]
    want_genius: bool = False
    want_caption: bool = False
    default_artist: str = ""
    # Pass A
    features: AudioFeatures | None = None
    tags: dict[str, str] = field(default_factory=dict)
    duration_s: float = 0.0
    from_cache: bool = False
    analysis_error: str = ""
    # Pass B
    lyrics: LyricsMatch | None = None
    lyrics_error: str = ""
    lyrics_failed: bool = False  # the service failed (as opposed to "no such song")
    caption: CaptionResult | None = None
    caption_error: str = ""
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def filename(self) -> str:
        return self.rel_path.rsplit("/", 1)[-1]

    @property
    def usable(self) -> bool:
        """Pass A found nothing that rules the sample out, so Pass B may run for it."""
        return not self.analysis_error

    @property
    def errors(self) -> list[str]:
        out = [f"analysis: {self.analysis_error}"] if self.analysis_error else []
        if self.lyrics_failed:
            out.append(f"genius: {self.lyrics_error}")
        if self.caption_error:
            out.append(f"caption: {self.caption_error}")
        return out


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


@dataclass(frozen=True)
class AnalyzeStep:
    """Pass A: tags and duration always; BPM/key/descriptors when an analyzer is given, in this
    process's helper process within `analyzer.time_limit_s`. Work that arrives with cached
    results (`from_cache`) passes straight through. Without an analyzer only the header is read
    (no decode, no C++ that could hang), here."""

    analyzer: EssentiaAnalyzer | None = None

    def __call__(self, work: SampleWork) -> SampleWork:
        if work.from_cache:
            return work
        started = time.perf_counter()
        try:
            if self.analyzer is not None:
                args = (self.analyzer, work.source_url, work.rel_path)
                features, tags = run_isolated(analyze_file, args, self.analyzer.time_limit_s)
                work = replace(work, features=features, tags=tags, duration_s=features.duration_s)
            else:
                tags, duration = read_tags(Storage(work.source_url), work.rel_path)
                work = replace(work, tags=tags, duration_s=duration)
        except Exception as exc:
            work = replace(work, analysis_error=_describe(exc))
        work.seconds["analysis"] = time.perf_counter() - started
        return work


@dataclass(frozen=True)
class GeniusStep:
    client: GeniusClient

    def for_concurrency(self, copies: int) -> GeniusStep:
        return replace(self, client=self.client.for_concurrency(copies))

    def __call__(self, work: SampleWork) -> SampleWork:
        if not work.want_genius or not work.usable:
            return work
        started = time.perf_counter()
        who = identify(work.tags, work.filename, work.default_artist)
        try:
            work = replace(work, lyrics=self.client.find_lyrics(who.artist, who.title))
        except (GeniusNoArtistError, GeniusNotFoundError) as exc:
            work = replace(work, lyrics_error=_describe(exc))
        except Exception as exc:
            work = replace(work, lyrics_error=_describe(exc), lyrics_failed=True)
        work.seconds["genius"] = time.perf_counter() - started
        return work


def winning_lyrics(work: SampleWork) -> str:
    """Lyrics the caption should know about: Genius's if found, else the sidecar's."""
    return work.lyrics.lyrics if work.lyrics else work.current.get("lyrics", "")


@dataclass(frozen=True)
class CaptionStep:
    provider: CaptionProvider
    include_lyrics_excerpt: bool = True

    def for_concurrency(self, copies: int) -> CaptionStep:
        scale = getattr(self.provider, "for_concurrency", None)
        return replace(self, provider=scale(copies)) if scale else self

    def request(self, work: SampleWork) -> CaptionRequest:
        who = identify(work.tags, work.filename, work.default_artist)
        features = work.features
        flag = work.current.get("is_instrumental", "").strip().lower()
        instrumental: bool | None = {"true": True, "false": False}.get(flag)
        if work.lyrics is not None:
            instrumental = False
        return CaptionRequest(
            sample_id=work.sample_id,
            title=who.title,
            artist=who.artist,
            bpm=features.bpm if features and features.bpm else _int(work.current.get("bpm")),
            key=features.keyscale
            if features and features.keyscale
            else work.current.get("key", ""),
            signature=work.current.get("signature", ""),
            local_caption=work.current.get("caption", ""),
            lyrics=winning_lyrics(work),
            is_instrumental=instrumental,
            features=features,
            analysis_error=work.analysis_error,
            source_url=work.source_url,
            rel_path=work.rel_path,
            include_lyrics_excerpt=self.include_lyrics_excerpt,
        )

    def __call__(self, work: SampleWork) -> SampleWork:
        if not work.want_caption or not work.usable:
            return work
        started = time.perf_counter()
        try:
            work = replace(work, caption=self.provider.caption(self.request(work)))
        except Exception as exc:
            name = getattr(self.provider, "name", "caption")
            work = replace(work, caption_error=f"{name}: {_describe(exc)}")
        work.seconds["caption"] = time.perf_counter() - started
        return work


def _int(value: Any) -> int | None:
    try:
        return int(float(value)) or None
    except (TypeError, ValueError):
        return None
