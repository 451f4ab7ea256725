"""Shared CLI pieces: the calibration flags both trainers take, a stage's final line."""

from __future__ import annotations

import pytest
import typer

from hotstep_ray.cli import common
from hotstep_ray.cli.common import calibration_overrides


def test_only_the_given_calibration_flags_override_the_defaults():
    assert calibration_overrides(None, None, None) == {}
    assert calibration_overrides("0.5,1", None, 12.0) == {"scales": "0.5,1", "duration_s": 12.0}
    assert calibration_overrides(None, 3, None) == {"seeds": 3}


def test_finish_stage_prints_the_final_line_and_picks_the_exit_code(capsys, monkeypatch):
    for console in (common.console, common.err_console):
        monkeypatch.setattr(console, "width", 200)
    common.finish_stage("8 labeled", 0)  # returns: exit 0
    assert capsys.readouterr().out == "finished: 8 labeled\n"
    with pytest.raises(typer.Exit) as partial:
        common.finish_stage("8 labeled", 2)
    assert partial.value.exit_code == common.EXIT_PARTIAL == 3
    assert capsys.readouterr().out == "finished: 8 labeled, 2 failed — see above\n"
    # --json: stdout carries the JSON alone, so the line goes to stderr
    with pytest.raises(typer.Exit):
        common.finish_stage("1 ok", 1, as_json=True)
    out, err = capsys.readouterr()
    assert (out, err) == ("", "finished: 1 ok, 1 failed — see the errors in the JSON\n")
