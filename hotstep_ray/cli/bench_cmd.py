"""`hotstep-ray bench NAME [ARGS...]` and `hotstep-ray bench matrix`: the benchmarks of
docs/BENCHMARKS.md.

The benchmark scripts live in the checkout's `bench/` folder (not in the installed package: they
carry device notes, not library code). `bench NAME` runs one of them in this process with the
remaining arguments, exactly as `python bench/<its script> ARGS` does; `bench matrix` runs the
named configurations BENCHMARKS cites (`hotstep_ray.bench_matrix`), each process its own:

    hotstep-ray bench list
    hotstep-ray bench matrix --list
    hotstep-ray bench matrix --rows dit-2b-recipe,lm-4b-song --out results/
    hotstep-ray bench dit --models 2b --adapters lora64 --crops 6000 --batches 1,2 --compile default
    hotstep-ray bench dit --tiny --device cpu --out /tmp/dit_bench.json     (a CPU dry run)
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import typer

from hotstep_ray import bench_matrix
from hotstep_ray.bench_matrix import BENCHES
from hotstep_ray.cli.common import handle_errors

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
