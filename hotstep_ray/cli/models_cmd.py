"""`hotstep-ray models ...`: list the checkpoints a machine has, verify a DiT against fixtures,
write tiny or full-size random checkpoint trees."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from hotstep_ray.cli.common import (
    EXIT_FAILURE,
    console,
    given,
    handle_errors,
    print_json,
    with_contract_options,
)
from hotstep_ray.core.contracts import MakeRandomOptions

app = typer.Typer(help="Find, check and verify ACE-Step 1.5 checkpoints.", no_args_is_help=True)


def _size(num_bytes: int) -> str:
    value = float(num_bytes)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GB"


@app.command("list")
@handle_errors
def list_checkpoints(
    checkpoints: Path = typer.Option(..., "--checkpoints", help="The checkpoints/ folder."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Each component found (variant, dtype, size, problems) and what each stage still needs."""
    from hotstep_ray.models.discovery import discover, missing_for_stages

    components = discover(checkpoints)
    stages = missing_for_stages(components)
    if as_json:
        print_json({"components": [info.to_dict() for info in components], "stages": stages})
        return
    table = Table(title=f"checkpoints in {checkpoints}")
    for column in ("folder", "kind", "variant", "format", "dtype", "size", "status"):
        table.add_column(column)
    for info in components:
        status = "[green]ok[/]" if info.usable else "[red]" + "; ".join(info.problems) + "[/]"
        table.add_row(
            info.name,
            info.kind,
            info.variant or "-",
            info.format,
            info.dtype or "-",
            _size(info.size_bytes),
            status,
        )
    console.print(table)
    for stage, missing in stages.items():
        state = "[green]ready[/]" if not missing else f"[yellow]missing {', '.join(missing)}[/]"
        console.print(f"{stage}: {state}")


@app.command("verify")
@handle_errors
def verify(
    checkpoint: Path = typer.Option(
        ..., "--checkpoint", help="DiT folder (official or diffusers)."
    ),
    cases: Path = typer.Option(..., "--cases", help="Folder with cases.json + <case>.safetensors."),
    atol: float = typer.Option(1e-4, help="Absolute tolerance for float outputs."),
    rtol: float = typer.Option(1e-4, help="Relative tolerance for float outputs."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Run every reference case; exit 1 if any case fails or is unsupported."""
    from hotstep_ray.models.verify import verify_cases  # imports torch: not at --help

    results = verify_cases(checkpoint, cases, atol=atol, rtol=rtol)
    if as_json:
        print_json([result.to_dict() for result in results])
    else:
        table = Table(title=f"{checkpoint} vs {cases}")
        for column in ("case", "kind", "max abs err", "worst tensor", "result"):
            table.add_column(column)
        for result in results:
            error = "-" if math.isnan(result.max_abs_err) else f"{result.max_abs_err:.3g}"
            verdict = "[green]pass[/]" if result.passed else f"[red]{result.status}[/]"
            if result.message and not result.passed:
                verdict += f" {result.message}"
            table.add_row(result.name, result.kind, error, result.worst or "-", verdict)
        console.print(table)
    failed = [result.name for result in results if not result.passed]
    if failed:
        if not as_json:
            console.print(f"[red]{len(failed)} of {len(results)} cases failed[/]")
        raise typer.Exit(EXIT_FAILURE)


@app.command("make-tiny")
@handle_errors
def make_tiny(
    folder: Path = typer.Argument(..., help="Where to write the tiny checkpoints tree."),
    seed: int = typer.Option(0, help="Seed of the random weights (same seed => same bytes)."),
) -> None:
    """Write a complete tiny model tree in the official layout (DiT, VAE, text encoder, 5 Hz LM).

    Random weights, small enough that the whole pipeline runs on a CPU in seconds; it loads
    through exactly the code path real ACE-Step 1.5 weights use."""
    from hotstep_ray.models.discovery import discover
    from hotstep_ray.models.tiny_tree import make_tiny_tree

    root = make_tiny_tree(folder, seed=seed)
    table = Table(title=f"tiny checkpoints in {root}")
    for column in ("component", "kind", "size"):
        table.add_column(column)
    for info in discover(root):
        table.add_row(info.name, info.kind, f"{info.size_bytes / 1e6:.1f} MB")
    console.print(table)
    console.print(f"[green]written:[/] {root}", soft_wrap=True)


def _make_random(
    folder: Path = typer.Argument(..., help="Where to write the tree (absent or empty)."),
    **contract: Any,
) -> None:
    """Write a full-size ACE-Step 1.5 tree of random weights in the official layout.

    The real shapes (so the real memory and speed) for benchmarks and dry runs on a machine
    without the released weights. In bf16 a 2B DiT takes 4.8 GB, XL 10.0 GB; the 0.6B / 1.7B / 4B
    LMs 1.3 / 3.7 / 8.4 GB; the VAE 0.3 GB and the text encoder 1.2 GB. Each part is checked by
    the loaders' key checks on what was written; the tree appears at FOLDER only once complete
    (it is written into FOLDER.partial first)."""
    from hotstep_ray.models import random_tree  # imports torch: not at --help

    options = MakeRandomOptions.model_validate(given(contract))
    root = random_tree.write_random_tree(
        folder,
        random_tree.tree_configs(options),
        seed=options.seed,
        dtype=options.dtype,
        device=options.device,
        force=options.force,
        say=lambda message: console.print(f"  {escape(message)}", highlight=False, soft_wrap=True),
    )
    _print_tree(root, f"random checkpoints in {root}")


make_random = app.command("make-random")(
    handle_errors(with_contract_options(MakeRandomOptions)(_make_random))
)


def _print_tree(root: Path, title: str) -> None:
    from hotstep_ray.models.discovery import discover

    table = Table(title=title)
    for column in ("component", "kind", "variant", "dtype", "size"):
        table.add_column(column)
    for info in discover(root):
        table.add_row(
            info.name, info.kind, info.variant or "-", info.dtype or "-", _size(info.size_bytes)
        )
    console.print(table)
    console.print(f"[green]written:[/] {escape(str(root))}", soft_wrap=True)
