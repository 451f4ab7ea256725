"""Shared CLI plumbing: one console, and one way to turn errors into a red line + exit code."""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import sys
from collections.abc import Callable, Container, Iterator
from difflib import get_close_matches
from typing import TYPE_CHECKING, Any, Literal, TypeVar, get_origin

import typer
import typer.core
from rich.console import Console

from hotstep_ray.core.errors import HotstepError

if TYPE_CHECKING:
    from pydantic import BaseModel

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


def contract_parameters(
    contract: type[BaseModel], skip: Container[str] = ()
) -> list[inspect.Parameter]:
    """One keyword option per field of `contract` (`--x/--no-x` for booleans; a Literal lists its
    choices), each defaulting to None = not given, so the contract's own default applies and is
    written only there; --help shows it after the field's description."""
    params = []
    for name, field in contract.model_fields.items():
        if name in skip:
            continue
        flag = "--" + name.replace("_", "-")
        default = field.get_default(call_default_factory=True)
        shown = ",".join(map(str, default)) if isinstance(default, list) else default
        help_text = f"{field.description} " if field.description else ""
        help_text += f"Default: {shown!r}." if shown == "" else f"Default: {shown}."
        annotation: Any = field.annotation
        if annotation is bool:
            option = typer.Option(None, f"{flag}/--no-{flag[2:]}", help=help_text)
        else:
            option = typer.Option(None, flag, help=help_text)
            if annotation not in (int, float, str) and get_origin(annotation) is not Literal:
                annotation = str  # pydantic converts and validates the text
        params.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation | None
            )
        )
    return params


def with_contract_options(contract: type[BaseModel], skip: Container[str] = ()) -> Callable[[F], F]:
    """Decorator: `func(own options..., **values)` gets a signature typer reads, its own
    parameters followed by `contract_parameters(contract, skip)`; `given(values)` then holds the
    options the command line set."""

    def decorate(func: F) -> F:
        signature = inspect.signature(func)
        own = [p for p in signature.parameters.values() if p.kind != inspect.Parameter.VAR_KEYWORD]
        func.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=own + contract_parameters(contract, skip)
        )
        return func

    return decorate


def given(values: dict[str, Any]) -> dict[str, Any]:
    """The contract options set on the command line (None = not given)."""
    return {key: value for key, value in values.items() if value is not None}
