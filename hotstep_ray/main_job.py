"""The main job (`hotstep-ray make SONGS_DIR`; `make demo` runs it on the bundled songs): songs →
labeled dataset → tensor cache → DiT and LM adapters → an A/B over HTTP, on one Ray.
`run_main_job` is the recipe; each stage below is one function.

  dataset      the user's folder (or the bundled songs, rendered once) as a dataset (created
               once; reruns reuse it)
  label        Essentia BPM/key + the offline captioner on Ray actor pools; fills only what is
               missing, so a user's own caption or BPM is never replaced
  build        the Side-Step `dataset.json`
  checkpoints  `--checkpoints DIR`, or the tiny tree written once under <data>/checkpoints/tiny
  preprocess   the safetensors tensor cache on Ray Data or in this process (`placement`;
               cached samples are skipped)
  train-dit    a DiT adapter run (Ray Train, one worker; or in this process); the recorded run
               is reused when nothing it depends on changed, an interrupted one continued
               (`RunRecord`)
  train-lm     an LM adapter run (same), beside the DiT's
  audition     the audition Serve app on 127.0.0.1, one A/B over HTTP, Serve stopped again
  report       a PNG of both runs' loss per step

Events: label, preprocess and both trainers are jobs of their own (the same `jobs/<id>/` records
their CLI commands write); each is folded into the main job's `events.jsonl` through `child_sink`,
so the main stream ends with exactly one `status`. A Ray Train worker writes its stage's
events.jsonl itself; the main job follows that file while the worker runs.

The embedded default (no `--checkpoints`) is sized for a couple of minutes on 2 CPU cores (2 s
cuts, tiny adapters, a few epochs: `tiny_recipe`). With real ACE-Step 1.5 weights every option is
the contract default (`real_recipe`), except `--epochs`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
import secrets
import shutil
import socket
import tempfile
import threading
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hotstep_ray.audio.example_songs import write_example_songs
from hotstep_ray.core import layout
from hotstep_ray.core.compile_cache import use_compile_cache
from hotstep_ray.core.contracts import (
    AUDITION_DECODER_GPUS,
    AUDITION_LM_GPUS,
    JOB_PHASES,
    BuildOptions,
    CaptionProviderChoice,
    CheckpointCadence,
    CreateDatasetInput,
    DatasetDetail,
    JobKind,
    LabelOptions,
    MakeOptions,
    PreprocessOptions,
    TrainDitOptions,
    TrainLmOptions,
)
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.events import (
    EventSink,
    FollowJsonl,
    MetricEvent,
    ProgressEvent,
    child_sink,
)
from hotstep_ray.core.gpu_sampler import GpuSampler
from hotstep_ray.core.jobs import Job, read_job_events
from hotstep_ray.core.storage import Storage
from hotstep_ray.dataset.store import (
    build_from_detail,
    create_dataset,
    find_dataset_by_source,
    load_dataset,
)
from hotstep_ray.distributed.map import RayMap
from hotstep_ray.distributed.runtime import ensure_ray, one_machine
from hotstep_ray.labeling.job import LabelReport
from hotstep_ray.labeling.ray_pool import label_dataset_on_ray
from hotstep_ray.preprocess.plan import META_FILE
from hotstep_ray.report_plot import Series, loss_plot

if TYPE_CHECKING:  # torch-side: imported where a stage needs them, so the job starts light
    from hotstep_ray.preprocess.finalize import PreprocessResult
    from hotstep_ray.preprocess.ray_pipeline import RayPipelineConfig
    from hotstep_ray.training.lm_spec import LmEngine

EXAMPLE_SONGS_KEY = "examples/songs"
EXAMPLE_DATASET_NAME = "examples"
EXAMPLE_TRIGGER = "hsdemo"
TINY_CHECKPOINTS_KEY = layout.TINY_CHECKPOINTS
TINY_SEED = 0
TINY_SECONDS = 2.0  # the tiny job's songs are cut here: VAE encoding dominates on a CPU
AB_SEED = 42
AUDITION_APP = "audition"
# The stage names, in order: the main job's phases and the rows of the final table.
STAGES = JOB_PHASES["make"][1:]  # after "queued"

# The embedded default needs no network and no keys: Essentia + the offline captioner, and only
# fields a sidecar lacks are filled (a user's own caption or BPM is never replaced).
OFFLINE_LABELS = LabelOptions(
    scope="all",
    use_genius=False,
    caption=CaptionProviderChoice(provider="offline"),
    merge_policy="fill_missing",
    allow_empty=True,
)


# =============================================================================== configuration


@dataclass(frozen=True)
class Placement:
    """Where the heavy stages run: True = on Ray (Data's encoder actors, a Ray Train job), False =
    in this process."""

    preprocess: bool
    dit: bool
    lm: bool


def placement(ray_train: bool | None, one_machine: bool, gpus: float) -> Placement:
    """`ray_train` True or False puts everything on Ray or in this process. Unset, a Ray that is
    this machine with one GPU encodes and trains the DiT here, the LM on Ray Train beside it: a
    Ray Data actor or a Ray Train worker is a process to start and fill with imports before it
    works, seconds on the job's longest path (preprocess, then the DiT), while a second trainer
    in this process would share its interpreter with the DiT's steps; the LM, the shorter run,
    pays its worker's start off that path. On a cluster, several GPUs (Ray Data encodes on all of
    them) or CPUs only (each trainer wants cores of its own), everything runs on Ray."""
    if ray_train is not None:
        return Placement(ray_train, ray_train, ray_train)
    if one_machine and gpus == 1:
        return Placement(preprocess=False, dit=False, lm=True)
    return Placement(True, True, True)


@dataclass(frozen=True)
class Recipe:
    """What each stage is asked to do: the one place where the tiny and the real job differ."""

    preprocess: PreprocessOptions
    pipeline: RayPipelineConfig
    encoder_tasks_in_flight: int | None  # Ray Data batches queued per encoder actor; None: Ray's
    dit: TrainDitOptions  # variant_key and adapter_name are filled in per run
    dit_step_event_s: float  # min seconds between per-step metric events (the plot's points)
    lm: TrainLmOptions
    lm_engine: LmEngine
    use_gpu: bool | None  # Ray Train workers; None: when the cluster has GPUs
    max_failures: int  # Ray Train restarts after a worker failure
    device: str | None  # in-process training and the audition replicas; None: cuda if present
    torch_threads: int | None  # in-process training; None: `_trainer_threads` decides
    ab: dict[str, Any] = field(default_factory=dict)  # A/B request fields (duration, sampling)


def tiny_recipe(epochs: int | None = None) -> Recipe:
    """The embedded default. VAE encoding dominates on a CPU (1-2 s per second of audio for the
    tiny VAE, whose first block runs at 48 kHz), so songs are cut to `TINY_SECONDS`. The adapters
    start from scratch each run (no warm start) so every run's loss curve is comparable, and the
    sizes and learning rates are ones that make the loss fall visibly within a few epochs.
    Everything runs on the CPU, GPU or not, so the demo behaves the same on every machine."""
    from hotstep_ray.preprocess.ray_pipeline import RayPipelineConfig
    from hotstep_ray.training.lm_spec import LmEngine

    return Recipe(
        preprocess=PreprocessOptions(max_duration_s=TINY_SECONDS),
        # Two encoder actors, one per core of a 2-core box, with decode/write tasks beside them;
        # batches of 6 give each actor one of the 12 songs' two batches (4 left one idle).
        pipeline=RayPipelineConfig(
            min_actors=2,
            max_actors=2,
            num_gpus_per_actor=0,
            num_cpus_per_actor=0.75,
            decode_cpus=0.25,
            write_cpus=0.25,
            batch_size=6,
        ),
        # One batch per actor at a time: otherwise Ray Data queues the second batch behind the
        # first on whichever actor finished starting first, and the other actor idles.
        encoder_tasks_in_flight=1,
        dit=TrainDitOptions(
            adapter_type="lokr",
            lokr_dim=8,
            lokr_alpha=8,
            crop_frames=48,  # 1.9 s: all of each 2 s cut
            batch=4,
            grad_accum=1,
            epochs=epochs or 8,
            target_loss=0,
            milestone_step=0,
            checkpoint_segments=0,
            init_adapter="",
            checkpoint_every_s=0,  # every epoch: tiny adapters, a few KiB each
        ),
        dit_step_event_s=0.0,  # an event per step: the plot's points
        lm=TrainLmOptions(
            lm_size="0.6B",
            adapter_type="lora",
            rank=4,
            alpha=8,
            optimizer="adamw",
            learning_rate=1e-2,
            epochs=epochs or 4,
            grad_accum=1,
            target_loss=0,
            milestone_step=0,
            init_adapter="",
            checkpoint_every_s=0,
        ),
        lm_engine=LmEngine(device="cpu", log_every=1),
        use_gpu=False,
        max_failures=0,
        device="cpu",
        torch_threads=1,  # tiny models: a second thread only spins against Ray's processes
        # The tiny LM's logits are nearly flat over 64,000 codes: top-k 8 lets its ranking (and so
        # the adapter) decide which code is drawn.
        ab={"duration": 2.0, "top_k": 8},
    )


def real_recipe(lm_size: str, epochs: int | None = None) -> Recipe:
    """Real weights: the contract defaults for every stage, `epochs` aside."""
    from hotstep_ray.preprocess.ray_pipeline import RayPipelineConfig
    from hotstep_ray.training.lm_spec import LmEngine

    given = {"epochs": epochs} if epochs else {}
    return Recipe(
        preprocess=PreprocessOptions(),
        pipeline=RayPipelineConfig(),
        encoder_tasks_in_flight=None,
        # An adapter and its optimizer moments are a few hundred MB at most, written in seconds:
        # a checkpoint a minute bounds what a crash can lose.
        dit=TrainDitOptions(checkpoint_every_s=60, **given),
        dit_step_event_s=1.0,
        lm=TrainLmOptions(lm_size=lm_size, checkpoint_every_s=60, **given),  # type: ignore[arg-type]
        lm_engine=LmEngine(),
        use_gpu=None,
        max_failures=2,
        device=None,
        torch_threads=None,
        ab={"duration": 30.0},
    )


# =============================================================================== results


@dataclass(frozen=True)
class StageReport:
    """One row of the run's timeline. The GPU fields are None without `nvidia-smi`."""

    name: str
    seconds: float
    summary: str
    loss: str = ""  # "first → last" epoch loss, for the trainers
    artifact: str = ""
    start_s: float = 0.0  # seconds from the job's start
    loop_s: float | None = None  # trainers: seconds in their epochs (the first one compiles)
    first_epoch_s: float | None = None  # trainers: the first epoch (compile, graph capture)
    # trainers: seconds before the first epoch began (Ray Train's worker, imports, loading the
    # model and the cache, the adapter) and after the last one ended (final export, shutdown)
    setup_s: float | None = None
    finish_s: float | None = None
    gpu_busy: float | None = None  # share of 1 s samples in which the GPU ran a kernel
    gpu_mean_util: float | None = None  # percent
    gpu_peak_gib: float | None = None  # memory in use on the busiest GPU


