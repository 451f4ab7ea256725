"""`hotstep-ray bench e2e`: the benchmark of the one command, `hotstep-ray make`, stage by stage.

What `make` needs is written into a work folder once; later benchmarks reuse it:

  trees/<dit>-<lm>/   a full-size ACE-Step 1.5 tree of random weights (`models make-random`); with
                      `--tiny` none is written and `make` trains its embedded tiny CPU tree
  songs-<N>x<S>s/     N synthetic songs of S seconds with Side-Step sidecars (or `--songs-dir`);
                      `make`'s label stage writes what it fills back into the sidecars (keeping
                      `.bak` copies), as it does in a user's folder
  data/               the storage root of the runs
  logs/               each run's `make` log and result JSON

then `make` runs once per run asked for, and each run's stage timeline (`StageReport`) is the
report, with the environment it ran in:

  cold   a fresh storage root: dataset, labels, tensor cache, compile cache and both adapter runs
         are all made in this run
  warm   `make --retrain` on the cold run's root: the dataset, the analysis cache, the tensor
         cache (the preprocess stage skips cached songs: that is the design, not a shortcut of
         the benchmark) and the compile cache are reused; both adapters are trained again

Each run is its own `python -m hotstep_ray.cli.main make` process, as a user runs it: Ray starts in
it, its imports count (`startup_s`), and nothing held in memory carries over from an earlier run,
only what is on disk. The compile-cache variables of this process are not passed on, so a cold
run compiles into its own fresh root. `--in-process` runs the main job in this process instead
(tests, a quick look): it joins a Ray already running here and keeps whatever an earlier run left
in memory, so its runs are a check of the flow, not a measurement of the command.

On a GPU machine without the CLI's dependencies, `python3 -m hotstep_ray.bench_e2e prepare
--work DIR ...` writes the tree and the songs only (bench/device/e2e_make.sh's first call).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator, model_validator

from hotstep_ray import bench_matrix
from hotstep_ray.core.compile_cache import CACHE_VARS, compile_cache_dir
from hotstep_ray.core.contracts import MakeOptions, MakeRandomOptions, Options
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage

if TYPE_CHECKING:
    from hotstep_ray.audio.synth import SongSpec

Say = Callable[[str], None]
RunName = Literal["cold", "warm"]
RUNS: tuple[RunName, ...] = ("cold", "warm")
RATE_HZ = 48_000
# The storage root's mark: only a folder that carries it is ever deleted (for the next cold run).
MARK = ".bench-e2e.json"
# Synthetic songs cycle through these (root, mode, BPM): different keys and tempi, so the
# labels and the conditions differ from song to song.
SONG_KEYS = (("A", "minor", 92), ("E", "major", 120), ("D", "minor", 100), ("G", "major", 128))
REUSES: dict[str, str] = {
    "cold": (
        "a fresh storage root: dataset, labels, tensor cache, compile cache and both adapter "
        "runs are made in this run (the OS page cache may still hold the tree and the songs)"
    ),
    "warm": (
        "the cold run's root with make --retrain: dataset, analysis cache, tensor cache "
        "(preprocess skips cached songs, by design) and compile cache are reused; both adapters "
        "are trained again"
    ),
}
IN_PROCESS_NOTE = "; in the bench's own process: Ray and anything held in memory carry over"


class E2eOptions(Options):
    """`bench e2e`: `make` on a random full-size tree (or the tiny one) and synthetic songs,
    timed stage by stage, cold and warm."""

    dit: Literal["2b", "xl"] = Field(default="2b", description="DiT of the random tree.")
    lm: Literal["0.6B", "1.7B", "4B"] = Field(
        default="0.6B", description="5 Hz LM of the random tree."
    )
    songs: int = Field(default=4, ge=1, description="Synthetic songs to write.")
    seconds: float = Field(default=240.0, gt=0, description="Length of each synthetic song.")
    songs_dir: str = Field(
        default="", description="A folder of songs to use instead of synthetic ones."
    )
    epochs: int | None = Field(
        default=None, ge=1, description="Epochs of both trainers (none: the recipe's)."
    )
    runs: list[RunName] = Field(
        default_factory=lambda: list(RUNS),
        description="RUN[,RUN]: cold (a fresh root), warm (make --retrain on the cold run's root).",
    )
    work: str = Field(
        default="",
        description="Folder of the tree, songs, storage root and logs "
        "('' = hotstep-ray-bench-e2e in the temp folder).",
    )
    tiny: bool = Field(
        default=False,
        description="make's tiny CPU tree instead of a full-size random one (tests, a dry look).",
    )
    ray_train: bool | None = Field(
        default=None, description="make --ray-train / --no-ray-train (unset: make's choice)."
    )
    skip_audition: bool = Field(default=False, description="make --skip-audition.")
    in_process: bool = Field(
        default=False,
        description="Run the main job in this process, not a make process per run (tests).",
    )

    @field_validator("runs", mode="before")
    @classmethod
    def _split_runs(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("runs")
    @classmethod
    def _order_runs(cls, value: list[RunName]) -> list[RunName]:
        if not value:
            raise ValueError("must name a run: cold, warm or both")
        if len(set(value)) != len(value):
            raise ValueError("must name each run once")
        return sorted(value, key=RUNS.index)  # a warm run reuses what the cold one made

    @model_validator(mode="after")
    def _consistent(self) -> E2eOptions:
        given = self.model_fields_set
        if self.tiny and given & {"dit", "lm"}:
            raise ValueError("--tiny trains make's own tiny tree: --dit and --lm do not apply")
        if self.songs_dir and given & {"songs", "seconds"}:
            raise ValueError("--songs-dir gives the songs: --songs and --seconds do not apply")
        return self


# =============================================================================== the work folder


def work_dir(options: E2eOptions) -> Path:
    if options.work:
        return Path(options.work).expanduser().absolute()
    return Path(tempfile.gettempdir()) / "hotstep-ray-bench-e2e"


def tree_dir(options: E2eOptions) -> Path | None:
    """The random tree's folder, one per (DiT, LM); None with --tiny (make's own tree)."""
    return None if options.tiny else work_dir(options) / "trees" / f"{options.dit}-{options.lm}"


def songs_folder(options: E2eOptions) -> Path:
    if options.songs_dir:
        return Path(options.songs_dir).expanduser().absolute()
    return work_dir(options) / f"songs-{options.songs}x{options.seconds:g}s"


def data_dir(options: E2eOptions) -> Path:
    return work_dir(options) / "data"


def logs_dir(options: E2eOptions) -> Path:
    return work_dir(options) / "logs"


@dataclass(frozen=True)
class Prepared:
    checkpoints: Path | None  # None: make's tiny tree
    songs: Path
    tree_s: float | None  # seconds spent writing the tree here; None when reused or tiny
    songs_s: float | None  # seconds spent rendering the songs here; None when reused or given

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "checkpoints": str(self.checkpoints) if self.checkpoints else "tiny (make's own)",
            "songs": str(self.songs),
            "tree_s": _rounded(self.tree_s),
            "songs_s": _rounded(self.songs_s),
        }


def prepare(options: E2eOptions, say: Say = lambda message: None) -> Prepared:
    """The tree and the songs, each written unless already there (each appears under its final
    name only once complete, so a folder that is there is whole)."""
    tree, tree_s = tree_dir(options), None
    if tree is not None and tree.is_dir():
        say(f"tree: reusing {tree}")
    elif tree is not None:
        from hotstep_ray.models.random_tree import tree_configs, write_random_tree

        started = time.perf_counter()
        configs = tree_configs(MakeRandomOptions(dit=options.dit, lm=options.lm))
        write_random_tree(tree, configs, say=lambda message: say(f"  {message}"))
        tree_s = time.perf_counter() - started
        say(f"tree: {tree} written in {tree_s:.0f} s")
    songs, songs_s = songs_folder(options), None
    if options.songs_dir:
        say(f"songs: {songs} (given)")
    elif songs.is_dir():
        say(f"songs: reusing {songs}")
    else:
        started = time.perf_counter()
        write_songs(songs, options.songs, options.seconds)
        songs_s = time.perf_counter() - started
        say(f"songs: {options.songs} of {options.seconds:g} s in {songs} ({songs_s:.0f} s)")
    return Prepared(tree, songs, tree_s, songs_s)


def song_specs(count: int, seconds: float) -> list[tuple[str, SongSpec]]:
    """(file stem, `SongSpec`) of each synthetic song: seeded by its index, so the same count and
    length always render the same audio."""
    from hotstep_ray.audio.synth import SongSpec

    specs = []
    for index in range(count):
        root, mode, bpm = SONG_KEYS[index % len(SONG_KEYS)]
        spec = SongSpec(f"song {index}", bpm, root, mode, seconds, seed=index)
        specs.append((f"song_{index:02d}", spec))
    return specs


def sidecar_text(spec: SongSpec) -> str:
    """A Side-Step sidecar with the caption, BPM, key and signature the song was rendered with,
    as a user's own would say them: the label stage keeps these and fills only the rest."""
    return (
        f"caption: A {spec.mode}-key synth groove at {spec.bpm} BPM\nbpm: {spec.bpm}\n"
        f"key: {spec.key}\nsignature: {spec.beats_per_bar}/4\nis_instrumental: true\n"
        "lyrics:\n[Instrumental]\n"
    )


