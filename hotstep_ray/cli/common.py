"""Shared CLI plumbing: one console, and one way to turn errors into a red line + exit code."""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import re
import sys
from collections.abc import Callable, Container, Iterator, Mapping
from difflib import get_close_matches
from typing import TYPE_CHECKING, Any, Literal, TypeVar, get_args, get_origin

import typer
import typer.core
from pydantic import ValidationError
from rich.console import Console

from hotstep_ray.core.errors import HotstepError

if TYPE_CHECKING:
    from pydantic import BaseModel

console = Console()
err_console = Console(stderr=True)
F = TypeVar("F", bound=Callable[..., Any])

# Exit codes (README.md "Exit codes"): 0 all done; 1 a runtime failure, or a command that ran
# but produced nothing usable (`doctor` found a problem, no calibration candidate passed);
# 2 bad input/usage (as the seed's ace-train does); 3 a stage that processes many samples
# finished, wrote the ones that worked, and some failed (each reported before its final line).
# A script can then tell "fix the input and rerun" (2) from "rerun for the failed few" (3).
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_PARTIAL = 3


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


def fail_lines(messages: list[str], code: int = EXIT_USAGE) -> typer.Exit:
    """`fail` for several messages: one red `error:` line each."""
    for message in messages[:-1]:
        err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return fail(messages[-1] if messages else "invalid input", code)


def finish_stage(done: str, failed: int, *, as_json: bool = False) -> None:
    """The last line of a command that processes many samples, and its exit code:
    `finished: 8 labeled, 2 failed — see above` then exit EXIT_PARTIAL when any sample failed,
    else `finished: 8 labeled` and a normal return (exit 0). `done` says what was done
    ("8 labeled"). With --json the line goes to stderr, so stdout stays the JSON alone."""
    printer = err_console if as_json else console
    if not failed:
        printer.print(f"[green]finished:[/] {done}", highlight=False, soft_wrap=True)
        return
    where = "see the errors in the JSON" if as_json else "see above"
    printer.print(
        f"[yellow]finished:[/] {done}, [red]{failed} failed[/] — {where}",
        highlight=False,
        soft_wrap=True,
    )
    raise typer.Exit(EXIT_PARTIAL)