@dataclass(frozen=True)
class TrainedAdapter:
    kind: str  # "dit" | "lm"
    job_id: str
    run_key: str
    url: str
    adapter_type: str
    base_model: str  # the DiT / LM folder it was trained on
    epoch_losses: list[float]
    steps: int  # optimizer steps run
    step_losses: list[tuple[int, float]]  # from the step events (every step, or rate-limited)
    saved_reason: str
    epoch_seconds: list[float] = field(default_factory=list)  # each epoch's loop time, from the log
    epoch_ends: list[float] = field(default_factory=list)  # unix s of each epoch's event
    resumed_epochs: int = 0  # epochs a continued run had done before this job continued it

    @property
    def adapter_id(self) -> str:
        """The audition catalogue's id: the run key under `adapters/`."""
        return self.run_key.removeprefix("adapters/")


@dataclass(frozen=True)
class AbReport:
    preview_id: str
    preview_url: str
    caption: str
    seed: int
    adapter_id: str
    codes_count: int
    base_sha1: str
    adapter_sha1: str
    adapterless_sha1: str  # a plain /lm call without adapter, same seed and caption

    @property
    def base_reproducible(self) -> bool:
        return self.base_sha1 == self.adapterless_sha1

    @property
    def adapter_differs(self) -> bool:
        return self.adapter_sha1 != self.base_sha1


@dataclass(frozen=True)
class MainJobResult:
    job_id: str
    label_job_id: str
    dataset: DatasetDetail
    dataset_json_url: str
    songs_url: str
    events_url: str
    result_url: str
    checkpoints: str
    tiny: bool
    stages: list[StageReport]
    preprocess: PreprocessResult | None = None
    dit: TrainedAdapter | None = None
    lm: TrainedAdapter | None = None
    ab: AbReport | None = None
    plot_url: str = ""
    seconds: float = 0.0
    startup_s: float | None = None  # from the process's start to the job's (imports, CLI)

    def to_json_dict(self) -> dict[str, Any]:
        """`jobs/<id>/result.json`: every artifact and number, the dataset by slug and id only."""
        out: dict[str, Any] = {
            "job_id": self.job_id,
            "label_job_id": self.label_job_id,
            "dataset": {"slug": self.dataset.slug, "id": self.dataset.id},
            "dataset_json_url": self.dataset_json_url,
            "songs_url": self.songs_url,
            "events_url": self.events_url,
            "result_url": self.result_url,
            "checkpoints": self.checkpoints,
            "tiny": self.tiny,
            "stages": [asdict(stage) for stage in self.stages],
            "preprocess": self.preprocess.model_dump(mode="json") if self.preprocess else None,
            "plot_url": self.plot_url,
            "seconds": round(self.seconds, 3),
            "startup_s": None if self.startup_s is None else round(self.startup_s, 3),
        }
        for name, run in (("dit", self.dit), ("lm", self.lm)):
            out[name] = None if run is None else {**asdict(run), "adapter_id": run.adapter_id}
        out["ab"] = None
        if self.ab is not None:
            checks = {
                "base_reproducible": self.ab.base_reproducible,
                "adapter_differs": self.ab.adapter_differs,
            }
            out["ab"] = {**asdict(self.ab), **checks}
        return out


