"""The main job on the embedded default: bundled songs → labeled dataset, on a local Ray.

It grows stage by stage into label → preprocess → train → audition as those land; today it renders
the example songs (once), registers them as a dataset (once; reruns reuse it) with the per-file work
spread over Ray tasks, labels every song offline (Essentia BPM/key + the offline captioner, filling
only what is missing, on Ray actor pools), and writes the Side-Step `dataset.json`.
"""

from __future__ import annotations

from dataclasses import dataclass

from hotstep_ray.audio.example_songs import write_example_songs
from hotstep_ray.core import layout
from hotstep_ray.core.contracts import (
    BuildOptions,
    CaptionProviderChoice,
    CreateDatasetInput,
    DatasetDetail,
    LabelOptions,
)
from hotstep_ray.core.events import EventSink, child_sink
from hotstep_ray.core.jobs import Job
from hotstep_ray.core.storage import Storage
from hotstep_ray.dataset.store import (
    build_from_detail,
    create_dataset,
    find_dataset_by_source,
    load_dataset,
)
from hotstep_ray.distributed.map import RayMap
from hotstep_ray.distributed.runtime import ensure_ray
from hotstep_ray.labeling.ray_pool import label_dataset_on_ray

EXAMPLE_SONGS_KEY = "examples/songs"
EXAMPLE_DATASET_NAME = "examples"
EXAMPLE_TRIGGER = "hsdemo"


# The embedded default needs no network and no keys: Essentia + the offline captioner, and only
# fields a sidecar lacks are filled (a user's own caption or BPM is never replaced).
OFFLINE_LABELS = LabelOptions(
    scope="all",
    use_genius=False,
    caption=CaptionProviderChoice(provider="offline"),
    merge_policy="fill_missing",
    allow_empty=True,
)


@dataclass(frozen=True)
class MainJobResult:
    job_id: str
    label_job_id: str
    dataset: DatasetDetail
    dataset_json_url: str
    songs_url: str
    events_url: str


def run_main_job(
    data: str, ray_address: str | None = None, sinks: tuple[EventSink, ...] = ()
) -> MainJobResult:
    """Run the main job with `data` as the storage root (a folder or an `s3://` URL)."""
    storage = Storage(data)
    songs = storage.child(EXAMPLE_SONGS_KEY)
    with Job(storage, "build", sinks=sinks) as job:
        job.phase("songs")
        written = write_example_songs(songs)
        job.events.log(f"{len(written)} example songs in {songs.url}")

        job.phase("ray")
        ray = ensure_ray(ray_address)
        job.events.log(f"Ray: {int(ray.cluster_resources().get('CPU', 0))} CPUs")

        def progress(done: int, total: int) -> None:
            job.events.progress(done, total, phase="probe")

        ray_map = RayMap(num_cpus=0.5, on_progress=progress)
        # One scan per run: the detail from create/load feeds the build directly.
        job.phase("scan")
        slug = find_dataset_by_source(storage, songs.url)
        if slug is None:
            inp = CreateDatasetInput(
                name=EXAMPLE_DATASET_NAME, source_dir=songs.url, custom_tag=EXAMPLE_TRIGGER
            )
            detail = create_dataset(storage, inp, map_fn=ray_map)
            job.events.log(f"created dataset {detail.slug!r}")
        else:
            detail = load_dataset(storage, slug, map_fn=ray_map)
            job.events.log(f"reusing dataset {slug!r}")
        for warning in detail.warnings:
            job.events.log(warning, level="warn")

        job.phase("label")
        report = label_dataset_on_ray(
            storage, detail.slug, OFFLINE_LABELS, events=child_sink(job.events)
        )
        detail = load_dataset(storage, detail.slug, map_fn=ray_map)  # sidecars changed: rescan

        job.phase("build")
        url = build_from_detail(storage, detail, BuildOptions())
        job.summary.dataset_id = detail.id
        return MainJobResult(
            job_id=job.id,
            label_job_id=report.job_id,
            dataset=detail,
            dataset_json_url=url,
            songs_url=songs.url,
            events_url=storage.url_of(layout.job_events(job.id)),
        )
