"""The benchmark matrix: every configuration behind docs/BENCHMARKS.md's numbers, by name.

A row is one named configuration of a script in the checkout's `bench/` folder: which script,
the arguments of each process it runs (a pair measured "one process per adapter" is two
processes), and the environment it needs. docs/BENCHMARKS.md cites each number by its row, so a
number's command is `hotstep-ray bench matrix --rows NAME`; rows that no number cites yet are
the measurements still missing (BENCHMARKS lists them).

    hotstep-ray bench matrix --list                         (every row and its commands)
    hotstep-ray bench matrix --rows dit-2b-recipe,decode-fast  (run them: a JSON line per row)
    hotstep-ray bench matrix --rows dit --dry-run           (a stage's rows, arguments checked)
    python3 -m hotstep_ray.bench_matrix --rows ...          (the same, on a GPU machine without
                                                             the CLI's dependencies: bench/device/)

Each process runs `python bench/<script> ARGS --out <folder>/<row>...`, its output in a log
beside the report; the row's JSON line (also appended to `<folder>/matrix.jsonl`) holds each
process's exit code, wall time, and the script's report as it wrote it. The folder is `--out`,
else `$OUT` (the device machine's), else `./bench_out`.

Standard library only (and `core.errors`): the CLI imports this at start, and the GPU
machine has no typer.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import json
import os
import runpy
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hotstep_ray.core.errors import InputError

# name -> (script in bench/, what it measures); `hotstep-ray bench NAME` runs the script
BENCHES: dict[str, tuple[str, str]] = {
    "dit": ("dit_bench.py", "DiT adapter training step: ms/step, audio-s/s, MFU, peak memory"),
    "lm": ("lm_bench.py", "5 Hz LM adapter training step: tokens/s, MFU, peak memory"),
    "preprocess": ("preprocess_bench.py", "VAE encode + conditions + codes per song"),
    "audition": ("audition_bench.py", "codes -> WAV latency, planner LM codes/s, load"),
    "calibrate": ("calibrate_bench.py", "wall clock of an LM adapter calibration"),
    "mm3": ("mm3_bench.py", "MM3 DiT LoRA training step"),
    "label": ("label_bench.py", "Essentia analysis cost and actor scaling (CPU)"),
    "compile-check": ("dit_compile_check.py", "compiled vs eager DiT gradients"),
    "kernel-sweep": ("oobleck_kernel_sweep.py", "tiles of the VAE's Triton kernels (GPU)"),
    "decode": ("decode_bench.py", "preprocessing's decode task and resampling per song (CPU)"),
    "muon": ("muon_bench.py", "Muon's update on the DiT adapters' factor shapes, by precision"),
    "kron": ("kron_kernel_bench.py", "LoKR's w1-gradient Triton pass against torch (GPU)"),
    "smoke": ("smoke_models.py", "one bf16 forward of every full-size component (GPU)"),
    "lm-graph-check": ("lm_graph_check.py", "LM trainer: CUDA-graph losses against eager"),
    "guards": ("guard_cost.py", "Dynamo's guard cost per compiled DiT block (CPU)"),
}

STAGES: dict[str, str] = {
    "dit": "DiT training step",
    "lm": "LM training step",
    "preprocess": "VAE encode / preprocessing",
    "decode": "decode (codes -> audio)",
    "planner": "planner LM (audition)",
    "label": "labeling",
    "calibrate": "calibration",
    "mm3": "MM3 training step",
    "models": "model forwards",
}

EXPANDABLE = (("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),)


@dataclass(frozen=True)
class Row:
    """One named configuration: `runs` holds one argument list per process, run in order.

    out: how the script takes its report path: "file" (`--out FILE.json`), "dir" (`--out DIR`,
    lm_bench writes lm_bench.json there) or "none" (the script prints JSON lines; the row keeps
    them from its log). device: "gpu" or "cpu", what the row needs."""

    name: str
    stage: str
    bench: str
    what: str
    runs: tuple[tuple[str, ...], ...]
    env: tuple[tuple[str, str], ...] = ()
    out: str = "file"
    device: str = "gpu"

    @property
    def script(self) -> str:
        return BENCHES[self.bench][0]


def _row(
    name: str,
    stage: str,
    bench: str,
    what: str,
    *runs: str,
    env: tuple[tuple[str, str], ...] = (),
    out: str = "file",
    device: str = "gpu",
) -> Row:
    return Row(
        name, stage, bench, what, tuple(tuple(shlex.split(r)) for r in runs), env, out, device
    )


DIT_2B = "--models 2b --adapters lokr512,lora64 --batches 1 --compile step-graph"
BLOCK = "--compile reduce-overhead --optimizer-time"  # per-block CUDA graphs (before step-graph)
PLANNER = "--sections lm --decode-modes compiled --lm-adapter --no-check-eager"
PREPROCESS = "--vae-paths fast-nhwc --vae-chunk 1536 --codes-pass tf32 --iters 5 --budget-s 100"

# The configurations of the numbers in docs/BENCHMARKS.md, each as it was measured (steps,
# warm-ups and processes included), plus the ones still to measure (BENCHMARKS: "not measured").
ROWS: tuple[Row, ...] = (
    # DiT training step: 2B/XL, LoKR 512 (75.5 M parameters on 2B) and LoRA r64 (81.8 M)
    _row(
        "dit-2b-750x1",
        "dit",
        "dit",
        "2B, 750-frame (30 s) crops, batch 1, one CUDA graph per step, LoKR and LoRA",
        f"{DIT_2B} --crops 750 --steps 16 --warmup 3",
    ),
    _row(
        "dit-2b-1500x1",
        "dit",
        "dit",
        "2B, 1500-frame (60 s) crops, batch 1, one CUDA graph per step, LoKR and LoRA",
        f"{DIT_2B} --crops 1500 --steps 12 --warmup 3",
    ),
    _row(
        "dit-2b-3000x1",
        "dit",
        "dit",
        "2B, 3000-frame (120 s) crops, batch 1, one CUDA graph per step, update timed alone",
        f"{DIT_2B} --crops 3000 --steps 12 --warmup 3 --optimizer-time",
    ),
    _row(
        "dit-2b-6000x1",
        "dit",
        "dit",
        "2B, a full 240 s song, batch 1: one CUDA graph per step, then per-block graphs",
        "--models 2b --adapters lokr512,lora64 --batches 1 --crops 6000 "
        "--compile step-graph,reduce-overhead --steps 10 --warmup 3",
    ),
    _row(
        "dit-2b-recipe",
        "dit",
        "dit",
        "2B, the recipe's default path: crop 1248, batch 1, grad_accum 4 folded into one forward",
        f"{DIT_2B} --crops 1248 --grad-accum 4 --fold 4 --steps 16 --warmup 3",
    ),
    _row(
        "dit-2b-recipe-eager",
        "dit",
        "dit",
        "2B LoKR 512 at the recipe's shape without compiling: where `auto` starts to compile",
        "--models 2b --adapters lokr512 --batches 1 --compile none "
        "--crops 1248 --grad-accum 4 --fold 4 --steps 16 --warmup 3",
    ),
    _row(
        "dit-2b-750x2-padded",
        "dit",
        "dit",
        "2B, padded songs (600/400 frames, masked keys and loss) at 750 x 2, one graph per step",
        "--models 2b --adapters lokr512,lora64 --crops 750 --batches 2 --padded-frames 600 "
        "--compile step-graph --steps 12 --warmup 3",
    ),
    _row(
        "dit-2b-6000x2-blockgraphs",
        "dit",
        "dit",
        "2B, 240 s songs at batch 2, per-block CUDA graphs, one process per adapter",
        f"--models 2b --adapters lokr512 --crops 6000 --batches 2 {BLOCK} --steps 20 --warmup 4",
        f"--models 2b --adapters lora64 --crops 6000 --batches 2 {BLOCK} --steps 20 --warmup 4",
    ),
    _row(
        "dit-2b-6000x3-blockgraphs",
        "dit",
        "dit",
        "2B, LoRA r64, 240 s songs at batch 3, per-block CUDA graphs",
        "--models 2b --adapters lora64 --crops 6000 --batches 3 --compile reduce-overhead "
        "--steps 5 --warmup 2",
    ),
    _row(
        "dit-2b-750x8-blockgraphs",
        "dit",
        "dit",
        "2B, 30 s crops at batch 8, per-block CUDA graphs, one process per adapter",
        f"--models 2b --adapters lokr512 --crops 750 --batches 8 {BLOCK} --steps 12 --warmup 3",
        f"--models 2b --adapters lora64 --crops 750 --batches 8 {BLOCK} --steps 12 --warmup 3",
    ),
    _row(
        "dit-2b-1500x4-blockgraphs",
        "dit",
        "dit",
        "2B, 60 s crops at batch 4, per-block CUDA graphs, one process per adapter",
        f"--models 2b --adapters lokr512 --crops 1500 --batches 4 {BLOCK} --steps 12 --warmup 3",
        f"--models 2b --adapters lora64 --crops 1500 --batches 4 {BLOCK} --steps 12 --warmup 3",
    ),
    _row(
        "dit-xl-6000x2-blockgraphs",
        "dit",
        "dit",
        "XL, 240 s songs at batch 2, per-block CUDA graphs, one process per adapter",
        f"--models xl --adapters lokr512 --crops 6000 --batches 2 {BLOCK} --steps 12 --warmup 3",
        f"--models xl --adapters lora64 --crops 6000 --batches 2 {BLOCK} --steps 12 --warmup 3",
    ),
    _row(
        "dit-xl-6000x2",
        "dit",
        "dit",
        "XL, 240 s songs at batch 2, one CUDA graph per step, LoKR and LoRA",
        "--models xl --adapters lokr512,lora64 --crops 6000 --batches 2 --compile step-graph "
        "--steps 8 --warmup 3",
    ),
    _row(
        "dit-2b-750x1-guards",
        "dit",
        "dit",
        "2B, 750 x 1, per-block graphs: the steps again with Dynamo's guards skipped (A/B)",
        "--models 2b --adapters lokr512 --crops 750 --batches 1 --compile reduce-overhead "
        "--steps 12 --warmup 3 --guards-ab",
        "--models 2b --adapters lora64 --crops 750 --batches 1 --compile reduce-overhead "
        "--steps 12 --warmup 3 --guards-ab",
        env=(("TORCH_LOGS", "guards,recompiles"),),
    ),
    _row(
        "dit-guards-cpu",
        "dit",
        "guards",
        "Dynamo's cache lookup per compiled tiny-DiT block call, LoRA and LoKR (CPU)",
        "--repeat 15",
        out="none",
        device="cpu",
    ),
    _row(
        "muon",
        "dit",
        "muon",
        "Muon's update alone on the 2B/XL adapters' factors, by Newton-Schulz precision",
        "--repeat 10",
    ),
    _row(
        "kron-kernels",
        "dit",
        "kron",
        "LoKR's w1-gradient pair sums and the fused pair sums + mix kernel, per layer shape",
        "",
    ),
    # LM training step: 4B unless marked, LoRA r16 on q,k,v,o,gate,up,down
    _row(
        "lm-4b-song",
        "lm",
        "lm",
        "4B, one 240 s song (1700 tokens), compiled layers + CUDA graphs: AdamW, then Muon",
        "--steps 8 --sizes 4B --configs song_ro",
        "--steps 8 --sizes 4B --configs song_ro_muon",
        out="dir",
    ),
    _row(
        "lm-4b-modes",
        "lm",
        "lm",
        "4B, one song eager / compiled / checkpointed, and 2 or 4 packed songs (budget 1.0)",
        "--steps 8 --sizes 4B --activation-budget 1.0 "
        "--configs song song_compile pack4_varlen_compile",
        "--steps 8 --sizes 4B --activation-budget 1.0 --configs pack2_varlen_ro song_fit16_compile",
        out="dir",
    ),
    _row(
        "lm-eager",
        "lm",
        "lm",
        "0.6B / 1.7B / 4B eager: 1700 tokens with loss on all (the peers' setting), packed songs",
        "--configs b1700 b1700_ckpt pack4_varlen pack4_varlen_muon",
        out="dir",
    ),
    _row(
        "lm-graph-check",
        "lm",
        "lm-graph-check",
        "the LM trainer with CUDA graphs against eager, epoch by epoch (tiny LM on the GPU)",
        "--modes off,reduce-overhead,auto",
    ),
    # preprocessing: 8 songs x 240 s per batch, the product defaults
    _row(
        "preprocess-defaults",
        "preprocess",
        "preprocess",
        "VAE + conditions + codes of 8 x 240 s, the defaults: songs pageable, then pinned",
        f"{PREPROCESS} --pageable-audio",
        PREPROCESS,
        env=EXPANDABLE,
    ),
    _row(
        "oobleck-sweep",
        "preprocess",
        "kernel-sweep",
        "tiles of the VAE's Snake and fused residual kernels on one encoder window's shapes",
        "",
    ),
    _row(
        "decode-task",
        "preprocess",
        "decode",
        "preprocessing's decode task and resampling of one 240 s song, one thread (CPU)",
        "--seconds 240",
        device="cpu",
    ),
    _row(
        "resample-rates",
        "preprocess",
        "decode",
        "resampling 30 s stereo from 8-96 kHz to 48 kHz, one thread (CPU)",
        "--seconds 30 --rates 8000,16000,24000,32000,44100,96000 --repeat 5 --no-decode-task",
        device="cpu",
    ),
    # decode: codes -> audio on the audition decoder
    _row(
        "decode-fast",
        "decode",
        "audition",
        "codes -> audio tensor and WAV bytes, 30 s and 240 s, the fast path on a warmed decoder",
        "--sections decode --vae-configs fast-nhwc --decode-seconds 30,240 --repeat 5",
    ),
    _row(
        "decode-hugepages",
        "decode",
        "audition",
        "the 240 s decode with glibc's huge pages, as the Serve decoder replicas run",
        "--sections decode --vae-configs fast-nhwc --decode-seconds 240 --repeat 5",
        env=(("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1"),),
    ),
    _row(
        "decode-load",
        "decode",
        "audition",
        "8 and 32 concurrent clients on one warmed fast decoder, 30 s clips: p50 / p99",
        "--sections decode-load --load-vae-config fast-nhwc --clients 8,32",
    ),
    # planner LM (audition): 1.7B, CFG 2.0
    _row(
        "planner-30s",
        "planner",
        "audition",
        "1.7B planner, 150 codes, compiled step: base, a LoRA merged, and unmerged",
        f"{PLANNER} --lm-merge on,off --lm-seconds 30 --lm-repeat 2",
    ),
    _row(
        "planner-240s",
        "planner",
        "audition",
        "1.7B planner, 1200 codes (240 s), compiled step: base and a merged LoRA",
        f"{PLANNER} --lm-merge on --lm-seconds 240 --lm-repeat 1",
    ),
    _row(
        "planner-graph",
        "planner",
        "audition",
        "1.7B planner, 30 s and 240 s: the CUDA-graph engine, and eager at 30 s",
        "--sections lm --decode-modes graph,eager --lm-seconds 30,240 --eager-max-seconds 30 "
        "--lm-repeat 2",
    ),
    # labeling (CPU), calibration, MM3, model forwards
    _row(
        "label-scaling",
        "label",
        "label",
        "Essentia analysis through the Ray actor pool, 1-16 actors, 120 s songs (16 cores)",
        "--seconds 120 --actors 1,2,4,8,16 --time-budget-s 200",
        device="cpu",
    ),
    _row(
        "label-cost",
        "label",
        "label",
        "CPU-seconds of one 240 s song's analysis (decode, resample, BPM, key, descriptors)",
        "--songs 4 --seconds 240 --actors 1,2",
        device="cpu",
    ),
    _row(
        "calibrate-4b",
        "calibrate",
        "calibrate",
        "4B calibration end to end: base + 2 milestones x 2 scales, 2 seeds, one at a time",
        "--milestones 2 --scales 0.75,1.0 --seeds 2 --max-batch 1",
    ),
    _row(
        "calibrate-4b-batched",
        "calibrate",
        "calibrate",
        "the same grid with 4 seeds, an item's seeds decoded together (the default)",
        "--milestones 2 --scales 0.75,1.0 --seeds 4 --max-batch 4",
    ),
    _row(
        "mm3-lora",
        "mm3",
        "mm3",
        "MM3 DiT LoRA r32 step at 689 and 1378 latents, checkpointing off and on",
        "--checkpointing both --steps 5 --warmup 2",
    ),
    _row(
        "smoke",
        "models",
        "smoke",
        "one bf16 forward of every ACE-Step 1.5 component at full size",
        "",
    ),
)

ROWS_BY_NAME: dict[str, Row] = {row.name: row for row in ROWS}


def bench_dir() -> Path:
    """The checkout's bench/ folder (the scripts are not part of an installed wheel)."""
    return Path(__file__).resolve().parents[1] / "bench"


