"""`hotstep-ray --help`, every command's `--help` and `jobs list` start without the heavy stacks.

A fresh interpreter (this test process has torch loaded already) imports the CLI, asks every
command group and command for its help, lists the jobs of an empty storage root, and reports
which of torch, transformers, diffusers and ray got imported meanwhile: none may be. Options
whose defaults belong to torch-side classes read them from `core.contracts` instead.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

HEAVY = ("torch", "transformers", "diffusers", "ray")

_PROBE = textwrap.dedent(
    """
    import json, sys

    import typer
    from typer.testing import CliRunner

    from hotstep_ray.cli.main import app

    def paths(command, prefix=()):
        # typer vendors its own click: groups are told by their `commands` mapping
        yield prefix, command
        for name, child in (getattr(command, "commands", None) or {}).items():
            yield from paths(child, (*prefix, name))

    runner = CliRunner()
    helps, passed_on = {}, []
    for path, command in paths(typer.main.get_command(app)):
        if not command.add_help_option:  # its --help goes to the script it runs
            passed_on.append(" ".join(path))
            continue
        result = runner.invoke(app, [*path, "--help"], terminal_width=200)
        helps[" ".join(path)] = [result.exit_code, result.output]
    jobs = runner.invoke(app, ["jobs", "list", "--data", sys.argv[1], "--json"])
    report = {
        "helps": helps,
        "jobs": [jobs.exit_code, jobs.output],
        "passed_on": passed_on,
        "heavy": sorted(name for name in sys.argv[2:] if name in sys.modules),
    }
    print(json.dumps(report))
    """
)


def _probe(root: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, str(root), *HEAVY],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_help_and_jobs_list_import_no_heavy_stack(tmp_path: Path) -> None:
    report = _probe(tmp_path)
    helps = report["helps"]
    assert len(helps) > 40  # the walk reached every group's commands
    for name in ("", "train-lm run", "calibrate run", "models make-random", "jobs list"):
        assert name in helps, sorted(helps)
    # `bench NAME --help` is the benchmark script's own help (it runs the script, which imports
    # torch); `bench` and `bench list` are the CLI's and are checked.
    assert report["passed_on"] and all(name.startswith("bench ") for name in report["passed_on"])
    assert "bench" in helps and "bench list" in helps
    failed = {name: output for name, (code, output) in helps.items() if code != 0}
    assert failed == {}
    assert "Usage: " in helps["train-lm run"][1] and "--compile" in helps["train-lm run"][1]
    code, output = report["jobs"]
    assert code == 0, output
    assert json.loads(output) == []  # an empty storage root has no jobs
    assert report["heavy"] == []