def handle_errors(func: F) -> F:
    """Decorator: a `HotstepError` (or ValueError from validation) becomes a one-line message and
    exit code 2; anything else propagates with its traceback (a bug, not bad input). A pydantic
    `ValidationError` (a contract built from the options) becomes one line per error, naming the
    option (`error: --epochs must be ≥ 1 (got -3)`)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except ValidationError as exc:
            raise fail_lines(validation_messages(exc, _option_flags(func), kwargs)) from exc
        except (HotstepError, ValueError, FileNotFoundError) as exc:
            raise fail(str(exc)) from exc

    return wrapper  # type: ignore[return-value]


def _option_flags(func: Callable[..., Any]) -> dict[str, str]:
    """Parameter name -> the long flag that sets it (`size` -> `--size`, `dit_folder` -> `--dit`,
    `calibrate` -> `--calibrate` of `--calibrate/--no-calibrate`), for the options of `func`."""
    flags = {}
    for name, param in inspect.signature(func).parameters.items():
        decls = [
            part
            for decl in getattr(param.default, "param_decls", None) or ()
            for part in decl.split("/")
            if part.startswith("--")
        ]
        flags[name] = decls[0] if decls else "--" + name.replace("_", "-")
    return flags


def validation_messages(
    exc: ValidationError, flags: dict[str, str] | None = None, values: dict[str, Any] | None = None
) -> list[str]:
    """One line per error of `exc`: `--flag must be <what is allowed> (got <value>)`.

    A field is named by the command-line flag that set it: the parameter of the same name, else
    the one option whose value is the rejected input (`train-lm --size` sets `lm_size`). A field no
    option set (a stored file's) is named `<field> (<Model>)`; an error of the whole contract (a
    model validator's) is its own message, its field names spelt as their flags."""
    flags = flags or {}
    values = values or {}
    lines = []
    for error in exc.errors(include_url=False):
        loc = [part for part in error.get("loc", ()) if isinstance(part, str)]
        if not loc:
            lines.append(_spell_flags(_requirement(error), flags))
            continue
        field = _snake(loc[0])
        flag = _flag_of(field, error.get("input"), flags, values)
        name = flag or f"{'.'.join(_snake(part) for part in loc)} ({exc.title})"
        requirement = _requirement(error)
        if error["type"] in ("missing", "extra_forbidden"):
            lines.append(f"{name} {requirement}")
        else:
            lines.append(f"{name} {requirement} (got {_shown(error.get('input'))})")
    return lines


def _snake(name: str) -> str:
    """`adapterType` (a field's camelCase alias) -> `adapter_type`; snake_case stays."""
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


def _flag_of(field: str, rejected: Any, flags: dict[str, str], values: dict[str, Any]) -> str:
    if field in flags:
        return flags[field]
    holders = [name for name, value in values.items() if name in flags and _holds(value, rejected)]
    if len(holders) > 1:  # the same value in several options: the one of the same type
        holders = [name for name in holders if _same_type(values[name], rejected)] or holders
    if len(holders) > 1:  # ... and named like the field (`size`, `lr` for `learning_rate`)
        holders = [name for name in holders if _named_like(name, field)] or holders
    return flags[holders[0]] if len(holders) == 1 else ""


def _same_type(value: Any, rejected: Any) -> bool:
    items = value if isinstance(value, (list, tuple)) else [value]
    return any(type(item) is type(rejected) for item in items)


def _named_like(option: str, field: str) -> bool:
    initials = "".join(part[:1] for part in field.split("_"))
    return option in field or field in option or option == initials


def _holds(value: Any, rejected: Any) -> bool:
    if value is None or isinstance(value, bool) != isinstance(rejected, bool):
        return False
    if isinstance(value, (list, tuple)) and not isinstance(rejected, (list, tuple)):
        return any(_holds(item, rejected) for item in value)
    return value == rejected or str(value) == str(rejected)


def _spell_flags(message: str, flags: dict[str, str]) -> str:
    """`t_min (0.6) must be below t_max (0.2)` -> `--t-min (0.6) must be below --t-max (0.2)`
    for the snake_case names that are options of the command."""

    def flag(match: re.Match[str]) -> str:
        return flags.get(match.group(0), match.group(0))

    return re.sub(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b", flag, message)


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _choices(expected: str) -> str:
    """pydantic's `'lora' or 'lokr'` / `'a', 'b' or 'c'` -> `lora, lokr`."""
    found = re.findall(r"'((?:[^'\\]|\\.)*)'", expected)
    return ", ".join(found) if found else expected


def _requirement(error: Any) -> str:
    """What `error` asks of the value, as the middle of `--flag must be ...`."""
    kind = error["type"]
    ctx = error.get("ctx") or {}
    bounds = {
        "greater_than_equal": ("≥", "ge"),
        "greater_than": (">", "gt"),
        "less_than_equal": ("≤", "le"),
        "less_than": ("<", "lt"),
    }
    if kind in bounds:
        sign, key = bounds[kind]
        return f"must be {sign} {_number(ctx.get(key))}"
    if kind in ("literal_error", "enum"):
        return f"must be one of {_choices(str(ctx.get('expected', '')))}"
    if kind in ("value_error", "assertion_error") and "error" in ctx:
        return str(ctx["error"])
    simple = {
        "int_parsing": "must be an integer",
        "int_type": "must be an integer",
        "int_from_float": "must be a whole number",
        "float_parsing": "must be a number",
        "float_type": "must be a number",
        "finite_number": "must be a finite number",
        "bool_parsing": "must be true or false",
        "bool_type": "must be true or false",
        "missing": "is required",
        "extra_forbidden": "is not a known option",
        "multiple_of": f"must be a multiple of {_number(ctx.get('multiple_of'))}",
        "string_too_short": f"must be at least {ctx.get('min_length')} characters",
        "string_too_long": f"must be at most {ctx.get('max_length')} characters",
        "too_short": f"must have at least {ctx.get('min_length')} items",
        "too_long": f"must have at most {ctx.get('max_length')} items",
    }
    if kind in simple:
        return simple[kind]
    message = str(error.get("msg", "is invalid"))
    return "is invalid: " + message[:1].lower() + message[1:]


def _shown(value: Any) -> str:
    if isinstance(value, str):
        return value if value.strip() else repr(value)
    if isinstance(value, (list, tuple)):
        return ",".join(map(_shown, value))
    if isinstance(value, dict):
        return "an object"
    return _number(value)


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
    contract: type[BaseModel],
    skip: Container[str] = (),
    flags: Mapping[str, str] | None = None,
    shown_defaults: Mapping[str, str] | None = None,
) -> list[inspect.Parameter]:
    """One keyword option per field of `contract` (`--x/--no-x` for booleans; a Literal shows its
    choices), each defaulting to None = not given, so the contract's own default applies and is
    written only there; --help shows it after the field's description. `flags` names a field's
    flag where it is not the field's name (`{"max_duration_s": "--max-duration"}`);
    `shown_defaults` says in words what a field's default resolves to where the default itself
    (None) would not tell a reader (`{"alpha": "by adapter (lokr 64, lora 32)"}`)."""
    params = []
    for name, field in contract.model_fields.items():
        if name in skip:
            continue
        flag = (flags or {}).get(name) or "--" + name.replace("_", "-")
        default = field.get_default(call_default_factory=True)
        if isinstance(default, list | tuple):
            shown = ",".join(
                f"{item:g}" if isinstance(item, float) else str(item) for item in default
            )
        else:
            shown = default
        shown = (shown_defaults or {}).get(name, shown)
        help_text = f"{field.description} " if field.description else ""
        help_text += f"Default: {shown!r}." if shown == "" else f"Default: {shown}."
        annotation: Any = field.annotation
        if annotation in (bool, bool | None):  # None: the contract decides when neither is given
            option = typer.Option(None, f"{flag}/--no-{flag[2:]}", help=help_text)
        elif get_origin(annotation) is Literal:
            # the choices in --help; pydantic checks the text, so a bad choice is one `error:`
            # line among the others rather than click's own box
            choices = "|".join(map(str, get_args(annotation)))
            option = typer.Option(None, flag, help=help_text, metavar=f"<{choices}>")
            annotation = str
        else:
            # text, which pydantic converts and checks: a bad number is one `error:` line too
            option = typer.Option(None, flag, help=help_text, metavar=_metavar(annotation))
            annotation = str
        params.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=annotation | None
            )
        )
    return params