# =============================================================================== the recipe


def run_main_job(config: MakeOptions, sinks: tuple[EventSink, ...] = ()) -> MainJobResult:
    """Run the main job with `config.data` as the storage root; `sinks` see every event."""
    started = time.perf_counter()
    startup_s = _process_age_s()
    storage = Storage(config.data)
    use_compile_cache(storage)  # before Ray starts: its workers inherit the cache's place
    reports: list[StageReport] = []
    dit_run = lm_run = None
    ab = None
    plot_url = ""
    with GpuSampler() as gpu, Job(storage, "build", sinks=sinks) as job:
        clock = _Clock(started, gpu)
        preload = _Preload()
        with _stage(job, reports, "dataset", clock) as row:
            songs, detail = dataset_stage(job, storage, config)
            row.note(f"{len(detail.samples)} songs, dataset {detail.slug!r}", songs.url)
            preload.join()  # counted here: what imports outlast of Ray's start is still waited
        ray = ensure_ray(config.ray_address)  # as the dataset stage started or joined it
        place = placement(config.ray_train, one_machine(), ray.cluster_resources().get("GPU", 0))
        job.summary.dataset_id = detail.id
        with _stage(job, reports, "label", clock) as row:
            label_report, detail = label_stage(job, storage, detail)
            row.note(_label_summary(label_report))
        with _stage(job, reports, "build", clock) as row:
            dataset_json_url = build_from_detail(storage, detail, BuildOptions())
            row.note(f"{len(detail.samples)} samples", dataset_json_url)
        with _stage(job, reports, "checkpoints", clock) as row:
            checkpoints, recipe, tiny = checkpoints_stage(job, storage, config)
            row.note("tiny tree (CPU)" if tiny else "real weights", str(checkpoints))
        with _stage(job, reports, "preprocess", clock) as row:
            pre = preprocess_stage(job, storage, detail, checkpoints, recipe, place.preprocess)
            counts = f"{pre.processed} encoded, {pre.cached} cached, {pre.failed} failed"
            row.note(counts, pre.tensor_dir)
        if not config.skip_train:
            runs = RunRecord(storage, detail.slug)

            def trainer(name: str, train: Callable[..., tuple[TrainedAdapter, str]], on_ray: bool):
                def stage() -> TrainedAdapter:
                    with _stage(job, reports, name, clock) as row:
                        run, how = train(
                            job, storage, detail, pre, checkpoints, recipe, config, runs, on_ray
                        )
                        where = how or ("Ray Train" if on_ray else "in process")
                        row.note(_train_summary(run, where), run.url, _loss_change(run))
                        row.epochs, row.epoch_ends = _epochs_run(run, how)
                    return run

                return stage

            # Neither trainer needs the other's adapter, so they run side by side: on Ray each in
            # worker processes of its own (on one GPU, each asks for the share of it its memory
            # takes), or one here and one on Ray; both in this process on threads of their own
            # when they train on a GPU, where a step is kernels queued to the device and the
            # interpreter mostly waits. On the CPU two threads would contend for the cores
            # torch's kernels use, so one after the other.
            side_by_side = place.dit or place.lm or _trains_on_gpu(recipe)
            stages = (
                trainer("train-dit", train_dit_stage, place.dit),
                trainer("train-lm", train_lm_stage, place.lm),
            )
            with contextlib.ExitStack() as serving:
                app = None
                if not config.skip_audition:
                    lm_dir = _lm_dir(checkpoints, recipe)
                    app = _AuditionApp(serving, job, checkpoints, storage.url, lm_dir, recipe)
                # The app's replicas load the base LM and the decoder (and capture their graphs)
                # while the adapters train; the A/B then only asks.
                early = app.start if app is not None and side_by_side else None
                if side_by_side:
                    _import_for_threads()
                dit_run, lm_run = _side_by_side(stages, side_by_side, meanwhile=early)
                if app is not None:
                    with _stage(job, reports, "audition", clock) as row:
                        ab = audition_stage(job, storage, detail, lm_run, recipe, app)
                        row.note(_ab_summary(ab), ab.preview_url)
                else:
                    _skip(job, reports, ("audition",), "--skip-audition", clock)
            with _stage(job, reports, "report", clock) as row:
                plot_url = report_stage(storage, job.id, dit_run, lm_run)
                row.note("loss per step of both runs", plot_url)
        else:
            names = ("train-dit", "train-lm", "audition", "report")
            _skip(job, reports, names, "--skip-train", clock)
        reports.sort(key=lambda report: STAGES.index(report.name))  # side-by-side: any end order
        result_key = layout.job_result(job.id)
        result = MainJobResult(
            job_id=job.id,
            label_job_id=label_report.job_id,
            dataset=detail,
            dataset_json_url=dataset_json_url,
            songs_url=songs.url,
            events_url=storage.url_of(layout.job_events(job.id)),
            result_url=storage.url_of(result_key),
            checkpoints=str(checkpoints),
            tiny=tiny,
            stages=reports,
            preprocess=pre,
            dit=dit_run,
            lm=lm_run,
            ab=ab,
            plot_url=plot_url,
            seconds=time.perf_counter() - started,
            startup_s=startup_s,
        )
        # Before the terminal status: whoever sees `done` finds the result (the studio serves it).
        storage.write_json(result_key, result.to_json_dict())
    return result


# =============================================================================== stages


# Options that say how often a run checkpoints: they do not change its adapter.
CADENCE_FIELDS = set(CheckpointCadence.model_fields)


class RunRecord:
    """`datasets/<slug>/make_runs.json`: which adapter run the main job last trained per trainer,
    with the fingerprint of everything that run depends on (its options, the tensor cache's
    `preprocess_meta.json` minus its time stamps, the checkpoints folder). A rerun whose
    fingerprint matches reuses a finished run and continues an unfinished one; anything changed
    starts a new run."""

    FILE = "make_runs.json"

    def __init__(self, storage: Storage, slug: str) -> None:
        self.storage, self.key = storage, f"{layout.dataset_dir(slug)}/{self.FILE}"
        self.entries: dict[str, Any] = (
            storage.read_json(self.key) if storage.exists(self.key) else {}
        )
        self._lock = threading.Lock()  # the two trainers record their runs from two threads
        self._metas: dict[str, dict[str, Any]] = {}

    def cache_meta(self, pre: PreprocessResult) -> dict[str, Any]:
        """The tensor cache's `preprocess_meta.json`, read once for both trainers."""
        if pre.tensor_dir not in self._metas:
            key = f"{self.storage.key_of(pre.tensor_dir)}/{META_FILE}"
            self._metas[pre.tensor_dir] = self.storage.read_json(key)
        return self._metas[pre.tensor_dir]

    def fingerprint(self, kind: str, options: Any, pre: PreprocessResult, checkpoints: Path) -> str:
        meta = self.cache_meta(pre)
        stamps = ("created_at", "updated_at")
        what = {
            "kind": kind,
            # how often a run checkpoints does not change its adapter
            "options": options.model_dump(mode="json", exclude=CADENCE_FIELDS),
            "cache": {k: v for k, v in meta.items() if k not in stamps},
            "checkpoints": str(checkpoints),
        }
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]

    def plan(self, kind: str, fingerprint: str, *, retrain: bool) -> _RunPlan:
        entry = self.entries.get(kind) or {}
        if retrain or entry.get("fingerprint") != fingerprint:
            return _RunPlan()
        done = entry.get("adapter")
        if done and self.storage.exists(done["run_key"]):
            points = [(int(step), float(loss)) for step, loss in done["step_losses"]]
            return _RunPlan(reuse=TrainedAdapter(**{**done, "step_losses": points}))
        return _RunPlan(run_key=str(entry.get("run_key") or ""))

    def start(self, kind: str, fingerprint: str, run_key: str) -> None:
        self._write(kind, {"fingerprint": fingerprint, "run_key": run_key, "adapter": None})

    def finish(self, kind: str, trained: TrainedAdapter) -> None:
        entry = self.entries.get(kind) or {}
        self._write(kind, {**entry, "run_key": trained.run_key, "adapter": asdict(trained)})

    def _write(self, kind: str, entry: dict[str, Any]) -> None:
        with self._lock:
            self.entries[kind] = entry
            self.storage.write_json(self.key, self.entries)