def write_songs(folder: Path, count: int, seconds: float) -> list[Path]:
    """`count` WAV songs of `seconds` with their `.txt` sidecars, written beside `folder` and
    renamed into place (an interrupted write never leaves a folder later runs would trust)."""
    from hotstep_ray.audio.io import encode_audio
    from hotstep_ray.audio.synth import render_song

    folder.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        for stem, spec in song_specs(count, seconds):
            audio = encode_audio(render_song(spec, RATE_HZ), RATE_HZ, "WAV")
            (partial / f"{stem}.wav").write_bytes(audio)
            (partial / f"{stem}.txt").write_text(sidecar_text(spec), encoding="utf-8")
        os.replace(partial, folder)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return sorted(folder.glob("*.wav"))


# =============================================================================== the runs


def make_config(options: E2eOptions, run: RunName, prepared: Prepared) -> MakeOptions:
    return MakeOptions(
        songs=str(prepared.songs),
        data=str(data_dir(options)),
        checkpoints=str(prepared.checkpoints) if prepared.checkpoints else None,
        epochs=options.epochs,
        ray_train=options.ray_train,
        skip_audition=options.skip_audition,
        retrain=run == "warm",
    )


def make_args(config: MakeOptions) -> list[str]:
    """`config` as the arguments of `hotstep-ray make` (after the program's name)."""
    args = ["make", config.songs, "--data", config.data]
    if config.name:
        args += ["--name", config.name]
    if config.tag:
        args += ["--tag", config.tag]
    if config.ray_address:
        args += ["--ray-address", config.ray_address]
    if config.checkpoints:
        args += ["--checkpoints", config.checkpoints]
    if config.epochs:
        args += ["--epochs", str(config.epochs)]
    if config.ray_train is not None:
        args.append("--ray-train" if config.ray_train else "--no-ray-train")
    if config.skip_train:
        args.append("--skip-train")
    if config.skip_audition:
        args.append("--skip-audition")
    if config.retrain:
        args.append("--retrain")
    return [*args, "--json"]