def _metavar(annotation: Any) -> str:
    """`<int>`, `<float>` or `<text>`: what a field takes, `X | None` read as X."""
    kinds = [arg for arg in get_args(annotation) if arg is not type(None)] or [annotation]
    names = {int: "int", float: "float"}
    return f"<{names.get(kinds[0], 'text')}>" if len(kinds) == 1 else "<text>"


def with_contract_options(
    contract: type[BaseModel],
    skip: Container[str] = (),
    flags: Mapping[str, str] | None = None,
    shown_defaults: Mapping[str, str] | None = None,
) -> Callable[[F], F]:
    """Decorator: `func(own options..., **values)` gets a signature typer reads, its own
    parameters followed by `contract_parameters(contract, skip, flags, shown_defaults)`;
    `given(values)` then holds the options the command line set, by field name."""

    def decorate(func: F) -> F:
        signature = inspect.signature(func)
        own = [p for p in signature.parameters.values() if p.kind != inspect.Parameter.VAR_KEYWORD]
        func.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=own + contract_parameters(contract, skip, flags, shown_defaults)
        )
        return func

    return decorate


def given(values: dict[str, Any]) -> dict[str, Any]:
    """The contract options set on the command line (None = not given)."""
    return {key: value for key, value in values.items() if value is not None}