@dataclass(frozen=True)
class _RunPlan:
    reuse: TrainedAdapter | None = None  # a finished run nothing has changed for
    run_key: str = ""  # an unfinished run to continue (when it left a checkpoint)


def dataset_stage(job: Job, storage: Storage, config: MakeOptions) -> tuple[Storage, DatasetDetail]:
    """The dataset of the user's folder (or of the bundled songs, rendered once): created on the
    first run, loaded on later ones (one dataset per folder)."""
    if config.songs:
        songs = check_songs_folder(config.songs, storage)
        name, tag = config.name, config.tag
    else:
        songs = storage.child(EXAMPLE_SONGS_KEY)
        written = write_example_songs(songs)
        job.events.log(f"{len(written)} example songs in {songs.url}")
        name, tag = config.name or EXAMPLE_DATASET_NAME, config.tag or EXAMPLE_TRIGGER
    ray = ensure_ray(config.ray_address)
    job.events.log(f"Ray: {int(ray.cluster_resources().get('CPU', 0))} CPUs")

    def progress(done: int, total: int) -> None:
        job.events.progress(done, total, phase="probe")

    ray_map = RayMap(num_cpus=0.5, on_progress=progress)
    # One scan per run: the detail from create/load feeds the label step directly.
    slug = find_dataset_by_source(storage, songs.url)
    if slug is None:
        inp = CreateDatasetInput(name=name, source_dir=songs.url, custom_tag=tag)
        detail = create_dataset(storage, inp, map_fn=ray_map)
        job.events.log(f"created dataset {detail.slug!r}")
    else:
        detail = load_dataset(storage, slug, map_fn=ray_map)
        job.events.log(f"reusing dataset {slug!r}")
    for warning in detail.warnings:
        job.events.log(warning, level="warn")
    _check_readable(detail, songs.url)
    return songs, detail


def check_songs_folder(songs: str, storage: Storage) -> Storage:
    """The user's songs folder (`dataset.scan.check_songs_folder`'s rules), for `make`."""
    from hotstep_ray.dataset.scan import check_songs_folder as check

    return check(songs, storage, "pass --data somewhere outside it")


def _check_readable(detail: DatasetDetail, where: str) -> None:
    """At least one song must be decodable, or nothing downstream has work to do."""
    present = [s for s in detail.samples if not s.file_missing]
    if present and all(s.error or not s.duration for s in present):
        first = next((s for s in present if s.error), present[0])
        raise InputError(
            f"none of the {len(present)} audio files in {where} could be read "
            f"(e.g. {first.rel_path}: {first.error or 'no duration'}); "
            "convert them to .wav or .flac and run again"
        )


def label_stage(
    job: Job, storage: Storage, detail: DatasetDetail
) -> tuple[LabelReport, DatasetDetail]:
    """Offline labels (its own `label` job); the analysis cache makes a rerun cheap. Without
    Essentia (the offline labels' ears) the songs keep what their sidecars say, with a warning:
    the flow goes on rather than stopping a user whose songs are already described."""
    from hotstep_ray.labeling.providers import ProviderUnavailableError

    try:
        report = label_dataset_on_ray(
            storage, detail.slug, OFFLINE_LABELS, events=child_sink(job.events)
        )
    except ProviderUnavailableError as exc:
        job.events.log(f"labels skipped ({exc}): the sidecars' own fields are used", "warn")
        report = LabelReport(total=len(detail.samples), skipped=str(exc))
    # The sidecars may have changed: rescan (header reads only) so the build sees them.
    return report, load_dataset(storage, detail.slug, map_fn=RayMap(num_cpus=0.5))


def checkpoints_stage(job: Job, storage: Storage, config: MakeOptions) -> tuple[Path, Recipe, bool]:
    """Real weights from `--checkpoints` (checked for every stage this job runs), else the tiny
    tree. Returns (folder, recipe, tiny)."""
    from hotstep_ray.models.discovery import discover, missing_for_stages

    if config.checkpoints:
        folder = Path(config.checkpoints).expanduser().resolve()
        components = discover(folder)
        wanted = ("preprocess", "train-dit", "train-lm", "audition")
        missing = {
            stage: [kind for kind in kinds if "optional" not in kind]
            for stage, kinds in missing_for_stages(components).items()
            if stage in wanted
        }
        if any(missing.values()):
            lacking = "; ".join(f"{s}: {', '.join(k)}" for s, k in missing.items() if k)
            raise InputError(
                f"{folder} lacks what the main job needs ({lacking}); "
                f"see `hotstep-ray doctor --checkpoints {folder}`"
            )
        from hotstep_ray.training.lm_spec import present_lm_size

        # the contract's LM, else the largest one there (train-lm's rule)
        size = present_lm_size(folder, TrainLmOptions().lm_size)
        job.events.log(f"real weights in {folder}; LM {size}")
        return folder, real_recipe(size, config.epochs), False
    folder = ensure_tiny_tree(storage)
    job.events.log(f"tiny checkpoints in {folder}")
    return folder, tiny_recipe(config.epochs), True


def ensure_tiny_tree(storage: Storage) -> Path:
    """The tiny checkpoint tree, written once per machine. The stages load models from local
    paths, so with an `s3://` root it lives in the temp folder instead, and on a multi-node
    cluster every node alive now gets its own copy at the same path (same seed, same bytes)."""
    if storage.is_local:
        folder = storage.local_path(TINY_CHECKPOINTS_KEY)
    else:
        folder = Path(tempfile.gettempdir()) / "hotstep-ray" / TINY_CHECKPOINTS_KEY
    write_tiny_tree(str(folder))
    _on_other_nodes(write_tiny_tree, str(folder))
    return folder