def make_command(config: MakeOptions) -> list[str]:
    """The process of one run: this interpreter, the installed CLI."""
    return [sys.executable, "-m", "hotstep_ray.cli.main", *make_args(config)]


@dataclass
class Outcome:
    """What one run of `make` left: its result JSON (None when it failed), its exit code and the
    seconds it took on the bench's clock."""

    result: dict[str, Any] | None
    rc: int
    wall_s: float
    error: str = ""
    log: str = ""


def run_make_process(config: MakeOptions, log: Path, say: Say) -> Outcome:
    """`make` as its own process: its stderr (progress) is echoed and kept in `log`, its stdout
    (the result JSON) kept beside it as `<run>.result.json`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    out = log.with_suffix(".result.json")
    # The caller's own compile-cache variables would win over the root's fresh cache, and a cold
    # run would then load what an earlier session compiled.
    env = {name: value for name, value in os.environ.items() if name not in CACHE_VARS}
    env["PYTHONUNBUFFERED"] = "1"
    started = time.perf_counter()
    with log.open("w", encoding="utf-8") as log_file, out.open("w", encoding="utf-8") as stdout:
        process = subprocess.Popen(
            make_command(config),
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            env=env,
        )
        try:
            assert process.stderr is not None
            for line in process.stderr:
                log_file.write(line)
                say(line.rstrip("\n"))
            rc = process.wait()
        finally:
            _stop(process)
    wall_s = time.perf_counter() - started
    result = result_json(out.read_text(encoding="utf-8", errors="replace"))
    error = ""
    if rc != 0 or result is None:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
        error = "\n".join(lines[-20:]) or f"make exited with {rc} and printed no result"
    return Outcome(result if rc == 0 else None, rc, wall_s, error, str(log))


def _stop(process: subprocess.Popen[str]) -> None:
    """An interrupted bench stops its `make` the way Ctrl-C would (so it shuts its Ray down)."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def result_json(text: str) -> dict[str, Any] | None:
    """The result `make --json` printed last. Anything printed before it (a library writing to
    stdout) is skipped: the result is indented, so its opening brace is the last line that is
    exactly `{`."""
    lines = text.splitlines()
    starts = [index for index, line in enumerate(lines) if line == "{"]
    for start in reversed(starts):
        with contextlib.suppress(ValueError):
            found = json.loads("\n".join(lines[start:]))
            if isinstance(found, dict):
                return found
    return None


