"""The registry of job kinds the studio can start, and the one function that runs a stage.

Stages are plain functions written by their own packages; the studio only knows where to look.
Each kind lists candidate entry points (`module:function`), preferred first, and the adapter in
`runners.py` that calls it. A kind none of whose candidates exists answers 501 "not available
yet" instead of failing at run time, so the API ships before every stage lands and picks each one
up as it does. A stage without a dedicated adapter is called with the `runners.dataset_entry`
convention: `fn(storage, slug, options, *, checkpoints_dir=..., events=...)`.

A stage that opens its own `core.jobs.Job` is fine: its job/status events are folded into the
studio job (`jobs.py`); everything else (progress, sample, log, metric) passes through.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel

from hotstep_ray.core.contracts import DatasetSummary, JobKind
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage
from hotstep_ray.studio.errors import ServiceUnavailableError, StageUnavailableError


@dataclass(frozen=True)
class StageSpec:
    """Args:
    kind: the job kind (`core.contracts.JobKind`).
    options: `module:Class` of its options contract (validated before the job starts).
    entries: candidate `module:function` entry points, preferred first.
    runner: the adapter (`runners.py`) that calls the entry point.
    actor_options: Ray options of the runner actor. The runner only orchestrates (the stages fan
        their own work out as Ray tasks, actor pools or a TorchTrainer), so it reserves nothing by
        default; a stage that computes in-process sets its CPU/GPU/`VRAM_GB` needs here.
    runner_resources: `module:function(options, cluster_resources) -> actor options`, for a
        stage whose needs depend on its options or on the cluster (a GPU share only where the
        cluster has GPUs); "" = none.
    """

    kind: str
    options: str
    entries: tuple[str, ...]
    runner: str = "hotstep_ray.studio.runners:dataset_entry"
    needs: tuple[str, ...] = ()  # checkpoint kinds (`models.discovery`) it cannot run without
    actor_options: dict[str, Any] = field(default_factory=dict)
    runner_resources: str = ""


_CONTRACTS = "hotstep_ray.core.contracts"
_RUNNERS = "hotstep_ray.studio.runners"
STAGES: dict[str, StageSpec] = {
    spec.kind: spec
    for spec in (
        StageSpec(
            "build",
            f"{_CONTRACTS}:BuildOptions",
            ("hotstep_ray.dataset.store:build_from_detail",),
            f"{_RUNNERS}:build",
        ),
        StageSpec(
            "label",
            f"{_CONTRACTS}:LabelOptions",
            (
                "hotstep_ray.labeling.ray_pool:label_dataset_on_ray",
                "hotstep_ray.labeling.job:label_dataset",
            ),
            f"{_RUNNERS}:label",
        ),
        StageSpec(
            "preprocess",
            f"{_CONTRACTS}:PreprocessOptions",
            ("hotstep_ray.preprocess.run:preprocess_dataset",),
            f"{_RUNNERS}:preprocess",
            needs=("dit", "vae", "text_encoder"),
        ),
        StageSpec(
            "train-lm",
            f"{_CONTRACTS}:TrainLmOptions",
            ("hotstep_ray.calibration.after_train:run_lm_on_ray_then_calibrate",),
            f"{_RUNNERS}:train_lm",
            needs=("lm",),
        ),
        StageSpec(
            "train-dit",
            f"{_CONTRACTS}:TrainDitOptions",
            ("hotstep_ray.calibration.after_train:train_dit_on_ray_then_calibrate",),
            f"{_RUNNERS}:train_dit",
            needs=("dit",),
        ),
        StageSpec(
            "audition",
            "hotstep_ray.studio.audition_job:AuditionJobOptions",
            ("hotstep_ray.studio.audition_job:audition_dataset",),
            f"{_RUNNERS}:audition",
            needs=("dit", "vae", "text_encoder"),
            runner_resources="hotstep_ray.studio.audition_job:runner_actor_options",
        ),
        # The whole `hotstep-ray make` flow as one job (`make_job.py`, its own route). It checks
        # its checkpoints itself and falls back to the tiny tree, so it lists no `needs`.
        StageSpec(
            "make",
            "hotstep_ray.studio.make_job:MakeJobOptions",
            ("hotstep_ray.main_job:run_main_job",),
            "hotstep_ray.studio.make_job:run_make",
        ),
    )
}
# Kinds started by `POST /datasets/{id}/{kind}` (build has its own route, as in the seed).
STAGE_ROUTE_KINDS = ("label", "preprocess", "train-dit", "train-lm", "audition")


def _import(path: str) -> Any:
    """`module:attr` -> the object; None when the module or attribute does not exist (yet).
    A module that exists but fails to import raises: that is a bug to see, not a missing stage."""
    module_name, attr = path.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            return None
        raise
    return getattr(module, attr, None)


def load_object(path: str) -> Any:
    """`module:attr`, imported (for an adapter that needs more of its stage's module than the
    entry point); StageUnavailableError when it is not there."""
    found = _import(path)
    if found is None:
        raise StageUnavailableError(f"{path} is not available")
    return found


def _defined(path: str) -> bool:
    """Whether `module:attr` exists, read from the source without importing it: the server
    answers 501/202 without loading torch and the stage's models (the runner imports them)."""
    module_name, attr = path.split(":", 1)
    try:
        spec = importlib.util.find_spec(module_name)
    except ModuleNotFoundError:
        return False
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return spec is not None and _import(path) is not None
    return attr in _top_level_names(spec.origin, Path(spec.origin).stat().st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _top_level_names(source_path: str, mtime_ns: int) -> frozenset[str]:
    tree = ast.parse(Path(source_path).read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(names)


@dataclass(frozen=True)
class Resolved:
    entry: str  # `module:function`
    options_model: type[BaseModel]
    runner: str  # `module:function` of the adapter

    def load(self) -> tuple[Callable[..., Any], Callable[..., Any]]:
        """(entry point, adapter), imported: only the runner actor calls this."""
        entry, runner = _import(self.entry), _import(self.runner)
        if entry is None or runner is None:
            raise StageUnavailableError(f"{self.entry} disappeared")
        return entry, runner


def resolve(kind: str) -> Resolved:
    """The kind's first existing entry point, its options model and adapter;
    StageUnavailableError when its code is not in this build yet."""
    spec = STAGES.get(kind)
    if spec is None:
        raise StageUnavailableError(f"unknown job kind {kind!r}")
    if kind not in get_args(JobKind):
        # Every job record is a `JobSummary`, whose kind is `JobKind`: a kind it does not name
        # could not even be queued.
        raise StageUnavailableError(
            f"{kind} is not available yet: core.contracts.JobKind does not name it"
        )
    try:
        options_model = _import(spec.options) if _defined(spec.options) else None
        entry = next((path for path in spec.entries if _defined(path)), None)
    except (ImportError, SyntaxError) as exc:
        raise StageUnavailableError(f"{kind} is not available: {exc}") from exc
    if options_model is None or entry is None:
        wanted = " or ".join(spec.entries)
        raise StageUnavailableError(f"{kind} is not available yet (looked for {wanted})")
    return Resolved(entry, options_model, spec.runner)


def runner_actor_options(
    kind: str, options: BaseModel, cluster_resources: dict[str, float]
) -> dict[str, Any]:
    """The runner actor's Ray options for a job of `kind` with `options` on a cluster holding
    `cluster_resources` (`ray.cluster_resources()`): the spec's own, then its `runner_resources`
    hook's."""
    spec = STAGES[kind]
    values = dict(spec.actor_options)
    hook = _import(spec.runner_resources) if spec.runner_resources else None
    if hook is not None:
        values.update(hook(options, cluster_resources))
    return values


def availability() -> dict[str, dict[str, Any]]:
    """Kind -> {available, entry | reason}, for the capabilities route."""
    report: dict[str, dict[str, Any]] = {}
    for kind in STAGES:
        try:
            report[kind] = {"available": True, "entry": resolve(kind).entry}
        except StageUnavailableError as exc:
            report[kind] = {"available": False, "reason": str(exc)}
    return report


def parse_options(kind: str, body: dict[str, Any] | None) -> BaseModel:
    """Validate a request body into the kind's options (pydantic's error on failure)."""
    return resolve(kind).options_model.model_validate(body or {})


# -- prechecks: what the seed's routes refuse before a job exists ------------------------------
def precheck(
    kind: str,
    storage: Storage,
    summary: DatasetSummary,
    options: BaseModel,
    checkpoints_dir: str = "",
) -> dict[str, Any] | None:
    """Raise for a request that cannot run; return a response body instead of a job when
    there is nothing to do (label with `allowEmpty`)."""
    _check_checkpoints(STAGES[kind], checkpoints_dir)
    if kind == "label":
        return _precheck_label(storage, summary, options)
    return None


def _check_checkpoints(spec: StageSpec, checkpoints_dir: str) -> None:
    """503 when the checkpoints a GPU stage needs are not here (the seed answers 503 too)."""
    if not spec.needs:
        return
    if not checkpoints_dir or not Path(checkpoints_dir).is_dir():
        raise ServiceUnavailableError(
            f"{spec.kind} needs a checkpoints folder; set HOTSTEP_CHECKPOINTS or --checkpoints"
        )
    from hotstep_ray.models.discovery import discover

    have = {info.kind for info in discover(checkpoints_dir) if info.usable}
    missing = [kind for kind in spec.needs if kind not in have]
    if missing:
        raise ServiceUnavailableError(
            f"{spec.kind} needs {', '.join(missing)} under {checkpoints_dir}"
        )


def _precheck_label(
    storage: Storage, summary: DatasetSummary, options: Any
) -> dict[str, Any] | None:
    from hotstep_ray.dataset.store import load_dataset
    from hotstep_ray.labeling.job import select_samples
    from hotstep_ray.labeling.providers import ProviderUnavailableError, resolve_providers

    if options.use_understand:
        raise InputError("useUnderstand (the legacy ace-understand step) is not supported")
    try:
        providers, _ = resolve_providers(options)
    except ProviderUnavailableError as exc:
        raise ServiceUnavailableError(str(exc)) from exc
    if not providers.any:
        raise InputError("no labeling step is enabled or available")
    if not select_samples(load_dataset(storage, summary.slug).samples, options):
        if options.allow_empty:
            return {"jobId": None, "skipped": "nothing-to-label"}
        raise InputError(f"nothing to label in {summary.slug!r} (scope {options.scope})")
    return None


# -- running (inside the runner actor) ---------------------------------------------------------
def run_stage(ctx: Any) -> Any:
    """Run the stage of `ctx.job` (a `runners.StageContext`) through its adapter."""
    entry, runner = resolve(ctx.job.summary.kind).load()
    return runner(ctx, entry)


def result_json(value: Any) -> Any:
    """A stage's return value as JSON-able data (None when it has no useful form)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, dict | str | int | float | list):
        return value
    return None
