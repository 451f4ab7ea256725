"""The label job: persistence per sample, resume after a kill, failures that do not stop the
job, the analysis cache, user edits, and events."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pytest

from hotstep_ray.core.contracts import LabelOptions, PatchSampleInput
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.jobs import load_job, read_job_events
from hotstep_ray.dataset.sidecar import parse_sidecar_bytes
from hotstep_ray.dataset.store import load_dataset, load_summary, patch_sample, read_labels
from hotstep_ray.labeling.analysis import EssentiaAnalyzer
from hotstep_ray.labeling.captions import CaptionRequest, CaptionResult, OfflineCaptioner
from hotstep_ray.labeling.genius import GeniusClient
from hotstep_ray.labeling.http import HttpClient, ProviderError
from hotstep_ray.labeling.job import LabelExecutors, label_dataset
from hotstep_ray.labeling.providers import Providers, ProviderUnavailableError, resolve_providers

ALL = LabelOptions(scope="all", use_genius=False)


@dataclass
class CountingCaptioner:
    """Offline captions, counting calls, failing for the songs named in `fail_on`."""

    fail_on: tuple[str, ...] = ()
    calls: list[str] = field(default_factory=list)
    name: str = "offline"

    def caption(self, request: CaptionRequest) -> CaptionResult:
        self.calls.append(request.rel_path)
        if request.rel_path in self.fail_on:
            raise ProviderError("model is down")
        return OfflineCaptioner().caption(request)


def _providers(captioner=None, genius=None) -> Providers:
    return Providers(EssentiaAnalyzer(), genius, captioner or CountingCaptioner())


def _killed_after(n: int):
    """A `map` that dies (as a killed job would) when asked for result number `n + 1`."""

    def kill_map(fn, items):
        for index, result in enumerate(map(fn, items)):
            if index == n:
                raise KeyboardInterrupt("killed")
            yield result

    return kill_map


def _sidecars(ds) -> dict[str, dict[str, str]]:
    return {p.name: parse_sidecar_bytes(p.read_bytes()) for p in sorted(ds.source.glob("*.txt"))}


def test_labels_every_sample_and_persists_sidecars_and_records(song_dataset):
    ds = song_dataset
    events = []
    report = label_dataset(ds.storage, ds.slug, ALL, providers=_providers(), events=events.append)
    assert (report.total, report.labeled, report.failed, report.analysed) == (4, 4, 0, 4)

    sidecars = _sidecars(ds)
    assert set(sidecars) == {"a_first.txt", "b_second.txt", "c_third.txt", "d_fourth.txt"}
    first = sidecars["a_first.txt"]
    assert first["caption"] and first["bpm"] == "120" and first["language"] == "en"
    records = read_labels(ds.storage, ds.slug)
    record = next(r for r in records.values() if r["relPath"] == "a_first.wav")
    assert record["sources"] == {"caption": "essentia", "bpm": "essentia", "key": "essentia"}
    assert record["labelStatus"] == "labeled" and record["error"] == ""
    assert record["tags"] == {"artist": "Band", "title": "First"}
    assert record["essentia"]["bpm"] == 120 and record["durationCache"]["seconds"] == 3.0

    detail = load_dataset(ds.storage, ds.slug)
    assert all(s.label_status == "labeled" for s in detail.samples)
    assert load_summary(ds.storage, ds.slug).status == "labeled"
    assert load_job(ds.storage, report.job_id).status == "done"
    kinds = [e.type for e in read_job_events(ds.storage, report.job_id)]
    assert kinds.count("sample") == 4 and kinds[-1] == "status" and "progress" in kinds
    samples = [e for e in events if e.type == "sample"]
    assert samples[0].sample is not None and samples[0].sample.caption


def test_killed_job_resumes_with_scope_unlabeled_and_labels_each_sample_once(song_dataset):
    ds = song_dataset
    captioner = CountingCaptioner()
    events = []
    kill = LabelExecutors(map, map, _killed_after(2))
    with pytest.raises(KeyboardInterrupt):
        label_dataset(
            ds.storage,
            ds.slug,
            ALL,
            providers=_providers(captioner),
            events=events.append,
            executors=kill,
        )
    first_job = next(e.job.id for e in events if e.type == "job")
    assert load_job(ds.storage, first_job).status == "cancelled"
    assert sum(s.label_status == "labeled" for s in load_dataset(ds.storage, ds.slug).samples) == 2
    # Sample 3 was analysed (and its analysis stored) before the kill; its sidecar was not written.
    assert len(read_labels(ds.storage, ds.slug)) == 3
    assert len(_sidecars(ds)) == 2

    resume = LabelOptions(scope="unlabeled", use_genius=False)
    report = label_dataset(
        ds.storage, ds.slug, resume, providers=_providers(captioner), events=events.append
    )
    assert (report.total, report.labeled, report.analysed) == (2, 2, 1)  # one from the cache
    labeled = [e.sample_id for e in events if e.type == "sample" and e.status == "labeled"]
    assert len(labeled) == 4 and len(set(labeled)) == 4  # every sample exactly once
    assert all(s.label_status == "labeled" for s in load_dataset(ds.storage, ds.slug).samples)
    for fields in _sidecars(ds).values():
        assert fields["caption"] and fields["key"]  # whole, readable sidecars
    assert not list(ds.source.glob(".tmp-*")) and not list(
        ds.storage.local_path("").rglob(".tmp-*")
    )


def test_a_failing_provider_marks_its_sample_and_the_job_carries_on(song_dataset):
    ds = song_dataset
    captioner = CountingCaptioner(fail_on=("b_second.wav",))
    report = label_dataset(ds.storage, ds.slug, ALL, providers=_providers(captioner))
    assert (report.labeled, report.failed) == (3, 1)
    (error,) = report.errors.values()
    assert "caption: offline: model is down" in error
    assert load_job(ds.storage, report.job_id).status == "done"
    sample = next(
        s for s in load_dataset(ds.storage, ds.slug).samples if s.rel_path == "b_second.wav"
    )
    assert sample.label_status == "error" and "model is down" in sample.error
    # What did work (Essentia) is kept; a rerun only has to caption it.
    assert sample.bpm and sample.key and sample.sources["bpm"] == "essentia"


def test_relabel_reuses_the_analysis_until_the_file_changes(song_dataset):
    ds = song_dataset
    label_dataset(ds.storage, ds.slug, ALL, providers=_providers())
    again = label_dataset(ds.storage, ds.slug, ALL, providers=_providers())
    assert again.analysed == 0 and again.labeled == 4
    os.utime(ds.source / "c_third.wav", ns=(10**9, 10**9))
    third = label_dataset(ds.storage, ds.slug, ALL, providers=_providers())
    assert third.analysed == 1


def test_user_edits_survive_fill_missing(song_dataset):
    ds = song_dataset
    sample_id = load_dataset(ds.storage, ds.slug).samples[0].sample_id
    patch_sample(ds.storage, ds.slug, sample_id, PatchSampleInput(bpm=None, caption="Mine."))
    label_dataset(ds.storage, ds.slug, ALL, providers=_providers())
    fields = _sidecars(ds)["a_first.txt"]
    assert fields["caption"] == "Mine." and fields["bpm"] == ""  # emptied by the user: stays
    assert fields["key"] == "A major"
    record = read_labels(ds.storage, ds.slug)[sample_id]
    assert record["sources"]["caption"] == "user" and record["sources"]["key"] == "essentia"


def test_genius_lyrics_land_with_is_instrumental_false(song_dataset, fake_http):
    ds = song_dataset
    page = f"{fake_http.url}/band-first-lyrics"
    hit = {
        "type": "song",
        "result": {"title": "First", "primary_artist": {"name": "Band"}, "url": page},
    }

    def handle(seen):
        if seen.path == "/search":
            return {"response": {"hits": [hit] if seen.query["q"] == "First Band" else []}}
        if seen.path == "/band-first-lyrics":
            return '<div data-lyrics-container="true">[Verse 1: Band]<br>Hello</div>'
        return fake_http.Reply(500, "down")

    fake_http.handler = handle
    genius = GeniusClient("t", fake_http.url, HttpClient(timeout_s=5, sleep=lambda s: None))
    report = label_dataset(ds.storage, ds.slug, ALL, providers=_providers(genius=genius))
    assert report.labeled == 4
    first = _sidecars(ds)["a_first.txt"]
    assert first["lyrics"] == "[Verse 1]\nHello" and first["is_instrumental"] == "false"
    assert "with vocals" in first["caption"]
    records = {r["relPath"]: r for r in read_labels(ds.storage, ds.slug).values()}
    assert records["a_first.wav"]["sources"]["lyrics"] == "genius"
    assert records["a_first.wav"]["genius"]["step"] == 1
    # No match for the others: recorded, not an error; lyrics absent never set is_instrumental.
    assert records["b_second.wav"]["lyricsError"].startswith("no Genius match")
    assert _sidecars(ds)["b_second.txt"]["is_instrumental"] == ""


def test_nothing_to_label(song_dataset):
    ds = song_dataset
    label_dataset(ds.storage, ds.slug, ALL, providers=_providers())
    with pytest.raises(InputError, match="nothing to label"):
        label_dataset(ds.storage, ds.slug, LabelOptions(), providers=_providers())
    report = label_dataset(
        ds.storage, ds.slug, LabelOptions(allow_empty=True), providers=_providers()
    )
    assert report.skipped == "nothing-to-label" and report.job_id == ""


def test_missing_credentials_downgrade_unless_asked_for():
    providers, warnings = resolve_providers(LabelOptions(), env={})
    assert providers.genius is None and providers.captioner.name == "offline"
    assert any("GENIUS_ACCESS_TOKEN" in w for w in warnings)
    with pytest.raises(ProviderUnavailableError, match="GENIUS_ACCESS_TOKEN"):
        resolve_providers(LabelOptions(use_genius=True), env={})
    with pytest.raises(ProviderUnavailableError, match="GEMINI_API_KEY"):
        resolve_providers(LabelOptions(caption={"provider": "gemini"}), env={})
    auto, _ = resolve_providers(LabelOptions(), env={"GEMINI_API_KEY": "k"})
    assert auto.captioner.name == "gemini"
