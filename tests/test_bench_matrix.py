"""`hotstep-ray bench matrix`: the named configurations behind docs/BENCHMARKS.md's numbers."""

from __future__ import annotations

import json
import re
import sys
import textwrap
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from hotstep_ray import bench_matrix
from hotstep_ray.bench_matrix import ROWS, Row
from hotstep_ray.cli.main import app

runner = CliRunner()
BENCHMARKS = Path(__file__).resolve().parents[1] / "docs" / "BENCHMARKS.md"


def test_list_shows_every_row_with_its_commands():
    result = runner.invoke(app, ["bench", "matrix", "--list"])
    assert result.exit_code == 0, result.output
    heads = [line.split()[0] for line in result.output.splitlines() if not line.startswith(" ")]
    assert heads == [row.name for row in ROWS]
    for row in ROWS:
        for index in range(len(row.runs)):
            assert f"    {bench_matrix.command_line(row, index)}\n" in result.output
    # the device machine's entry point lists the same
    assert bench_matrix.describe() in result.output


def test_rows_are_well_formed_and_the_benchmarks_doc_cites_only_rows():
    names = [row.name for row in ROWS]
    assert len(set(names)) == len(names) and not set(names) & set(bench_matrix.STAGES)
    for row in ROWS:
        assert row.stage in bench_matrix.STAGES and row.bench in bench_matrix.BENCHES, row.name
        assert row.out in ("file", "dir", "none") and row.device in ("gpu", "cpu"), row.name
        assert row.runs and all("--out" not in args for args in row.runs), row.name  # added per run
    # every `--rows NAME` in BENCHMARKS is a row, and every row is in BENCHMARKS (measured or
    # listed as not measured yet)
    text = BENCHMARKS.read_text()
    cited = set(re.findall(r"`([a-z0-9.-]+)`", text)) & set(names)
    assert cited == set(names), f"rows BENCHMARKS never names: {sorted(set(names) - cited)}"
    for spec in re.findall(r"--rows ([a-z0-9,.-]+)", text):
        bench_matrix.select(spec)  # raises on a name that is no row


@pytest.mark.parametrize("row", ROWS, ids=[row.name for row in ROWS])
def test_every_rows_arguments_are_accepted_by_its_script(row: Row, tmp_path):
    """Each process's arguments (its --out included) go through the script's own argparse
    parser; the script stops there, so no benchmark runs."""
    path = bench_matrix.script_for(row.bench)
    assert path.is_file()
    for index in range(len(row.runs)):
        args = bench_matrix.arguments(row, index, tmp_path)
        assert bench_matrix.check_args(path, args) is None, (row.name, args)
    assert not any(tmp_path.iterdir())  # nothing ran


def test_the_check_refuses_what_the_parser_refuses_and_runs_nothing_after_it(tmp_path):
    script = tmp_path / "fake_bench.py"
    ran = tmp_path / "ran"
    script.write_text(
        textwrap.dedent(
            f"""
            import argparse, pathlib
            def main():
                parser = argparse.ArgumentParser()
                parser.add_argument("--steps", type=int, default=3)
                parser.parse_args()
                pathlib.Path({str(ran)!r}).write_text("ran")
            if __name__ == "__main__":
                main()
            """
        )
    )
    assert bench_matrix.check_args(script, ["--steps", "4"]) is None
    assert "unrecognized arguments: --nope" in bench_matrix.check_args(script, ["--nope"])
    assert "invalid int value" in bench_matrix.check_args(script, ["--steps", "x"])
    assert not ran.exists()
    broken = tmp_path / "broken_bench.py"
    broken.write_text("import no_such_module_here\n")
    assert "ModuleNotFoundError" in bench_matrix.check_args(broken, [])


def test_an_unknown_row_exits_2_with_a_one_line_message(capsys):
    result = runner.invoke(app, ["bench", "matrix", "--rows", "dit-2b-recipe,dit-2b-recipee"])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "'dit-2b-recipee'" in lines[0] and "'dit-2b-recipe'" in lines[0]
    assert runner.invoke(app, ["bench", "matrix"]).exit_code == 2  # neither --rows nor --list
    assert bench_matrix.main(["--rows", "no-such-row"]) == 2  # the GPU machine's entry point
    said = capsys.readouterr()
    assert said.out == "" and said.err.count("\n") == 1 and "no-such-row" in said.err


def test_rows_select_by_name_stage_or_all_each_once():
    chosen = bench_matrix.select("lm-4b-song,lm,decode")
    assert chosen[0].name == "lm-4b-song" and len(chosen) == len(set(chosen))
    assert {row.stage for row in chosen} == {"lm", "decode"}
    assert bench_matrix.select("all") == list(ROWS)


FAKE = """
import argparse, json, os, subprocess, sys, time
parser = argparse.ArgumentParser()
parser.add_argument("--x")
parser.add_argument("--sleep", type=float, default=0)
parser.add_argument("--out")
args = parser.parse_args()
print("progress for the log")
if args.sleep:  # a child of its own, as a compile worker would be
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    open(args.out + ".child", "w").write(str(child.pid))
    time.sleep(args.sleep)
open(args.out, "w").write(json.dumps({"x": args.x, "env": os.environ.get("MATRIX_TEST")}))
"""


def _fake_row(tmp_path, monkeypatch, *runs: tuple[str, ...]) -> Row:
    folder = tmp_path / "bench"
    folder.mkdir()
    (folder / bench_matrix.BENCHES["decode"][0]).write_text(FAKE)
    monkeypatch.setattr(bench_matrix, "bench_dir", lambda: folder)
    return Row("fake", "preprocess", "decode", "a fake", runs, (("MATRIX_TEST", "yes"),))


def test_a_row_runs_each_process_and_prints_one_json_line(tmp_path, monkeypatch, capsys):
    row = _fake_row(tmp_path, monkeypatch, ("--x", "1"), ("--x", "2"))
    out = tmp_path / "out"
    assert bench_matrix.run([row], out) == 0
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 1
    line = json.loads(printed[0])
    assert line["row"] == "fake" and line["ok"] and line["script"] == "bench/decode_bench.py"
    reports = [run["report"] for run in line["runs"]]
    assert reports == [{"x": "1", "env": "yes"}, {"x": "2", "env": "yes"}]
    assert [run["rc"] for run in line["runs"]] == [0, 0]
    assert "MATRIX_TEST=yes python3 bench/decode_bench.py --x 1" in line["runs"][0]["command"]
    assert "progress for the log" in Path(line["runs"][1]["log"]).read_text()
    assert json.loads((out / "matrix.jsonl").read_text()) == line


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_a_process_past_its_timeout_is_killed_with_its_children(tmp_path, monkeypatch):
    row = _fake_row(tmp_path, monkeypatch, ("--sleep", "30"))
    started = time.monotonic()
    line = bench_matrix.run_row(row, tmp_path / "out", timeout_s=2)
    assert time.monotonic() - started < 20
    (run,) = line["runs"]
    assert run["rc"] == 124 and run["timed_out"] and not line["ok"] and run["report"] is None
    pid = int((tmp_path / "out" / "fake.json.child").read_text())
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def test_the_cli_module_stays_torch_free():
    import subprocess

    code = "import sys, hotstep_ray.cli.bench_cmd; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "False", done.stderr
