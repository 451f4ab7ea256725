"""`POST /make`: a folder of songs → labeled dataset → tensors → DiT and LM adapters → an A/B, as
one studio job. It runs `main_job.run_main_job`, what `hotstep-ray make SONGS_DIR` runs, inside the
job's runner actor; the main job's events (its stage phases, the label/preprocess/training
sub-jobs folded into it) pass into the studio job's stream, and its result (the stage timeline,
both adapters, the A/B preview id) becomes the studio job's `result.json`.

The route checks the request before anything starts: the songs folder must lie in the allowed
roots (403) and be a folder holding audio, outside the storage root (400); the dataset is
registered there and then (or found, one dataset per folder), so the job has a dataset from its
first frame and the dataset's songs can be listed while it runs. The main job reuses that dataset
by its folder, as a rerun of the CLI does.

main_job is reached through the stage registry's `module:function` strings only: it is a package
of the studio's own layer (tests/test_layers.py forbids a sideways import), and importing it loads
torch and Ray into the server process (the registry reads its source instead).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import Field

from hotstep_ray.core.contracts import CreateDatasetInput, MakeOptions, Options
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage
from hotstep_ray.dataset import scan, store
from hotstep_ray.studio import stages
from hotstep_ray.studio.context import Studio
from hotstep_ray.studio.errors import ConflictError

log = logging.getLogger(__name__)

MAKE_KIND = "make"


class MakeRequest(Options):
    """The body of `POST /make`. The switches default to what `hotstep-ray make` does without
    flags: train both adapters on Ray Train, then the A/B."""

    songs_dir: str = Field(min_length=1, max_length=4096)
    name: str = Field(default="", max_length=200)  # "" = the folder's name
    tag: str = Field(default="", max_length=200)  # trigger word; "" = none
    train: bool = True  # False: stop after preprocessing (`--skip-train`)
    train_on_ray: bool = True  # False: train in the runner's process (`--no-ray-train`)
    audition: bool = True  # False: no Serve app, no A/B (`--skip-audition`)
    epochs: int | None = Field(default=None, ge=1, le=100_000)  # None: the recipe's
    retrain: bool = False  # new adapter runs even when nothing they depend on changed


class MakeJobOptions(MakeRequest):
    """What the runner gets: the request with its folder checked and the checkpoints the server
    chose. Never read from a request (MakeRequest refuses `checkpoints`): a token holder cannot
    make the server load models from a path of their choosing."""

    checkpoints: str = ""  # "" = the tiny tree under <data>/checkpoints/tiny, as the CLI does


def check_songs_folder(studio: Studio, raw: str) -> Storage:
    """The songs folder a request names: inside the allowed roots (PathNotAllowedError, 403),
    then the CLI's rules (`dataset.scan.check_songs_folder`; InputError, answered 400)."""
    return scan.check_songs_folder(
        studio.guard.check(raw, "songsDir"),
        studio.storage,
        "pick a folder that does not hold the studio's data",
    )


def checkpoints_for(studio: Studio) -> str:
    """The checkpoints the main job loads: the configured folder; else the default folder
    (`<data>/checkpoints`) when it holds models of its own (the main job then says what is
    missing, rather than training the tiny tree in their place); else "" = the tiny tree."""
    if studio.config.checkpoints:
        return studio.config.checkpoints
    folder = studio.checkpoints_dir
    if not folder or not Path(folder).is_dir():
        return ""
    from hotstep_ray.models.discovery import discover

    return folder if any(info.usable for info in discover(folder)) else ""


def _dataset_of(studio: Studio, songs: Storage, request: MakeRequest) -> Any:
    """The folder's dataset: the one already registered for it, else a new one, created the way
    the main job's dataset stage creates it."""
    slug = store.find_dataset_by_source(studio.storage, songs.url)
    if slug is not None:
        return store.load_summary(studio.storage, slug)
    inp = CreateDatasetInput(name=request.name, source_dir=songs.url, custom_tag=request.tag)
    detail = store.create_dataset(studio.storage, inp)
    return store.load_summary(studio.storage, detail.slug)


def router(studio: Studio) -> APIRouter:
    api = APIRouter()

    @api.post("/make", status_code=202)
    def start_make(request: MakeRequest) -> JSONResponse:
        stages.resolve(MAKE_KIND)  # 501 before anything else: the client cannot fix that
        try:
            songs = check_songs_folder(studio, request.songs_dir)
        except InputError as exc:  # PathNotAllowedError (403) is not an InputError
            return JSONResponse({"error": str(exc)}, status_code=400)
        summary = _dataset_of(studio, songs, request)
        running = studio.jobs.active_job_for(summary.id)
        if running:
            raise ConflictError(f"a job is already running for this dataset ({running})")
        given = request.model_dump(exclude_unset=True)
        options = MakeJobOptions(
            **{**given, "songs_dir": songs.url, "checkpoints": checkpoints_for(studio)}
        )
        job = studio.jobs.submit(MAKE_KIND, summary, options)
        body = {"jobId": job.id, "job": job.to_json_dict(), "dataset": summary.to_json_dict()}
        return JSONResponse(body, status_code=202)

    return api


# -- running (inside the runner actor) ---------------------------------------------------------
# The main job's own stage jobs (each writes the `jobs/<id>/` record its CLI command writes).
# They become children of the studio job, as a stage's own job does in the other runners, so
# the jobs list shows one `make` job, not its parts as well.
SUB_JOB_KINDS = frozenset({"build", "label", "preprocess", "train-dit", "train-lm"})


def run_make(ctx: Any, entry: Any) -> dict[str, Any]:
    """The runner adapter (`stages.STAGES["make"]`): `run_main_job` on the studio's storage root
    with the job's options, every main-job event passed into `ctx.events`. Returns the main
    job's `result.json` (the same JSON `hotstep-ray make --json` prints)."""
    options: MakeJobOptions = ctx.options
    config = MakeOptions(
        songs=options.songs_dir,
        name=options.name,
        tag=options.tag,
        data=ctx.storage.url,
        checkpoints=options.checkpoints or None,
        epochs=options.epochs,
        ray_train=options.train_on_ray,
        skip_train=not options.train,
        skip_audition=not options.audition,
        retrain=options.retrain,
    )
    adopted: set[str] = set()
    phase = [""]

    def sink(event: Any) -> None:
        ctx.events(event)
        # A stage job reports its first phase once its record exists: looked for on each new
        # phase (a few dozen per run), not on every event.
        if event.type == "progress" and event.phase and event.phase != phase[0]:
            phase[0] = event.phase
            _adopt_sub_jobs(ctx, adopted)

    try:
        result = entry(config, sinks=(sink,))
    finally:
        _adopt_sub_jobs(ctx, adopted)
    return result.to_json_dict()


def _adopt_sub_jobs(ctx: Any, adopted: set[str]) -> None:
    """Announce the stage jobs the main job has started so far (its dataset's, since this job
    started) to the runner, which records them as children. Never raises: a sink that raises is
    dropped by the event log, and the job's events would stop with it."""
    from hotstep_ray.core.events import JobEvent
    from hotstep_ray.studio.records import list_stored

    job = ctx.job.summary
    try:
        for summary in list_stored(ctx.storage):
            if (
                summary.id not in adopted
                and summary.id != job.id
                and summary.kind in SUB_JOB_KINDS
                and summary.dataset_id == job.dataset_id
                and summary.created_at >= job.created_at
            ):
                adopted.add(summary.id)
                ctx.events(JobEvent(job=summary))
    except Exception:
        log.warning("could not list the stage jobs of %s", job.id, exc_info=True)