def write_tiny_tree(path: str) -> str:
    """Write the tiny tree at `path` unless it is there. Written beside its final name and renamed
    into place, so an interrupted write never leaves a half tree that later runs would trust."""
    from hotstep_ray.models.tiny_tree import make_tiny_tree

    folder = Path(path)
    if folder.is_dir():
        return path
    folder.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=".tiny-", dir=folder.parent))
    try:
        # diffusers' weight_norm deprecation warning is not the user's concern
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            make_tiny_tree(partial, seed=TINY_SEED)
        os.replace(partial, folder)
    except OSError:
        if not folder.is_dir():  # a concurrent run renaming first is fine; anything else is not
            raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return path


def _on_other_nodes(fn: Callable[..., Any], *args: Any) -> None:
    """Run `fn(*args)` once on every other alive node (nothing to do on a one-node Ray)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    others = [n["NodeID"] for n in ray.nodes() if n.get("Alive") and n["NodeID"] != here]
    if not others:
        return
    task = ray.remote(num_cpus=0)(fn)
    pinned = [NodeAffinitySchedulingStrategy(node, soft=False) for node in others]
    ray.get([task.options(scheduling_strategy=where).remote(*args) for where in pinned])


def preprocess_stage(
    job: Job,
    storage: Storage,
    detail: DatasetDetail,
    checkpoints: Path,
    recipe: Recipe,
    on_ray: bool = True,
) -> PreprocessResult:
    """The tensor cache, as its own `preprocess` job, on Ray Data or (`on_ray` False) in this
    process, where the encoder's models load without a worker process to start; cached
    samples are skipped."""
    from hotstep_ray.preprocess.run import preprocess_dataset

    with _sub_job(job, "preprocess", follow=False) as sub, contextlib.ExitStack() as ray_data:
        if on_ray:
            # first: importing ray.data (re)configures its loggers, which `_quiet` then adjusts
            ray_data.enter_context(
                _data_context(max_tasks_in_flight_per_actor=recipe.encoder_tasks_in_flight)
            )
            ray_data.enter_context(_quiet("ray.data"))
        result = preprocess_dataset(
            storage,
            detail.slug,
            recipe.preprocess,
            checkpoints,
            "ray" if on_ray else "local",
            sub.events,
            device=recipe.device,  # the in-process encoder's; Ray Data's actors pick their own
            ray_config=recipe.pipeline,
        )
    if not on_ray:
        import torch

        if torch.cuda.is_available():  # the encoders' blocks, for the trainers' other processes
            torch.cuda.empty_cache()
    return result


def train_dit_stage(
    job: Job,
    storage: Storage,
    detail: DatasetDetail,
    pre: PreprocessResult,
    checkpoints: Path,
    recipe: Recipe,
    config: MakeOptions,
    runs: RunRecord,
    on_ray: bool,
) -> tuple[TrainedAdapter, str]:
    """The DiT adapter run on the tensor cache, as its own `train-dit` job: the recorded run when
    nothing it depends on changed, the interrupted one continued from its checkpoint, or a new
    one. Returns the run and how it was come by ("" = trained here)."""
    from hotstep_ray.training import dit, dit_state

    options = _with(recipe.dit, variant_key=pre.variant_key, adapter_name=detail.slug)
    fingerprint = runs.fingerprint("dit", options, pre, checkpoints)
    plan = runs.plan("dit", fingerprint, retrain=config.retrain)
    if plan.reuse is not None:
        job.events.log(f"DiT adapter unchanged: reusing {plan.reuse.url}")
        return plan.reuse, "unchanged, reused"
    folder = dit.resolve_dit_folder(runs.cache_meta(pre), pre.variant_key, None, str(checkpoints))
    base = layout.dit_adapter_base(folder.name)
    # An interrupted run continues from its newest checkpoint; one that left none starts over in a
    # new folder (the old one may hold a best-so-far export that would refuse a fresh run).
    saved = dit_state.newest_checkpoint(storage, plan.run_key) if plan.run_key else None
    resume = saved.key if saved else None
    run_key = plan.run_key if resume else layout.new_run_dir(storage, base, detail.slug)
    if resume:
        job.events.log(f"continuing the interrupted DiT run {storage.url_of(run_key)}")
    runs.start("dit", fingerprint, run_key)
    with _sub_job(job, "train-dit", follow=on_ray) as sub:
        settings = dit.DitSettings(
            checkpoints_dir=str(checkpoints),
            artist=detail.slug,
            step_event_interval_s=recipe.dit_step_event_s,
            device=recipe.device,
            run_key=run_key,
            job_id=sub.id,
            resume=resume,
        )
        sub.phase("train")
        if on_ray:
            from hotstep_ray.training.ray_dit import train_dit_on_ray

            ray_result = train_dit_on_ray(
                options,
                storage,
                detail.slug,
                settings,
                num_workers=1,
                use_gpu=recipe.use_gpu,
                max_failures=recipe.max_failures,
                job_id=sub.id,  # rank 0 appends its events to the sub-job's events.jsonl
            )
            run_key, train_log = ray_result.run_key, ray_result.log
        else:
            with _torch_threads(_trainer_threads(recipe)):
                run = dit.setup(options, storage, detail.slug, settings, events=sub.events)
                outcome = dit.train(run)
            run_key, train_log = outcome.run_key, outcome.log
    base_model = Path(str(train_log.get("config", {}).get("dit_path", ""))).name
    trained = _trained("dit", sub.id, storage, run_key, train_log, options.adapter_type, base_model)
    if saved:
        trained = dataclasses.replace(trained, resumed_epochs=saved.epoch)
    runs.finish("dit", trained)
    return trained, "continued" if resume else ""


def train_lm_stage(
    job: Job,
    storage: Storage,
    detail: DatasetDetail,
    pre: PreprocessResult,
    checkpoints: Path,
    recipe: Recipe,
    config: MakeOptions,
    runs: RunRecord,
    on_ray: bool,
) -> tuple[TrainedAdapter, str]:
    """The LM adapter run on the cache's 5 Hz codes, as its own `train-lm` job (reused, continued
    or new, as the DiT's). The trigger is each song's tag as preprocessed (the dataset's
    `custom_tag`)."""
    from hotstep_ray.training import lm, lm_save, lm_spec
    from hotstep_ray.training.checkpoint import MANIFEST

    # Only the recipe's explicitly set fields (plus these two) count as given: with a warm start
    # (`init_adapter`), the rest is adopted from the earlier run.
    options = _with(recipe.lm, adapter_name=detail.slug, variant_key=pre.variant_key)
    fingerprint = runs.fingerprint("lm", options, pre, checkpoints)
    plan = runs.plan("lm", fingerprint, retrain=config.retrain)
    if plan.reuse is not None:
        job.events.log(f"LM adapter unchanged: reusing {plan.reuse.url}")
        return plan.reuse, "unchanged, reused"
    lm_dir = lm_spec.resolve_lm_dir(checkpoints, options.lm_size, options.lm_model)
    manifest = f"{lm_save.checkpoint_key(plan.run_key)}/{MANIFEST}" if plan.run_key else ""
    resume = bool(manifest) and storage.exists(manifest)
    resumed_epochs = int(storage.read_json(manifest).get("epoch") or 0) if resume else 0
    run_key = plan.run_key if resume else ""
    if resume:
        job.events.log(f"continuing the interrupted LM run {storage.url_of(run_key)}")
    with _sub_job(job, "train-lm", follow=on_ray) as sub:
        spec = lm_spec.LmTrainSpec(
            options=options,
            lm_dir=str(lm_dir),
            codes_key=layout.find_lm_codes(storage, detail.slug, pre.variant_key),
            artist=detail.slug,
            engine=recipe.lm_engine,
            events_key=layout.job_events(sub.id) if on_ray else "",
            job_id=sub.id,
            run_key=run_key,
        )
        if not spec.run_key:  # a new run: its folder is picked here so the record knows it
            base = layout.lm_adapter_base(options.lm_size)
            spec = spec.model_copy(
                update={"run_key": layout.new_run_dir(storage, base, detail.slug)}
            )
        runs.start("lm", fingerprint, spec.run_key)
        sub.phase("train")
        if on_ray:
            from hotstep_ray.training.ray_lm import run_lm_on_ray

            result = run_lm_on_ray(
                spec,
                storage,
                num_workers=1,
                use_gpu=recipe.use_gpu,
                max_failures=recipe.max_failures,
                resume=resume,
            )
        else:
            with _torch_threads(_trainer_threads(recipe)):
                result = lm.run_lm_training(spec, storage, events=sub.events, resume=resume)
    trained = _trained(
        "lm", sub.id, storage, result.run_key, result.log, options.adapter_type, lm_dir.name
    )
    if resume:
        trained = dataclasses.replace(trained, resumed_epochs=resumed_epochs)
    runs.finish("lm", trained)
    return trained, "continued" if resume else ""


def audition_stage(
    job: Job,
    storage: Storage,
    detail: DatasetDetail,
    lm_run: TrainedAdapter,
    recipe: Recipe,
    app: _AuditionApp,
) -> AbReport:
    """A/B the base LM against the new adapter (same seed) on the audition app (started now
    unless it already was), and check that the base side equals a plain adapterless /lm call."""
    from hotstep_ray.audition.ab import PreviewStore  # torch-side: not at start-up

    sample = next((s for s in detail.samples if s.caption and s.bpm), None)
    metas: dict[str, Any] = {"timesignature": "4"}  # pinned metas: the LM plans no CoT
    caption = "a short instrumental"
    if sample is not None:
        caption = sample.caption
        beats = (sample.signature or "4").split("/")[0].strip()
        metas.update(bpm=sample.bpm, timesignature=beats if beats in ("2", "3", "4", "6") else "4")
        if sample.key:
            metas["keyscale"] = sample.key
    ab_body = {
        "caption": caption,
        "seed": AB_SEED,
        "lm_adapter": lm_run.adapter_id,
        **metas,
        **recipe.ab,
    }
    if lm_run.base_model != app.lm_folder:  # both from resolve_lm_dir: a bug if they differ
        raise RuntimeError(f"the LM trained on {lm_run.base_model}, the app serves {app.lm_folder}")
    url, token = app.open()
    ab = _post(url, "/audition", ab_body, token)
    # as the studio's audition job labels its previews: `GET /previews?datasetId=` finds it
    PreviewStore(storage).label(
        ab["previewId"], datasetId=detail.id, slug=detail.slug, engine="lm", kind="ab"
    )
    base, tuned = ab["sides"]
    for side in (base, tuned):
        if not side["ok"]:
            raise RuntimeError(f"A/B {side['slot']} side failed: {side['error']}")
    # The same request without any adapter: the base side must be exactly this.
    plain_body = {k: v for k, v in ab_body.items() if k not in ("seed", "lm_adapter")}
    plain = _post(url, "/lm", {**plain_body, "caption": ab["caption"], "lm_seed": AB_SEED}, token)
    report = AbReport(
        preview_id=ab["previewId"],
        preview_url=storage.url_of(layout.preview_dir(ab["previewId"])),
        caption=ab["caption"],
        seed=ab["seed"],
        adapter_id=lm_run.adapter_id,
        codes_count=base["codesCount"],
        base_sha1=base["codesSha1"],
        adapter_sha1=tuned["codesSha1"],
        adapterless_sha1=plain["codesSha1"],
    )
    if not report.base_reproducible:
        job.events.log(
            f"A/B base codes {report.base_sha1[:10]} differ from an adapterless run with the same "
            f"seed ({report.adapterless_sha1[:10]}): the base side is not reproducible",
            "error",
        )
    return report


def report_stage(storage: Storage, job_id: str, *runs: TrainedAdapter) -> str:
    """`jobs/<id>/loss.png`: loss per step of each run (per epoch where no step events exist)."""
    series = []
    for run in runs:
        points = run.step_losses or [(i + 1, v) for i, v in enumerate(run.epoch_losses)]
        title = f"{run.kind} {run.adapter_type} loss, {len(run.epoch_losses)} epochs"
        series.append(Series(title, points))
    key = layout.job_loss_plot(job_id)
    storage.write_bytes(key, loss_plot(series))
    return storage.url_of(key)


# =============================================================================== helpers


@dataclass(frozen=True)
class _Clock:
    """The job's timeline: its zero (perf_counter seconds) and the GPU sampler beside it."""

    t0: float
    gpu: GpuSampler