def run_make_here(config: MakeOptions, say: Say) -> Outcome:
    """The main job in this process; its log lines and stage headers go to `say`."""
    from hotstep_ray.main_job import run_main_job

    started = time.perf_counter()
    try:
        result = run_main_job(config, sinks=(_say_sink(say),))
    except Exception as exc:  # the report records the failure; the traceback goes to `say`
        say(traceback.format_exc())
        return Outcome(None, 1, time.perf_counter() - started, f"{type(exc).__name__}: {exc}")
    return Outcome(result.to_json_dict(), 0, time.perf_counter() - started)


def _say_sink(say: Say) -> Callable[[Any], None]:
    from hotstep_ray.core.events import LogEvent, ProgressEvent

    def sink(event: Any) -> None:
        if isinstance(event, LogEvent):
            say(f"  {event.message}")
        elif isinstance(event, ProgressEvent) and (event.model_extra or {}).get("stage"):
            say(f"▸ {event.phase}")

    return sink


def fresh_root(options: E2eOptions, prepared: Prepared) -> Path:
    """An empty storage root for a cold run: the previous bench root is deleted (only a folder
    with the bench's mark; anything else there is refused)."""
    root = data_dir(options)
    if root.exists():
        if not (root / MARK).is_file():
            raise InputError(
                f"{root} exists and is not a bench e2e storage root; give another --work"
            )
        shutil.rmtree(root)
    root.mkdir(parents=True)
    _write_mark(root, prepared, cold_ok=False)
    return root


