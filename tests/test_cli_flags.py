"""Every command of the CLI declares each flag once: click keeps the last of two same-named
options without a word, so the other one's value is silently lost."""

from __future__ import annotations

import typer

from hotstep_ray.cli.main import app


def _commands(command, path: tuple[str, ...] = ()):
    """(path, leaf command) pairs; typer vendors its own click, so groups are told by their
    `commands` mapping rather than by class."""
    if getattr(command, "commands", None):
        for name, child in command.commands.items():
            yield from _commands(child, (*path, name))
    else:
        yield path, command


def test_no_command_declares_a_flag_twice() -> None:
    commands = list(_commands(typer.main.get_command(app)))
    assert len(commands) > 30  # the walk reached the subcommands
    assert ("train-dit", "run") in [path for path, _ in commands]
    twice = {}
    for path, command in commands:
        flags = [flag for param in command.params for flag in (*param.opts, *param.secondary_opts)]
        repeated = sorted({flag for flag in flags if flags.count(flag) > 1})
        if repeated:
            twice[" ".join(path)] = repeated
    assert twice == {}


def test_a_slug_in_place_of_a_subcommand_means_run() -> None:
    """`hotstep-ray train-dit SLUG ...` (the form the docs of each stage use) runs `run`."""
    from typer.testing import CliRunner

    for group in ("label", "preprocess", "train-dit", "train-lm"):
        shorthand = CliRunner().invoke(app, [group, "my-band", "--help"], terminal_width=200)
        explicit = CliRunner().invoke(app, [group, "run", "--help"], terminal_width=200)
        assert shorthand.exit_code == 0, (group, shorthand.output)
        assert shorthand.output == explicit.output and f"{group} run" in shorthand.output
    typo = CliRunner().invoke(app, ["train-dit", "--bogus"])
    assert typo.exit_code == 2 and "No such option" in typo.output  # options are not slugs
    for group, near_miss in (
        ("train-dit", "rnu"),
        ("preprocess", "inpsect"),
        ("label", "provders"),
    ):
        typo = CliRunner().invoke(app, [group, near_miss, "--data", "/nonexistent"])
        assert typo.exit_code == 2 and "Did you mean" in typo.output, (group, typo.output)