def script_for(name: str, folder: Path | None = None) -> Path:
    """The script of benchmark `name` in `folder` (default: the checkout's bench/)."""
    folder = folder or bench_dir()
    if name not in BENCHES:
        raise InputError(f"unknown benchmark {name!r}: expected one of {', '.join(BENCHES)}")
    path = folder / BENCHES[name][0]
    if not path.is_file():
        raise InputError(
            f"{path} not found: the benchmarks run from a source checkout "
            "(git clone + make install), not from an installed wheel"
        )
    return path


def select(spec: str) -> list[Row]:
    """The rows of `spec`: comma-separated row names, stage names (every row of the stage) or
    `all`, in the order given, each row once."""
    chosen: list[Row] = []
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        if item == "all":
            found = list(ROWS)
        elif item in ROWS_BY_NAME:
            found = [ROWS_BY_NAME[item]]
        elif item in STAGES:
            found = [row for row in ROWS if row.stage == item]
        else:
            close = difflib.get_close_matches(item, [*ROWS_BY_NAME, *STAGES], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise InputError(
                f"unknown matrix row {item!r}{hint}: `hotstep-ray bench matrix --list` shows them"
            )
        chosen += [row for row in found if row not in chosen]
    if not chosen:
        raise InputError("no rows given: --rows ROW[,ROW...] (see --list)")
    return chosen


def _stem(row: Row, index: int) -> str:
    return row.name if len(row.runs) == 1 else f"{row.name}.{index + 1}"


def arguments(row: Row, index: int, folder: Path) -> list[str]:
    """Process `index` of `row`'s arguments, with the report path under `folder`."""
    args = list(row.runs[index])
    if row.out == "file":
        args += ["--out", str(folder / f"{_stem(row, index)}.json")]
    elif row.out == "dir":
        args += ["--out", str(folder / _stem(row, index))]
    return args


def command_line(row: Row, index: int, folder: Path | str = "$OUT") -> str:
    """How a shell runs process `index` of `row` from the checkout's root."""
    env = [f"{key}={shlex.quote(value)}" for key, value in row.env]
    args = arguments(row, index, Path(folder))
    return " ".join([*env, "python3", f"bench/{row.script}", *map(_quote, args)])


def _quote(arg: str) -> str:
    """shlex.quote, except that a `$OUT/...` path stays for the shell to expand."""
    if arg.startswith("$OUT/") and shlex.quote(arg[1:]) == arg[1:]:
        return arg
    return shlex.quote(arg)


def describe(rows: list[Row] | tuple[Row, ...] = ROWS) -> str:
    """The `--list` text: each row's name, stage, device and purpose, then its commands."""
    lines = []
    for row in rows:
        lines.append(f"{row.name:27} {row.stage:10} {row.device:3}  {row.what}")
        lines += [f"    {command_line(row, i)}" for i in range(len(row.runs))]
    return "\n".join(lines)


class _Parsed(BaseException):  # BaseException: a script's `except Exception` lets it pass
    pass


def check_args(path: Path, args: list[str]) -> str | None:
    """None when the script at `path` accepts `args`, else why not (one line).

    Runs the script as `__main__` up to its first `ArgumentParser.parse_args`, which parses
    `args` for real and then stops the script: its imports run, nothing after its parser does
    (checks a script makes on the parsed values later are not covered)."""
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        original(self, args, namespace)
        raise _Parsed

    saved = sys.argv, list(sys.path), dict(os.environ)
    sys.argv = [str(path), *args]
    sys.path.insert(0, str(path.parent))  # as `python path` does: the script's folder first
    messages = io.StringIO()
    argparse.ArgumentParser.parse_args = parse_then_stop  # type: ignore[method-assign]
    try:
        with contextlib.redirect_stderr(messages), contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(str(path), run_name="__main__")
    except _Parsed:
        return None
    except SystemExit as exit_:
        said = [line for line in messages.getvalue().splitlines() if line.strip()]
        return said[-1] if said else f"exited ({exit_.code}) before parsing its arguments"
    except Exception as exc:  # the script could not get as far as its parser
        return f"{type(exc).__name__}: {exc}"
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
        sys.argv, sys.path[:] = saved[0], saved[1]
        if dict(os.environ) != saved[2]:  # e.g. label_bench exports PYTHONPATH at import
            os.environ.clear()
            os.environ.update(saved[2])
    return "the script ended without parsing arguments"


def dry_run(row: Row, folder: Path) -> dict[str, Any]:
    """Each process's arguments checked against its script's parser; nothing runs."""
    path = script_for(row.bench)
    checks = []
    for index in range(len(row.runs)):
        args = arguments(row, index, folder)
        problem = check_args(path, args)
        checks.append({"command": command_line(row, index, folder), "accepted": problem is None})
        if problem:
            checks[-1]["error"] = problem
    ok = all(check["accepted"] for check in checks)
    return {"row": row.name, "stage": row.stage, "dry_run": True, "ok": ok, "runs": checks}


def _report(row: Row, index: int, folder: Path, log: Path) -> Any:
    """What the script wrote (as JSON), or None when it wrote nothing readable."""
    try:
        if row.out == "file":
            return json.loads((folder / f"{_stem(row, index)}.json").read_text())
        if row.out == "dir":
            found = sorted((folder / _stem(row, index)).glob("*.json"))
            reports = {path.name: json.loads(path.read_text()) for path in found}
            return next(iter(reports.values())) if len(reports) == 1 else reports or None
        lines = log.read_text(errors="replace").splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")] or None
    except (OSError, ValueError):
        return None


def commit() -> str | None:
    """The checkout's commit (with `-dirty` for local changes), where git can tell."""
    root = bench_dir().parent
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def _stop_group(pid: int) -> None:
    """Kill what is left of the process group a row's process leads (compile workers)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _clear(row: Row, index: int, folder: Path) -> None:
    """Remove an earlier report of the same process, so a run that writes none reads as none."""
    if row.out == "file":
        (folder / f"{_stem(row, index)}.json").unlink(missing_ok=True)
    elif row.out == "dir":
        for path in (folder / _stem(row, index)).glob("*.json"):
            path.unlink()


def run_row(row: Row, folder: Path, timeout_s: float = 0) -> dict[str, Any]:
    """Run `row`'s processes one after another; its JSON line's content.

    Each process is `python bench/<script> ARGS` in a session of its own, its stdout and stderr
    in `<folder>/<row>.log`; at its end (or after `timeout_s` seconds, then exit code 124) what
    is left of that session is killed, so no compile worker holds the GPU for the next row."""
    path = script_for(row.bench)
    folder.mkdir(parents=True, exist_ok=True)
    begun = datetime.now(UTC).isoformat(timespec="seconds")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **dict(row.env)}
    runs = []
    for index in range(len(row.runs)):
        log = folder / f"{_stem(row, index)}.log"
        args = arguments(row, index, folder)
        print(f"[{row.name}] {command_line(row, index, folder)}", file=sys.stderr, flush=True)
        _clear(row, index, folder)
        started = time.monotonic()
        with log.open("w") as sink:
            process = subprocess.Popen(
                [sys.executable, str(path), *args],
                cwd=path.parents[1],
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            timed_out = False
            try:
                code = process.wait(timeout=timeout_s or None)
            except subprocess.TimeoutExpired:
                timed_out = True
                _stop_group(process.pid)
                process.wait()
                code = 124
            _stop_group(process.pid)
        runs.append(
            {
                "command": command_line(row, index, folder),
                "rc": code,
                "timed_out": timed_out,
                "wall_s": round(time.monotonic() - started, 1),
                "log": str(log),
                "report": _report(row, index, folder, log),
            }
        )
    return {
        "row": row.name,
        "stage": row.stage,
        "script": f"bench/{row.script}",
        "commit": commit(),
        "started": begun,
        "ok": all(run["rc"] == 0 for run in runs),
        "runs": runs,
    }


def default_folder() -> Path:
    return Path(os.environ.get("OUT") or "bench_out")


def run(rows: list[Row], folder: Path, timeout_s: float = 0, check_only: bool = False) -> int:
    """Run (or with `check_only`, check) `rows`: one JSON line per row on stdout and in
    `<folder>/matrix.jsonl`. 0 when every process exited 0 (every argument list was accepted)."""
    failed = 0
    for row in rows:
        line = dry_run(row, folder) if check_only else run_row(row, folder, timeout_s)
        failed += not line["ok"]
        text = json.dumps(line, default=str)
        print(text, flush=True)
        if not check_only:
            with (folder / "matrix.jsonl").open("a") as sink:
                sink.write(text + "\n")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    """`python3 -m hotstep_ray.bench_matrix`: the CLI's `bench matrix` without typer."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="", help="ROW[,ROW...], a stage's name, or all")
    parser.add_argument("--list", action="store_true", help="show the rows and their commands")
    parser.add_argument("--out", type=Path, default=None, help="folder (default $OUT, bench_out)")
    parser.add_argument("--timeout", type=float, default=0, help="seconds per process (0: none)")
    parser.add_argument("--dry-run", action="store_true", help="check the arguments, run nothing")
    args = parser.parse_args(argv)
    try:
        rows = select(args.rows) if args.rows or not args.list else list(ROWS)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.list:
        print(describe(rows))
        return 0
    return run(rows, args.out or default_folder(), args.timeout, args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
