"""One exit-code rule for the stage commands that process many samples (cli/common.py):
0 all done, 2 bad input, EXIT_PARTIAL (3) finished with failures, with a `finished:` last line.

`label` runs for real on two tiny songs (the sidecar-encoding issue end to end); the stages that
need model weights get their engine replaced by a stub returning a result with failures, since
only the command's handling of that result is under test here.
"""

from __future__ import annotations

import errno
import io
import json
import sys
import tempfile
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf
from typer.testing import CliRunner

from hotstep_ray.cli import calibrate_cmd, common, label_cmd, mm3_cmd, preprocess_cmd
from hotstep_ray.core.contracts import CreateDatasetInput
from hotstep_ray.core.storage import Storage
from hotstep_ray.dataset.sidecar import decode_sidecar
from hotstep_ray.dataset.store import create_dataset
from hotstep_ray.preprocess.finalize import PreprocessResult

runner = CliRunner()
FFFD = "\ufffd"
CAFE = "caption: Café song\nlyrics:\nCafé au lait\n".encode("cp1252")
UNREADABLE = b"caption: caf\xe9 \x81\n"  # not UTF-8, and 0x81 is not cp1252 either


@pytest.fixture(autouse=True)
def wide_consoles(monkeypatch):
    """Long temp paths must not be folded by rich (the width of a non-terminal is 80)."""
    for console in (common.console, common.err_console):
        monkeypatch.setattr(console, "width", 400)
    for name in ("GENIUS_ACCESS_TOKEN", "GEMINI_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)  # never reach a real service from a test


def _wav(seconds: float = 2.0, rate: int = 8000) -> bytes:
    """A quiet sine, long enough for the label job to analyse it."""
    t = np.arange(int(seconds * rate)) / rate
    buffer = io.BytesIO()
    sf.write(buffer, 0.1 * np.sin(2 * np.pi * 440 * t), rate, "PCM_16", format="WAV")
    return buffer.getvalue()


def _dataset(tmp_path: Path, sidecars: dict[str, bytes]) -> tuple[Path, Path, str]:
    songs = tmp_path / "songs"
    songs.mkdir()
    for stem, data in sidecars.items():
        (songs / f"{stem}.wav").write_bytes(_wav())
        (songs / f"{stem}.txt").write_bytes(data)
    data_root = tmp_path / "data"
    detail = create_dataset(Storage(data_root), CreateDatasetInput(source_dir=str(songs)))
    return songs, data_root, detail.slug


def _last_line(text: str) -> str:
    return text.rstrip().splitlines()[-1]


def test_the_exit_codes_are_distinct_named_constants():
    assert (common.EXIT_FAILURE, common.EXIT_USAGE, common.EXIT_PARTIAL) == (1, 2, 3)


def test_label_keeps_the_original_bytes_and_exits_partial_on_failed_samples(tmp_path, monkeypatch):
    songs, data, slug = _dataset(tmp_path, {"a": CAFE, "b": UNREADABLE})
    base = ["run", slug, "--data", str(data), "--no-ray", "--scope", "all", "--no-genius"]
    base += ["--caption-provider", "offline"]

    first = runner.invoke(label_cmd.app, base)
    assert first.exit_code == common.EXIT_PARTIAL, first.output
    assert f"cannot read sidecar {songs / 'b.txt'}: byte 0xe9 at offset 12" in first.stdout
    assert _last_line(first.stdout) == "finished: 1 labeled, 1 failed — see above"
    assert "Café au lait" in (songs / "a.txt").read_text("utf-8")  # kept, and UTF-8 now

    # A second write (a new caption) must not replace the backup of the original.
    second = runner.invoke(label_cmd.app, [*base, "--merge-policy", "overwrite_caption", "--json"])
    assert second.exit_code == common.EXIT_PARTIAL, second.output
    report = json.loads(second.stdout)  # stdout stays the JSON alone
    assert (report["labeled"], report["failed"]) == (1, 1)
    assert _last_line(second.stderr) == (
        "finished: 1 labeled, 1 failed — see the errors in the JSON"
    )
    assert (songs / "a.txt.bak").read_bytes() == CAFE
    assert (songs / "a.txt.bak.1").exists()
    assert (songs / "b.txt").read_bytes() == UNREADABLE  # a refused sidecar is never rewritten
    assert not (songs / "b.txt.bak").exists()
    for path in songs.glob("*.txt*"):
        written = path.read_bytes()
        assert FFFD.encode() not in written, path
        if path.name != "b.txt":
            assert FFFD not in decode_sidecar(written), path

    # A folder the write cannot reach: the error names the sidecar, not the atomic temp file.
    (songs / "a.txt").write_text("caption: a user edit\n", "utf-8")
    real_mkstemp = tempfile.mkstemp

    def songs_read_only(*args, dir=None, **kwargs):
        if dir is not None and Path(dir) == songs:
            raise PermissionError(errno.EACCES, "Permission denied", f"{dir}/.tmp-ab12.part")
        return real_mkstemp(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", songs_read_only)
    third = runner.invoke(label_cmd.app, [*base, "--merge-policy", "overwrite_caption"])
    assert third.exit_code == common.EXIT_PARTIAL, third.output
    assert (
        f"cannot write sidecar {songs / 'a.txt'}: the folder {songs} is read-only or not writable"
    ) in third.stdout
    assert ".tmp-ab12" not in third.stdout
    assert _last_line(third.stdout) == "finished: 0 labeled, 2 failed — see above"


def test_label_of_readable_songs_exits_0(tmp_path):
    _, data, slug = _dataset(tmp_path, {"a": CAFE})
    args = ["run", slug, "--data", str(data), "--no-ray", "--no-genius", "--scope", "all"]
    result = runner.invoke(label_cmd.app, [*args, "--caption-provider", "offline"])
    assert result.exit_code == 0, result.output
    assert _last_line(result.stdout) == "finished: 1 labeled"


def _preprocess_result(failed: int) -> PreprocessResult:
    return PreprocessResult(
        slug="songs",
        variant_key="turbo",
        tensor_dir="/t/tensors/songs/turbo",
        total=2,
        processed=2 - failed,
        cached=0,
        failed=failed,
        errors={"s1": "cannot decode audio"} if failed else {},
    )


@pytest.mark.parametrize("as_json", [False, True])
@pytest.mark.parametrize("failed", [0, 1])
def test_preprocess_exits_partial_when_samples_failed(tmp_path, monkeypatch, failed, as_json):
    _, data, slug = _dataset(tmp_path, {"a": b"caption: x\n"})
    engine = types.ModuleType("hotstep_ray.preprocess.run")
    engine.preprocess_dataset = lambda *args, **kwargs: _preprocess_result(failed)
    pipeline = types.ModuleType("hotstep_ray.preprocess.ray_pipeline")
    pipeline.RayPipelineConfig = SimpleNamespace
    monkeypatch.setitem(sys.modules, "hotstep_ray.preprocess.run", engine)
    monkeypatch.setitem(sys.modules, "hotstep_ray.preprocess.ray_pipeline", pipeline)
    args = ["run", slug, "--data", str(data), "--checkpoints", str(tmp_path)]
    result = runner.invoke(preprocess_cmd.app, args + (["--json"] if as_json else []))
    assert result.exit_code == (common.EXIT_PARTIAL if failed else 0), result.output
    final = _last_line(result.stderr if as_json else result.stdout)
    if as_json:
        assert json.loads(result.stdout)["failed"] == failed
    if failed:
        where = "see the errors in the JSON" if as_json else "see above"
        assert final == f"finished: 1 encoded, 0 cached, 1 failed — {where}"
        assert as_json or "s1: cannot decode audio" in result.stdout
    else:
        assert final == "finished: 2 encoded, 0 cached"


@pytest.mark.parametrize("failed", [0, 1])
def test_mm3_preprocess_exits_partial_when_songs_failed(tmp_path, monkeypatch, failed):
    engine = types.ModuleType("hotstep_ray.mm3.preprocess")
    engine.Mm3PreprocessOptions = lambda **kw: SimpleNamespace(resolved_variant_key="mm3-x", **kw)
    engine.run_preprocess = lambda *args: {"n_ok": 1, "n_failed": failed}
    monkeypatch.setitem(sys.modules, "hotstep_ray.mm3.preprocess", engine)
    args = ["preprocess", "songs", "--data", str(tmp_path), "--checkpoints", str(tmp_path)]
    result = runner.invoke(mm3_cmd.app, args)
    assert result.exit_code == (common.EXIT_PARTIAL if failed else 0), result.output
    expected = "finished: 1 ok, 1 failed — see above" if failed else "finished: 1 ok"
    assert _last_line(result.stdout) == expected


@pytest.mark.parametrize("as_json", [False, True])
def test_calibrate_without_a_winner_exits_1_with_or_without_json(tmp_path, monkeypatch, as_json):
    """Before, `--json` exited 0 when no candidate passed the guards (and nothing was baked)."""
    outcome = SimpleNamespace(
        winner=None, document={"winner": None}, folder=SimpleNamespace(eval_key="r/eval.json")
    )
    engines = {
        "hotstep_ray.calibration.dit_calibrate": ("DitCalibrationConfig", "calibrate_dit"),
        "hotstep_ray.calibration.lm_calibrate": ("LmCalibrationConfig", "calibrate_lm"),
    }
    for name, (config, calibrate) in engines.items():
        module = types.ModuleType(name)
        setattr(module, config, lambda **kw: SimpleNamespace(**kw))
        setattr(module, calibrate, lambda *args, **kwargs: outcome)
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(calibrate_cmd, "resolve_run_key", lambda storage, run_dir: run_dir)
    monkeypatch.setattr(calibrate_cmd, "run_kind", lambda storage, key: "dit")
    args = ["run", "adapters/dit-x/band/r", "--data", str(tmp_path), "--checkpoints", "c"]
    result = runner.invoke(calibrate_cmd.app, args + (["--json"] if as_json else []))
    assert result.exit_code == common.EXIT_FAILURE, result.output
    if as_json:
        assert json.loads(result.stdout) == {"winner": None}
    else:
        assert "no candidate passed the guards" in result.stdout
