"""Shared CLI plumbing: one console, and one way to turn errors into a red line + exit code."""

from __future__ import annotations

import contextlib
import functools
import json
import sys
from collections.abc import Callable, Iterator
from difflib import get_close_matches
from typing import Any, TypeVar

import typer
import typer.core
from rich.console import Console

from hotstep_ray.core.errors import HotstepError

console = Console()
err_console = Console(stderr=True)
F = TypeVar("F", bound=Callable[..., Any])

# Exit codes: 0 ok, 1 runtime failure, 2 bad input/usage (as the seed's ace-train does).
EXIT_FAILURE = 1
EXIT_USAGE = 2


class RunByDefault(typer.core.TyperGroup):
    """A stage's command group in which a dataset slug in place of a subcommand means `run`:
    `hotstep-ray train-dit SLUG --variant turbo` is `hotstep-ray train-dit run SLUG --variant
    turbo`. A subcommand's own name (`run`, `inspect`, ...) keeps its meaning, and so does a
    near-miss of one (typer then says "No such command 'rnu'. Did you mean 'run'?"): a dataset
    named like that ("runner") takes the explicit `run SLUG`."""

    def resolve_command(self, ctx, args):
        first = args[0] if args else ""
        if "run" in self.commands and first and first not in self.commands:
            # an option, or a near-miss of a subcommand's name ("rnu", "inpsect"), keeps
            # typer's own error with its "Did you mean" hint
            if not first.startswith("-") and not get_close_matches(first, list(self.commands)):
                args = ["run", *args]
        return super().resolve_command(ctx, args)


def fail(message: str, code: int = EXIT_USAGE) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def handle_errors(func: F) -> F:
    """Decorator: a `HotstepError` (or ValueError from validation) becomes a one-line message and
    exit code 2; anything else propagates with its traceback (a bug, not bad input)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (HotstepError, ValueError, FileNotFoundError) as exc:
            raise fail(str(exc)) from exc

    return wrapper  # type: ignore[return-value]


@contextlib.contextmanager
def json_on_stdout(as_json: bool) -> Iterator[None]:
    """With --json, stdout carries only the JSON (a script pipes it to `jq`): the progress and
    log lines printed meanwhile go to stderr."""
    if not as_json:
        yield
        return
    console.file = sys.stderr
    try:
        yield
    finally:
        console.file = None  # type: ignore[assignment]  # back to whatever sys.stdout is then


def print_json(value: Any) -> None:
    """Plain JSON on stdout (no rich markup), for scripts."""
    typer.echo(json.dumps(value, indent=2, ensure_ascii=False))


def print_eval(event: Any) -> None:
    """One `eval` metric event of a training run: the held-out loss of an epoch (`*` = best so
    far) or one calibration grid point (`<- winner`)."""
    extra = event.model_extra or {}
    if extra.get("split") == "holdout":
        mark = " *" if extra.get("best") else ""
        console.print(f"  held-out loss {event.loss:.4f}{mark}", highlight=False)
        return
    mark = "  <- winner" if extra.get("winner") else ""
    console.print(
        f"  calibrate {extra.get('candidate')} x{extra.get('scale', 0):g}  "
        f"score {extra.get('score', float('nan')):.4f}{mark}",
        highlight=False,
    )


def calibration_overrides(scales: Any, seeds: Any, duration_s: Any) -> dict[str, Any]:
    """The `--calibrate-*` flags both trainers share, as the grid overrides calibration takes
    (only the ones given: the rest keep calibration's defaults)."""
    given = {"scales": scales, "seeds": seeds, "duration_s": duration_s}
    return {key: value for key, value in given.items() if value}