@dataclass
class _Row:
    summary: str = ""
    artifact: str = ""
    loss: str = ""
    epochs: list[float] = field(default_factory=list)  # a trainer's epoch loop seconds
    epoch_ends: list[float] = field(default_factory=list)  # unix s each of those epochs ended

    def note(self, summary: str, artifact: str = "", loss: str = "") -> None:
        self.summary, self.artifact, self.loss = summary, artifact, loss


@contextlib.contextmanager
def _stage(job: Job, reports: list[StageReport], name: str, clock: _Clock) -> Iterator[_Row]:
    """One stage: its phase, its time, one row for the final table and one log line. The phase
    event carries `stage` (an extra key readers may ignore), so a display can tell the main job's
    stages from the phases of the sub-jobs folded into the same stream."""
    summary = job.summary
    summary.done = summary.total = summary.failed = 0  # counters are per stage
    job.events.emit(ProgressEvent(done=0, total=0, phase=name, stage=name))
    row = _Row()
    started, wall_started = time.perf_counter(), time.time()
    yield row
    ended, wall_ended = time.perf_counter(), time.time()
    use = clock.gpu.use(started, ended)
    setup_s = finish_s = None
    if row.epochs and len(row.epoch_ends) == len(row.epochs):
        setup_s = max(0.0, row.epoch_ends[0] - row.epochs[0] - wall_started)
        finish_s = max(0.0, wall_ended - row.epoch_ends[-1])
    report = StageReport(
        name,
        ended - started,
        row.summary,
        row.loss,
        row.artifact,
        start_s=started - clock.t0,
        loop_s=sum(row.epochs) if row.epochs else None,
        first_epoch_s=row.epochs[0] if row.epochs else None,
        setup_s=setup_s,
        finish_s=finish_s,
        gpu_busy=None if use is None else round(use.busy, 3),
        gpu_mean_util=None if use is None else round(use.mean_util, 1),
        gpu_peak_gib=None if use is None else round(use.peak_mib / 1024, 2),
    )
    reports.append(report)
    busy = "" if use is None else f", GPU busy {use.busy:.0%}"
    job.events.log(f"{name}: {row.summary} ({report.seconds:.1f} s{busy})")