def warm_root(options: E2eOptions, prepared: Prepared) -> Path:
    """The cold run's root, which must hold a finished cold run of the same songs and tree."""
    root = data_dir(options)
    try:
        mark = json.loads((root / MARK).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        mark = None
    wanted = _mark(prepared, cold_ok=True)
    if mark != wanted:
        what = "no finished cold run" if not mark or not mark.get("cold_ok") else "another cold run"
        raise InputError(
            f"{root} holds {what} of these songs and checkpoints; a warm run reruns one "
            "(--runs cold,warm)"
        )
    return root


def _mark(prepared: Prepared, *, cold_ok: bool) -> dict[str, Any]:
    checkpoints = str(prepared.checkpoints) if prepared.checkpoints else ""
    return {"songs": str(prepared.songs), "checkpoints": checkpoints, "cold_ok": cold_ok}


def _write_mark(root: Path, prepared: Prepared, *, cold_ok: bool) -> None:
    (root / MARK).write_text(json.dumps(_mark(prepared, cold_ok=cold_ok)), encoding="utf-8")


def run_report(run: RunName, outcome: Outcome, *, in_process: bool) -> dict[str, Any]:
    """One run of the report: what it reused, its totals and its stage timeline (the main job's
    `StageReport` rows as they are: start, seconds, loop, first epoch, GPU busy, GPU peak...)."""
    result = outcome.result or {}
    stages: list[dict[str, Any]] = list(result.get("stages") or [])
    ran = [s for s in stages if not str(s.get("summary", "")).startswith("skipped")]
    trainers = [s for s in ran if s["name"] in ("train-dit", "train-lm")]
    peaks = [s["gpu_peak_gib"] for s in stages if s.get("gpu_peak_gib") is not None]
    train_s = None
    if trainers:  # the two trainers run side by side: their span, not their sum
        end = max(s["start_s"] + s["seconds"] for s in trainers)
        train_s = end - min(s["start_s"] for s in trainers)
    return {
        "run": run,
        "reuses": REUSES[run] + (IN_PROCESS_NOTE if in_process else ""),
        "ok": outcome.rc == 0 and outcome.result is not None,
        "rc": outcome.rc,
        "error": outcome.error,
        "job_id": result.get("job_id", ""),
        "result_url": result.get("result_url", ""),
        "log": outcome.log,
        "totals": {
            "wall_s": _rounded(outcome.wall_s),
            # in this process the process's age says nothing about the command's start-up
            "startup_s": None if in_process else result.get("startup_s"),
            "job_s": result.get("seconds"),
            "train_s": _rounded(train_s),
            "gpu_peak_gib": max(peaks) if peaks else None,
        },
        "stages": stages,
    }


def run_bench(options: E2eOptions, say: Say = lambda message: None) -> dict[str, Any]:
    """The whole benchmark: the environment, the inputs (written unless there), then each run in
    order. A failed run ends the benchmark (a warm run needs a finished cold one)."""
    if options.runs[0] == "warm":  # before any writing: the root must already hold a cold run
        warm_root(options, _planned(options))
    report: dict[str, Any] = {
        "bench": "e2e",
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "options": options.model_dump(mode="json"),
        "environment": environment(),
    }
    prepared = prepare(options, say)
    report["inputs"] = prepared.to_json_dict()
    runs: list[dict[str, Any]] = []
    for run in options.runs:
        if runs and not runs[-1]["ok"]:
            runs.append({"run": run, "ok": False, "skipped": f"the {runs[-1]['run']} run failed"})
            continue
        root = fresh_root(options, prepared) if run == "cold" else warm_root(options, prepared)
        config = make_config(options, run, prepared)
        say(f"{run} run: make {prepared.songs} --data {root}")
        if options.in_process:
            outcome = run_make_here(config, say)
        else:
            outcome = run_make_process(config, logs_dir(options) / f"{run}.log", say)
        row = run_report(run, outcome, in_process=options.in_process)
        row["compile_cache"] = _compile_cache(root, in_process=options.in_process)
        runs.append(row)
        if run == "cold" and row["ok"]:
            _write_mark(root, prepared, cold_ok=True)
    report["runs"] = runs
    report["ok"] = all(run["ok"] for run in runs)
    return report


def _planned(options: E2eOptions) -> Prepared:
    """Where `prepare` puts the inputs, without writing them."""
    return Prepared(tree_dir(options), songs_folder(options), None, None)


def _compile_cache(root: Path, *, in_process: bool) -> dict[str, str]:
    """Where the run's compilers kept their caches: the root's own in a `make` process (which
    gets none of this process's variables); here, whatever this process's environment says."""
    if in_process:
        return {name: os.environ.get(name, "") for name in CACHE_VARS}
    folder = compile_cache_dir(Storage(str(root)))
    return {name: str(folder / sub) for name, sub in CACHE_VARS.items()}


# =============================================================================== the environment


def environment() -> dict[str, Any]:
    """The machine the numbers come from: GPU (via nvidia-smi), versions, cores, the commit."""
    gpus = gpu_names()
    return {
        "gpu": gpus[0][0] if gpus else None,
        "gpu_count": len(gpus),
        "gpu_memory_gib": gpus[0][1] if gpus else None,
        "torch": _version("torch"),
        "ray": _version("ray"),
        "python": platform.python_version(),
        "cpus": _cpus(),
        "commit": bench_matrix.commit(),
    }


def gpu_names(binary: str = "nvidia-smi") -> list[tuple[str, float | None]]:
    """(name, memory GiB) of each GPU nvidia-smi lists; [] without it."""
    found = shutil.which(binary)
    if found is None:
        return []
    query = [found, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"]
    try:
        listed = subprocess.run(query, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in listed.stdout.splitlines() if listed.returncode == 0 else []:
        name, _, mib = line.rpartition(",")
        try:
            gpus.append((name.strip(), round(float(mib) / 1024, 1)))
        except ValueError:
            gpus.append((line.strip(), None))
    return gpus


def _version(package: str) -> str | None:
    """An installed package's version, read without importing it (torch takes seconds)."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpus() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on every OS
        return os.cpu_count()


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


# =============================================================================== python -m


def main(argv: list[str] | None = None) -> int:
    """`python3 -m hotstep_ray.bench_e2e prepare --work DIR [--dit 2b] [--lm 0.6B] [--songs N]
    [--seconds S] [--tiny]`: the tree and the songs only, through the same options as
    `hotstep-ray bench e2e`, on a machine where the CLI cannot run yet."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] != ["prepare"]:
        raise SystemExit(main.__doc__)
    try:
        options = E2eOptions.model_validate(flag_values(args[1:]))
    except ValueError as exc:
        raise SystemExit(str(exc)) from exc
    print(json.dumps(prepare(options, say=print).to_json_dict()), flush=True)
    return 0


def flag_values(args: list[str]) -> dict[str, Any]:
    """`--name VALUE` / `--flag` / `--no-flag` as contract fields (`--songs-dir` = songs_dir)."""
    values: dict[str, Any] = {}
    index = 0
    while index < len(args):
        arg = args[index]
        if not arg.startswith("--"):
            raise InputError(f"unexpected argument {arg!r}: options are --name value")
        name = arg[2:].replace("-", "_")
        if index + 1 < len(args) and not args[index + 1].startswith("--"):
            values[name] = args[index + 1]
            index += 2
            continue
        if name.startswith("no_"):
            values[name[3:]] = False
        else:
            values[name] = True
        index += 1
    return values


if __name__ == "__main__":
    raise SystemExit(main())
