"""`hotstep-ray bench e2e`: `make` timed stage by stage. The tiny cold run goes end to end in this
process (on the session's Ray); the `make` process each real run is, is checked by its arguments
(read back through the real `make` command) and by a stand-in child process."""

from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner

from hotstep_ray import bench_e2e
from hotstep_ray.bench_e2e import E2eOptions, Outcome, Prepared
from hotstep_ray.cli import main as cli_main
from hotstep_ray.cli.main import app
from hotstep_ray.core.compile_cache import CACHE_VARS
from hotstep_ray.core.contracts import MakeOptions
from hotstep_ray.core.errors import InputError
from hotstep_ray.main_job import STAGES

runner = CliRunner()


@pytest.mark.ray
@pytest.mark.slow
def test_a_tiny_cold_run_reports_its_timeline_and_environment(tmp_path, ray_session, monkeypatch):
    # The main job sets the compile-cache variables of this process when none are set: keep them
    # inside this test.
    for name in CACHE_VARS:
        monkeypatch.setenv(name, str(tmp_path / "compile" / name))
    work, out = tmp_path / "work", tmp_path / "e2e.json"
    args = ["bench", "e2e", "--tiny", "--songs", "2", "--seconds", "3", "--runs", "cold"]
    args += ["--epochs", "1", "--no-ray-train", "--skip-audition", "--in-process"]
    result = runner.invoke(app, [*args, "--work", str(work), "--json", "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert json.loads(out.read_text()) == report
    assert report["ok"] and report["options"]["runs"] == ["cold"]
    env = report["environment"]
    assert set(env) >= {"gpu", "torch", "ray", "python", "cpus", "commit"}
    assert env["torch"] and env["python"]

    songs = work / "songs-2x3s"
    assert report["inputs"]["songs"] == str(songs)
    # (the label stage writes what it filled back into the sidecars, keeping .bak copies)
    names = {p.name for p in songs.iterdir()}
    assert names >= {"song_00.wav", "song_00.txt", "song_01.wav", "song_01.txt"}
    sidecar = (songs / "song_00.txt").read_text()
    assert "caption: A minor-key synth groove at 92 BPM" in sidecar and "bpm: 92" in sidecar

    (cold,) = report["runs"]
    assert cold["run"] == "cold" and "fresh storage root" in cold["reuses"]
    rows = {row["name"]: row for row in cold["stages"]}
    assert list(rows) == list(STAGES)
    starts = [row["start_s"] for row in cold["stages"]]
    assert starts == sorted(starts) and starts[0] >= 0
    assert rows["audition"]["summary"] == "skipped (--skip-audition)"
    for trainer in ("train-dit", "train-lm"):
        row = rows[trainer]
        assert 0 < row["first_epoch_s"] <= row["loop_s"] <= row["seconds"]
        # set-up, epochs and finish are disjoint parts of the stage (the epoch events' ms stamps
        # round each end by < 1 ms); the time between epochs (logs, exports) is in none of them
        assert row["setup_s"] > 0 and row["finish_s"] >= 0
        assert row["setup_s"] + row["loop_s"] + row["finish_s"] <= row["seconds"] + 0.002
        assert "gpu_busy" in row and "gpu_peak_gib" in row
    totals = cold["totals"]
    assert 0 < totals["job_s"] <= totals["wall_s"] and totals["startup_s"] is None
    assert totals["train_s"] >= rows["train-lm"]["seconds"]
    assert (work / "data" / bench_e2e.MARK).is_file()  # the root a warm run may rerun on


def _flags_of(argv: list[str], monkeypatch) -> MakeOptions:
    """The `MakeOptions` the real `make` command builds from `argv` (the job itself not run)."""
    seen: list[MakeOptions] = []
    monkeypatch.setattr(cli_main, "_run_main_job", lambda as_json, options: seen.append(options))
    result = runner.invoke(app, argv)
    assert result.exit_code == 0, result.output
    (options,) = seen
    return options


@pytest.mark.parametrize(
    "options",
    [
        E2eOptions(work="/w"),
        E2eOptions(work="/w", tiny=True, epochs=2, ray_train=False, skip_audition=True),
    ],
    ids=["real", "tiny-in-process-flags"],
)
@pytest.mark.parametrize("run", ["cold", "warm"])
def test_each_run_is_the_make_command_with_the_same_config(options, run, monkeypatch):
    prepared = bench_e2e._planned(options)
    config = bench_e2e.make_config(options, run, prepared)
    assert config.retrain is (run == "warm")
    assert config.checkpoints == (None if options.tiny else "/w/trees/2b-0.6B")
    command = bench_e2e.make_command(config)
    assert command[:3] == [sys.executable, "-m", "hotstep_ray.cli.main"]
    assert _flags_of(command[3:], monkeypatch) == config


def test_options_refuse_what_does_not_apply():
    with pytest.raises(ValueError, match="--dit and --lm do not apply"):
        E2eOptions(tiny=True, lm="4B")
    with pytest.raises(ValueError, match="--songs and --seconds do not apply"):
        E2eOptions(songs_dir="/songs", songs=2)
    with pytest.raises(ValueError, match="each run once"):
        E2eOptions(runs="cold,cold")
    assert E2eOptions(runs="warm, cold").runs == ["cold", "warm"]  # warm reruns cold's root
    assert E2eOptions().runs == ["cold", "warm"] and E2eOptions().seconds == 240


def test_a_warm_run_needs_a_finished_cold_run_of_the_same_inputs(tmp_path):
    args = ["bench", "e2e", "--tiny", "--runs", "warm", "--work", str(tmp_path)]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "no finished cold run" in result.output
    assert not any(tmp_path.iterdir())  # refused before writing anything
    options = E2eOptions(tiny=True, work=str(tmp_path))
    prepared = bench_e2e._planned(options)
    root = bench_e2e.fresh_root(options, prepared)
    with pytest.raises(InputError, match="no finished cold run"):
        bench_e2e.warm_root(options, prepared)  # the cold run never finished
    bench_e2e._write_mark(root, prepared, cold_ok=True)
    assert bench_e2e.warm_root(options, prepared) == root
    other = E2eOptions(tiny=True, work=str(tmp_path), songs=3)
    with pytest.raises(InputError, match="another cold run"):
        bench_e2e.warm_root(other, bench_e2e._planned(other))


def test_a_cold_run_deletes_only_a_bench_root(tmp_path):
    options = E2eOptions(tiny=True, work=str(tmp_path))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "mine.txt").write_text("not the bench's")
    with pytest.raises(InputError, match="not a bench e2e storage root"):
        bench_e2e.fresh_root(options, bench_e2e._planned(options))
    assert (tmp_path / "data" / "mine.txt").is_file()


def test_a_make_process_is_echoed_logged_and_read(tmp_path, monkeypatch):
    """A stand-in for `make`: progress on stderr, noise then the indented result on stdout; the
    compile-cache variables of the bench are not passed on (a cold run compiles afresh)."""
    result = {"job_id": "j1", "seconds": 5.0, "startup_s": 1.5, "stages": []}
    child = (
        "import json, os, sys\n"
        f"names = {sorted(CACHE_VARS)!r}\n"
        "print('▸ dataset', file=sys.stderr)\n"
        "print('inherited', [n for n in names if n in os.environ], file=sys.stderr)\n"
        "print('(worker) a library printing to stdout')\n"
        f"print(json.dumps({result!r}, indent=2))\n"
    )
    monkeypatch.setattr(bench_e2e, "make_command", lambda config: [sys.executable, "-c", child])
    for name in CACHE_VARS:
        monkeypatch.setenv(name, "/somewhere/else")
    said: list[str] = []
    log = tmp_path / "logs" / "cold.log"
    outcome = bench_e2e.run_make_process(MakeOptions(), log, said.append)
    assert (outcome.rc, outcome.result, outcome.error) == (0, result, "")
    assert said == ["▸ dataset", "inherited []"]
    assert log.read_text().splitlines() == said
    assert json.loads(log.with_suffix(".result.json").read_text().split("\n", 1)[1]) == result

    failing = "import sys\nprint('Traceback: boom', file=sys.stderr)\nsys.exit(1)\n"
    monkeypatch.setattr(bench_e2e, "make_command", lambda config: [sys.executable, "-c", failing])
    failed = bench_e2e.run_make_process(MakeOptions(), log, lambda line: None)
    assert (failed.rc, failed.result) == (1, None) and "boom" in failed.error


def test_totals_span_the_trainers_side_by_side():
    def stage(name, start, seconds, peak=None, summary=""):
        return {"name": name, "start_s": start, "seconds": seconds, "gpu_peak_gib": peak,
                "summary": summary}  # fmt: skip

    stages = [
        stage("preprocess", 1.0, 9.0, peak=7.0),
        stage("train-dit", 10.0, 30.0, peak=18.5),
        stage("train-lm", 10.5, 40.0, peak=5.5),
        stage("audition", 50.5, 0.0, summary="skipped (--skip-audition)"),
    ]
    outcome = Outcome({"job_id": "j", "seconds": 51.0, "startup_s": 2.0, "stages": stages}, 0, 54)
    row = bench_e2e.run_report("warm", outcome, in_process=False)
    assert row["ok"] and "tensor cache" in row["reuses"] and "--retrain" in row["reuses"]
    assert row["totals"] == {
        "wall_s": 54,
        "startup_s": 2.0,
        "job_s": 51.0,
        "train_s": 40.5,
        "gpu_peak_gib": 18.5,
    }
    failed = bench_e2e.run_report("cold", Outcome(None, 1, 3.0, "boom"), in_process=True)
    assert not failed["ok"] and failed["stages"] == [] and failed["totals"]["train_s"] is None


def test_a_failed_cold_run_skips_the_warm_one(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_e2e, "environment", lambda: {})
    monkeypatch.setattr(
        bench_e2e, "run_make_here", lambda config, say: Outcome(None, 1, 0.5, "RuntimeError: x")
    )
    options = E2eOptions(tiny=True, songs=1, seconds=0.5, work=str(tmp_path), in_process=True)
    report = bench_e2e.run_bench(options)
    assert not report["ok"]
    assert [run["run"] for run in report["runs"]] == ["cold", "warm"]
    assert report["runs"][1] == {"run": "warm", "ok": False, "skipped": "the cold run failed"}
    mark = json.loads((tmp_path / "data" / bench_e2e.MARK).read_text())
    assert mark["cold_ok"] is False  # a later --runs warm is refused


def test_prepare_runs_without_the_cli(tmp_path, capsys):
    """`python -m hotstep_ray.bench_e2e prepare`: the same options, spelt as flags."""
    args = ["prepare", "--work", str(tmp_path), "--tiny", "--songs", "1", "--seconds", "0.5"]
    assert bench_e2e.main(args) == 0
    written = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert written["songs"] == str(tmp_path / "songs-1x0.5s")
    assert sorted(p.name for p in (tmp_path / "songs-1x0.5s").iterdir()) == [
        "song_00.txt",
        "song_00.wav",
    ]
    assert bench_e2e.flag_values(["--no-ray-train", "--lm", "4B"]) == {
        "ray_train": False,
        "lm": "4B",
    }
    again = bench_e2e.prepare(E2eOptions(tiny=True, songs=1, seconds=0.5, work=str(tmp_path)))
    assert again == Prepared(None, tmp_path / "songs-1x0.5s", None, None)  # reused, not rewritten