def _side_by_side(
    stages: tuple[Callable[[], Any], ...],
    concurrent: bool,
    meanwhile: Callable[[], None] | None = None,
) -> list[Any]:
    """Each stage's result, in order; with `concurrent`, the stages run on threads of their own
    while `meanwhile` (which must not raise) runs on this one (Serve's calls stay on the driver's
    main thread). Every stage runs to its end even when another fails (a finished adapter run is
    recorded and a rerun reuses it); then the first failure, in stage order, is raised."""
    if not concurrent:
        return [stage() for stage in stages]
    with ThreadPoolExecutor(max_workers=len(stages), thread_name_prefix="stage") as pool:
        futures = [pool.submit(stage) for stage in stages]
        if meanwhile is not None:
            meanwhile()
        wait(futures)
    return [future.result() for future in futures]


def _trains_on_gpu(recipe: Recipe) -> bool:
    """Whether the in-process trainers run on a GPU (`recipe.device`; None: CUDA if present)."""
    if recipe.device is not None:
        return recipe.device.startswith("cuda")
    import torch

    return torch.cuda.is_available()


def _epochs_run(run: TrainedAdapter, how: str) -> tuple[list[float], list[float]]:
    """The loop seconds of the epochs this job ran, and when each ended (none for a reused run,
    the continued part of an interrupted one)."""
    if how == "unchanged, reused":
        return [], []
    return run.epoch_seconds[run.resumed_epochs :], run.epoch_ends


def _process_age_s() -> float | None:
    """Seconds since this process started (psutil comes with Ray), None where unknown."""
    try:
        import psutil

        return time.time() - psutil.Process().create_time()
    except (ImportError, OSError):
        return None


def _skip(
    job: Job, reports: list[StageReport], names: tuple[str, ...], flag: str, clock: _Clock
) -> None:
    at = time.perf_counter() - clock.t0
    for name in names:
        reports.append(StageReport(name, 0.0, f"skipped ({flag})", start_s=at))
    job.events.log(f"skipped {', '.join(names)} ({flag})")


def _with(options: Any, **fields: Any) -> Any:
    """A copy of a contract with `fields` set, keeping which fields were given explicitly."""
    return type(options)(**{**options.model_dump(exclude_unset=True), **fields})


@contextlib.contextmanager
def _sub_job(main: Job, kind: JobKind, *, follow: bool) -> Iterator[Job]:
    """A stage's own job record, its events folded into `main` (minus its job/status events).
    In process the sub-job forwards as it emits. With `follow`, a Ray Train worker appends to the
    sub-job's events.jsonl from another process, so that file is followed instead (everything,
    the driver's own events included, then reaches `main` once, in file order)."""
    # the trainers run side by side: their lines say whose they are
    forward = child_sink(main.events, source=kind if kind in ("train-dit", "train-lm") else "")
    dataset_id = main.summary.dataset_id
    if not follow:
        with Job(main.storage, kind, dataset_id=dataset_id, sinks=(forward,)) as sub:
            yield sub
        return
    sub = Job(main.storage, kind, dataset_id=dataset_id)
    every_s = 0.5 if main.storage.is_local else 2.0  # an object store reads the whole file
    with FollowJsonl(main.storage, layout.job_events(sub.id), forward, every_s), sub:
        yield sub


@contextlib.contextmanager
def _quiet(logger: str, level: int = logging.ERROR) -> Iterator[None]:
    """Raise a library logger's level for a block: Ray Data and Serve log every execution plan and
    deployment at INFO (and a progress-bar notice at WARNING) into the job's terminal output."""
    target = logging.getLogger(logger)
    before = target.level
    target.setLevel(level)
    try:
        yield
    finally:
        target.setLevel(before)


@contextlib.contextmanager
def _data_context(**settings: Any) -> Iterator[None]:
    """Set Ray Data's driver-wide `DataContext` fields for a block (None values are left alone)."""
    import ray.data

    context = ray.data.DataContext.get_current()
    given = {name: value for name, value in settings.items() if value is not None}
    before = {name: getattr(context, name) for name in given}
    for name, value in given.items():
        setattr(context, name, value)
    try:
        yield
    finally:
        for name, value in before.items():
            setattr(context, name, value)


def _trainer_threads(recipe: Recipe) -> int | None:
    """torch's intra-op threads for an in-process trainer: the recipe's; else one on a GPU, where
    a step's host side only queues kernels and a pool of a thread per core spins against the
    other processes' threads (the LM's Ray Train worker, the audition replicas; Ray gives a
    one-CPU worker one thread too); torch's default on the CPU."""
    if recipe.torch_threads is not None:
        return recipe.torch_threads
    return 1 if _trains_on_gpu(recipe) else None


@contextlib.contextmanager
def _torch_threads(count: int | None) -> Iterator[None]:
    import torch

    before = torch.get_num_threads()
    if count:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _trained(
    kind: str,
    job_id: str,
    storage: Storage,
    run_key: str,
    train_log: dict[str, Any],
    adapter_type: str,
    base_model: str,
) -> TrainedAdapter:
    """What a trainer left behind: per-epoch losses from its log, per-step ones from its events.
    The DiT log counts its steps; the LM's are its planned steps per epoch times epochs run."""
    metrics = [e for e in read_job_events(storage, job_id) if isinstance(e, MetricEvent)]
    points = [
        (int(e.step), float(e.loss))
        for e in metrics
        if e.metric == "step" and e.step is not None and e.loss is not None
    ]
    epoch_losses = [float(row["loss"]) for row in train_log.get("epochs", [])]
    # this job's epoch events (a continued run's earlier epochs were another job's)
    ends = [e.ts / 1000 for e in metrics if e.metric == "epoch"]
    data = [e.model_extra or {} for e in metrics if e.metric == "data"]
    per_epoch = int(data[-1].get("steps_per_epoch", 0)) if data else 0
    return TrainedAdapter(
        kind=kind,
        job_id=job_id,
        run_key=run_key,
        url=storage.url_of(run_key),
        adapter_type=adapter_type,
        base_model=base_model,
        epoch_losses=epoch_losses,
        steps=int(train_log.get("steps") or per_epoch * len(epoch_losses)),
        step_losses=points,
        saved_reason=str(train_log.get("saved_reason", "")),
        epoch_seconds=[float(row.get("ms") or 0) / 1000 for row in train_log.get("epochs", [])],
        epoch_ends=ends,
    )


def _label_summary(report: LabelReport) -> str:
    if report.skipped == "nothing-to-label":
        return "nothing to label"
    if report.skipped:
        return f"skipped: {report.skipped}"
    cached = report.total - report.analysed
    return f"{report.labeled} labeled, {report.failed} failed, {cached} from the analysis cache"


def _train_summary(run: TrainedAdapter, where: str) -> str:
    epochs = _plural(len(run.epoch_losses), "epoch")
    return f"{run.adapter_type}, {epochs}, {_plural(run.steps, 'step')} ({where})"


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _loss_change(run: TrainedAdapter) -> str:
    losses = [v for v in run.epoch_losses if math.isfinite(v)]
    return f"{losses[0]:.4g} → {losses[-1]:.4g}" if losses else "-"


