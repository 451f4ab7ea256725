"""`hotstep-ray bench NAME [ARGS...]`, `hotstep-ray bench matrix` and `hotstep-ray bench e2e`:
the benchmarks of docs/BENCHMARKS.md.

The benchmark scripts live in the checkout's `bench/` folder (not in the installed package: they
carry device notes, not library code). `bench NAME` runs one of them in this process with the
remaining arguments, exactly as `python bench/<its script> ARGS` does; `bench matrix` runs the
named configurations BENCHMARKS cites (`hotstep_ray.bench_matrix`), each process its own;
`bench e2e` times `hotstep-ray make` stage by stage, cold and warm (`hotstep_ray.bench_e2e`):

    hotstep-ray bench list
    hotstep-ray bench matrix --list
    hotstep-ray bench matrix --rows dit-2b-recipe,lm-4b-song --out results/
    hotstep-ray bench dit --models 2b --adapters lora64 --crops 6000 --batches 1,2 --compile default
    hotstep-ray bench dit --tiny --device cpu --out /tmp/dit_bench.json     (a CPU dry run)
    hotstep-ray bench e2e --work /tmp/e2e --epochs 40 --out e2e.json
    hotstep-ray bench e2e --tiny --songs 2 --seconds 3 --runs cold --epochs 1  (a CPU dry run)
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from hotstep_ray import bench_e2e, bench_matrix
from hotstep_ray.bench_e2e import E2eOptions
from hotstep_ray.bench_matrix import BENCHES
from hotstep_ray.cli.common import (
    EXIT_FAILURE,
    console,
    err_console,
    given,
    handle_errors,
    print_json,
    with_contract_options,
)

app = typer.Typer(
    help="Run a benchmark script from the checkout's bench/ folder (see docs/BENCHMARKS.md).",
    no_args_is_help=True,
)


bench_dir = bench_matrix.bench_dir
script_for = bench_matrix.script_for


@app.command("list")
def list_benches() -> None:
    """What each benchmark measures."""
    for name, (script, what) in BENCHES.items():
        typer.echo(f"{name:14} bench/{script:24} {what}")
    typer.echo(f"{'matrix':14} {'':30} the named configurations of docs/BENCHMARKS.md (--list)")
    typer.echo(f"{'e2e':14} {'':30} hotstep-ray make stage by stage, cold and warm")


@app.command("matrix")
@handle_errors
def matrix(
    rows: str = typer.Option(
        "", "--rows", help="ROW[,ROW...]: row names, a stage's name (all its rows), or all."
    ),
    show: bool = typer.Option(False, "--list", help="Show the rows and their commands."),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Folder of the reports, logs and matrix.jsonl (default $OUT, else ./bench_out).",
    ),
    timeout: float = typer.Option(0, "--timeout", help="Seconds per process, 0 for none."),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Check each row's arguments against its script; run nothing."
    ),
) -> None:
    """Run named benchmark configurations: one JSON line per row (docs/BENCHMARKS.md cites
    its numbers by row)."""
    chosen = bench_matrix.select(rows) if rows or not show else list(bench_matrix.ROWS)
    if show:
        typer.echo(bench_matrix.describe(chosen))
        return
    folder = out or bench_matrix.default_folder()
    raise typer.Exit(bench_matrix.run(chosen, folder, timeout, check_only=dry_run))


def _e2e(
    out: Path | None = typer.Option(None, "--out", help="Write the JSON report to this file."),
    as_json: bool = typer.Option(
        False, "--json", help="Print the report as JSON (progress goes to stderr)."
    ),
    **contract: Any,
) -> None:
    """`hotstep-ray make` end to end, stage by stage: a cold run on a fresh storage root, then a
    warm `make --retrain` on the same root (dataset, tensor cache and compile cache reused, both
    adapters trained again), each its own `make` process.

    The inputs are written under --work once and reused: a full-size tree of random weights
    (`models make-random`; --tiny: make's tiny CPU tree) and synthetic songs with Side-Step
    sidecars (or --songs-dir). Reports each run's stage timeline (start, seconds, the trainers'
    epoch loop and first epoch, GPU busy and peak memory) with the environment; exits 1 when a
    run failed."""
    options = E2eOptions.model_validate(given(contract))
    printer = err_console if as_json else console

    def say(message: str) -> None:
        printer.print(escape(message), highlight=False, soft_wrap=True)

    report = bench_e2e.run_bench(options, say)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    if as_json:
        print_json(report)
    else:
        _print_e2e(report)
        if out is not None:
            console.print(f"[green]report:[/] {escape(str(out))}", soft_wrap=True)
    if not report["ok"]:
        raise typer.Exit(EXIT_FAILURE)


e2e = app.command("e2e")(handle_errors(with_contract_options(E2eOptions)(_e2e)))


def _print_e2e(report: dict[str, Any]) -> None:
    env = report["environment"]
    gpu = "no GPU" if not env["gpu"] else f"{env['gpu_count']} × {env['gpu']}"
    versions = f"torch {env['torch'] or '-'}, Ray {env['ray'] or '-'}, Python {env['python']}"
    console.print(
        f"[bold]environment:[/] {escape(gpu)}, {env['cpus']} CPUs, {versions}, "
        f"commit {env['commit'] or 'unknown'}",
        highlight=False,
        soft_wrap=True,
    )
    inputs = report["inputs"]
    console.print(
        f"[bold]inputs:[/] checkpoints {escape(inputs['checkpoints'])}, songs "
        f"{escape(inputs['songs'])}",
        highlight=False,
        soft_wrap=True,
    )
    for run in report["runs"]:
        if run.get("skipped"):
            console.print(f"[yellow]{run['run']} run: skipped ({run['skipped']})[/]")
            continue
        console.print(_timeline(run))
        if not run["ok"]:
            console.print(f"[red]{run['run']} run failed (exit {run['rc']}):[/]")
            console.print(escape(run["error"]), highlight=False, soft_wrap=True)


def _timeline(run: dict[str, Any]) -> Table:
    """One run's stages: where each began on the job's clock, how long it took, for the trainers
    their set-up (before the first epoch), epochs, first epoch (which holds any compile) and
    finish (after the last epoch), and the GPU."""
    totals = run["totals"]
    startup = totals["startup_s"]
    title = f"{run['run']} run: job {_s(totals['job_s'])}, wall {_s(totals['wall_s'])}"
    if totals["train_s"] is not None:  # the trainers run side by side: their span
        title += f", trainers {_s(totals['train_s'])}"
    if startup is not None:
        title += f", start-up {_s(startup)}"
    table = Table(title=title, caption=run["reuses"], caption_justify="left")
    table.add_column("stage")
    columns = ("start", "seconds", "set-up", "loop", "first epoch", "finish", "GPU busy")
    for column in (*columns, "GPU peak"):
        table.add_column(column, justify="right")
    for stage in run["stages"]:
        skipped = str(stage.get("summary", "")).startswith("skipped")
        table.add_row(
            stage["name"],
            _s(stage["start_s"]),
            "skipped" if skipped else _s(stage["seconds"]),
            _s(stage.get("setup_s")),
            _s(stage.get("loop_s")),
            _s(stage.get("first_epoch_s")),
            _s(stage.get("finish_s")),
            "-" if stage.get("gpu_busy") is None else f"{stage['gpu_busy']:.0%}",
            "-" if stage.get("gpu_peak_gib") is None else f"{stage['gpu_peak_gib']:.1f} GiB",
        )
    peak = totals["gpu_peak_gib"]
    table.add_section()
    table.add_row(
        "total",
        "",
        _s(totals["job_s"]),
        "",
        "",
        "",
        "",
        "",
        "-" if peak is None else f"{peak:.1f} GiB",
    )
    return table


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f} s"


def run_script(path: Path, args: list[str]) -> int:
    """Run `path` as `__main__` with `args` as its argv; returns its exit code."""
    saved = sys.argv
    sys.argv = [str(path), *args]
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as done:
        code = done.code
        # `raise SystemExit("why")`: the script's refusal, shown as Python itself would
        if isinstance(code, str):
            typer.echo(code, err=True)
        return code if isinstance(code, int) else (0 if code is None else 1)
    finally:
        sys.argv = saved
    return 0


def _command(name: str):
    @handle_errors
    def command(ctx: typer.Context) -> None:
        code = run_script(script_for(name), list(ctx.args))
        raise typer.Exit(code)

    command.__doc__ = BENCHES[name][1] + " (arguments: see --help of the script)."
    return command


for _name in BENCHES:
    app.command(
        _name,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        add_help_option=False,  # --help goes to the script, which documents its options
    )(_command(_name))