def _ab_summary(ab: AbReport) -> str:
    same = "=" if ab.base_reproducible else "≠"
    differs = "differs" if ab.adapter_differs else "same as base"
    return (
        f"{ab.codes_count} codes, seed {ab.seed}: base {ab.base_sha1[:8]} {same} adapterless, "
        f"adapter {ab.adapter_sha1[:8]} ({differs})"
    )


# -- the audition app -----------------------------------------------------------------------------
# GB of GPU memory an audition replica holds beside the trainers (decimal GB, the trainers'
# unit): the planner about twice its LM's weights (KV cache and captured graphs: peak reserved
# in rows `planner-30s`/`planner-240s`), the decoder its 240 s decode's peak (`decode-fast`).
PLANNER_WEIGHTS_FACTOR = 2.0
DECODER_GB = 4.0


# The modules the trainer stages and the audition app's start import on their threads.
THREAD_IMPORTS = (
    "ray.serve",
    "ray.train.torch",
    "hotstep_ray.training.dit",
    "hotstep_ray.training.dit_state",
    "hotstep_ray.training.ray_dit",
    "hotstep_ray.training.lm",
    "hotstep_ray.training.lm_save",
    "hotstep_ray.training.lm_spec",
    "hotstep_ray.training.ray_lm",
    "hotstep_ray.audition.serve_app",
)


# The torch-side modules of the stages after the dataset's (preprocessing, the checkpoints check,
# the trainers' drivers): seconds of imports (torch, transformers, peft, diffusers) that the
# dataset stage does not need, so a thread of their own imports them while that stage waits on
# Ray's start. None of them imports Ray, and nothing else imports them until the thread is joined:
# two threads importing one package together can see it half made (`_import_for_threads`).
PRELOAD = (
    "hotstep_ray.preprocess.ray_pipeline",
    "hotstep_ray.preprocess.finalize",
    *(name for name in THREAD_IMPORTS if name.startswith("hotstep_ray.training.")),
)


class _Preload:
    """`PRELOAD` imported on a daemon thread; `join` before the first stage that needs them."""

    def __init__(self) -> None:
        self.thread = threading.Thread(target=self._run, name="preload", daemon=True)
        self.thread.start()

    @staticmethod
    def _run() -> None:
        import importlib

        for name in PRELOAD:
            try:
                importlib.import_module(name)
            except Exception:  # the stage that needs it imports it again and says why
                return

    def join(self) -> None:
        self.thread.join()


def _import_for_threads() -> None:
    """Import on this thread what the trainer threads and the audition app would import for the
    first time at once: a package imported from two threads together can be seen half made by
    one of them (diffusers' lazy modules then fail with "partially initialized module")."""
    import importlib

    for name in THREAD_IMPORTS:
        importlib.import_module(name)


def _lm_dir(checkpoints: Path, recipe: Recipe) -> Path:
    """The LM folder the LM stage trains on (and the audition app must serve)."""
    from hotstep_ray.training import lm_spec

    return lm_spec.resolve_lm_dir(checkpoints, recipe.lm.lm_size, recipe.lm.lm_model)


class _AuditionApp:
    """The main job's audition app on 127.0.0.1: started by `start` (beside the trainers, on
    Ray) or by the first `open`, stopped with `stack`. A start that fails is kept and raised
    by `open`, so it never cuts the trainers short."""

    def __init__(
        self,
        stack: contextlib.ExitStack,
        job: Job,
        checkpoints: Path,
        data: str,
        lm_dir: Path,
        recipe: Recipe,
    ) -> None:
        self.stack, self.job, self.checkpoints, self.data = stack, job, checkpoints, data
        self.lm_dir, self.lm_folder, self.device = lm_dir, lm_dir.name, recipe.device
        self.address: tuple[str, str] | None = None
        self.error: BaseException | None = None

    def start(self) -> None:
        started = time.perf_counter()
        try:
            self.open()
        except Exception as exc:  # raised again by the audition stage's `open`
            self.error = exc
            return
        self.job.events.log(f"audition app up in {time.perf_counter() - started:.1f} s")

    def open(self) -> tuple[str, str]:
        if self.error is not None:
            raise self.error
        if self.address is None:
            app = _audition_app(
                self.checkpoints, self.data, self.lm_folder, self.device, self.lm_dir
            )
            self.address = self.stack.enter_context(app)
            self.job.events.log(f"audition app on {self.address[0]} (bearer token: this run only)")
        return self.address


def _replica_shares(lm_dir: Path) -> dict[str, float]:
    """`lm_gpus` / `decoder_gpus` of the app's replicas: the share of the smallest card their
    memory takes where the nodes declare `VRAM_GB` (so they fit beside the trainers' shares), at
    most the app's defaults; the defaults where no node declares it."""
    import ray

    from hotstep_ray.distributed.gpu_share import smallest_card_gb

    per_card = smallest_card_gb(ray.nodes())
    if not per_card:
        return {}
    weights_gb = sum(path.stat().st_size for path in lm_dir.glob("*.safetensors")) / 1e9
    needs = {"lm_gpus": PLANNER_WEIGHTS_FACTOR * weights_gb, "decoder_gpus": DECODER_GB}
    caps = {"lm_gpus": AUDITION_LM_GPUS, "decoder_gpus": AUDITION_DECODER_GPUS}
    return {
        name: min(caps[name], math.ceil(100 * gb / per_card) / 100) for name, gb in needs.items()
    }


def _serve_running() -> bool:
    import ray

    try:
        ray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")
    except ValueError:
        return False
    return True


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def _audition_app(
    checkpoints: Path, data: str, lm_folder: str, device: str | None, lm_dir: Path
) -> Iterator[tuple[str, str]]:
    """(base URL, bearer token) of the audition app on a free loopback port; Serve stops after.
    A fresh token per run: the app is never open, even on 127.0.0.1."""
    from ray import serve

    if _serve_running():
        raise InputError(
            "Ray Serve is already running on this cluster; the main job starts its own audition "
            "app (pass --skip-audition, or stop Serve with `serve shutdown`)"
        )
    from hotstep_ray.audition import serve_app as module

    token = secrets.token_urlsafe(24)
    app_config = module.AuditionAppConfig(
        checkpoints=str(checkpoints),
        data=data,
        device=device,
        lm=lm_folder,
        enable_dit=False,  # the A/B is the LM's; one replica less to start
        replica_cpus=0,  # replicas never wait for CPUs held by the Ray Train actors
        token=token,
        **_replica_shares(lm_dir),
    )
    port = _free_port()
    with _quiet("ray.serve", logging.WARNING):
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": port})
            serve.run(module.build_app(app_config), name=AUDITION_APP, route_prefix="/")
            yield f"http://127.0.0.1:{port}", token
        finally:
            serve.shutdown()


def _post(base_url: str, path: str, body: dict[str, Any], token: str) -> dict[str, Any]:
    request = urllib.request.Request(
        base_url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:500]
        raise RuntimeError(f"audition {path}: HTTP {exc.code}: {detail}") from exc
