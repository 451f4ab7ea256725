"""`hotstep-ray dataset …` through typer's CliRunner: output, exit codes and error lines."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hotstep_ray.cli import common
from hotstep_ray.cli.dataset_cmd import app
from hotstep_ray.dataset.ids import sample_id

runner = CliRunner()


def _flat(text: str) -> str:
    """Rich wraps at the terminal width; compare with whitespace collapsed."""
    return " ".join(text.split())


@pytest.fixture(autouse=True)
def wide_consoles(monkeypatch):
    """Long temp paths must not be folded by rich (the width of a non-terminal is 80)."""
    for console in (common.console, common.err_console):
        monkeypatch.setattr(console, "width", 400)


@pytest.fixture
def songs(tmp_path, wav):
    folder = tmp_path / "songs"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.wav").write_bytes(wav(1.5))
    (folder / "a.txt").write_bytes(b"caption: hi [Verse]\nbpm: 90\nlyrics:\n[Verse]\nla\n")
    (folder / "sub" / "b.flac").write_bytes(b"x")
    return folder


def test_help_everywhere():
    for args in ([], ["scan"], ["build"], ["show"], ["inspect"]):
        result = runner.invoke(app, [*args, "--help"])
        assert result.exit_code == 0, result.output
        assert "Usage" in result.stdout


def test_scan_json(songs):
    result = runner.invoke(app, ["scan", str(songs), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {
        "root": str(songs),
        "audioFiles": 2,
        "withSidecar": 1,
        "withCaption": 1,
        "hasDatasetJson": False,
        "extensions": {".flac": 1, ".wav": 1},
        "sampleNames": ["a.wav", "sub/b.flac"],
        "warnings": ["Only 2 samples — 10+ recommended"],
    }
    table = runner.invoke(app, ["scan", str(songs), "--no-recursive"])
    assert table.exit_code == 0
    assert "warning: Only 1 samples — 10+ recommended" in _flat(table.stdout)


def test_missing_folder_is_a_one_line_error(tmp_path):
    nope, data = str(tmp_path / "nope"), str(tmp_path / "data")
    for args in (["scan", nope], ["build", nope, "--data", data]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2
        assert _flat(result.stderr) == f"error: source folder not found: {tmp_path / 'nope'}"


def test_build_then_update_then_show(songs, tmp_path):
    data = tmp_path / "data"
    first = runner.invoke(app, ["build", str(songs), "--data", str(data), "--tag", "zq"])
    # b.flac is not real audio: the build writes a.wav and says it finished with a failure.
    assert first.exit_code == common.EXIT_PARTIAL == 3, first.output
    written = data / "datasets" / "songs" / "dataset.json"
    out = _flat(first.stdout)
    assert "created dataset songs" in out
    assert f"wrote {written} with 1 samples (2 found, 1 labeled, 0 excluded)" in first.stdout
    assert f"warning: sub/b.flac: cannot read audio {songs / 'sub' / 'b.flac'}" in out
    assert first.stdout.rstrip().splitlines()[-1] == (
        "finished: 1 samples written, 1 failed — see above"
    )
    doc = json.loads(written.read_text("utf-8"))
    # b.flac is not real audio: reported and left out of the build.
    assert [s["filename"] for s in doc["samples"]] == ["a.wav"]
    assert doc["metadata"]["custom_tag"] == "zq"
    assert doc["samples"][0]["custom_tag"] == "zq"
    second = runner.invoke(
        app,
        ["build", str(songs), "--data", str(data), "--tag-position", "append", "--language", "fr"],
    )
    assert second.exit_code == common.EXIT_PARTIAL, second.output
    assert "created" not in second.stdout
    doc = json.loads(written.read_text("utf-8"))
    assert (doc["metadata"]["tag_position"], doc["metadata"]["custom_tag"]) == ("append", "zq")
    assert doc["metadata"]["default_language"] == "fr"
    shown = runner.invoke(app, ["show", "songs", "--data", str(data), "--json"])
    assert shown.exit_code == 0, shown.output
    detail = json.loads(shown.stdout)
    assert (detail["status"], detail["sampleCount"], detail["datasetJsonPath"]) == (
        "built",
        2,
        str(written),
    )
    assert [s["sampleId"] for s in detail["samples"]] == [
        sample_id("a.wav"),
        sample_id("sub/b.flac"),
    ]
    table = runner.invoke(app, ["show", "songs", "--data", str(data)])
    assert table.exit_code == 0 and sample_id("a.wav") in table.stdout


def test_build_errors(songs, tmp_path):
    data = tmp_path / "data"
    outside = tmp_path / "elsewhere" / "dataset.json"
    result = runner.invoke(
        app, ["build", str(songs), "--data", str(data), "--output", str(outside)]
    )
    assert result.exit_code == 2
    assert _flat(result.stderr) == (
        f"error: output path {outside} is outside the source folder {songs} "
        f"and the storage root {data}"
    )
    assert not (data / "datasets").exists()  # refused before anything was created
    bad = runner.invoke(app, ["build", str(songs), "--data", str(data), "--tag-position", "x"])
    assert bad.exit_code == 2
    assert _flat(bad.stderr) == "error: --tag-position must be one of prepend, append, replace"
    assert runner.invoke(app, ["build", str(songs), "--genre-ratio", "101"]).exit_code == 2
    missing = runner.invoke(app, ["show", "nope", "--data", str(data)])
    assert missing.exit_code == 2
    assert _flat(missing.stderr) == f"error: no dataset 'nope' in {data}"


def test_inspect_json(songs):
    result = runner.invoke(app, ["inspect", str(songs / "a.txt"), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {
        "file": str(songs / "a.txt"),
        "convention": "txt",
        "sidecar_files": [str(songs / "a.txt")],
        "legacy_encoded": [],
        "audio": str(songs / "a.wav"),
        "parsed": {"caption": "hi [Verse]", "bpm": "90", "lyrics": "[Verse]\nla"},
        "fields": {"caption": "hi [Verse]", "bpm": "90", "lyrics": "[Verse]\nla"},
        "normalized": {
            "filename": "a.wav",
            "caption": "hi [Verse]",
            "lyrics": "[Verse]\nla",
            "genre": "",
            "bpm": 90,
            "keyscale": "",
            "timesignature": "",
            "duration": 1,
            "is_instrumental": False,
            "custom_tag": "",
            "prompt_override": None,
        },
    }


def test_inspect_loader_convention_without_caption(tmp_path):
    (tmp_path / "x.txt").write_bytes(b"genre: rock\nlyrics:\nla la\n")
    result = runner.invoke(app, ["inspect", str(tmp_path / "x.txt"), "--json"])
    report = json.loads(result.stdout)
    assert (report["convention"], report["fields"], report["audio"], report["normalized"]) == (
        "lyrics_only",
        {"lyrics": "genre: rock\nlyrics:\nla la"},
        None,
        None,
    )
    assert report["parsed"] == {"genre": "rock", "lyrics": "la la"}
    table = runner.invoke(app, ["inspect", str(tmp_path / "x.txt")])
    assert table.exit_code == 0
    assert "parsed but not used by the loader: genre" in _flat(table.stdout)


def test_inspect_errors(tmp_path):
    (tmp_path / "dir.txt").mkdir()
    unreadable = runner.invoke(app, ["inspect", str(tmp_path / "dir.txt")])
    assert unreadable.exit_code == 2
    assert _flat(unreadable.stderr).startswith(
        f"error: cannot read sidecar {tmp_path / 'dir.txt'}: "
    )
    missing = runner.invoke(app, ["inspect", str(tmp_path / "none.txt")])
    assert (missing.exit_code, _flat(missing.stderr)) == (
        2,
        f"error: not found: {tmp_path / 'none.txt'}",
    )
    wrong = runner.invoke(app, ["inspect", str(tmp_path / "notes.md")])
    assert (wrong.exit_code, _flat(wrong.stderr)) == (
        2,
        "error: notes.md: expected a sidecar .txt or an audio file",
    )


def test_build_of_readable_songs_finishes_with_exit_0(tmp_path, wav):
    folder = tmp_path / "songs"
    folder.mkdir()
    (folder / "a.wav").write_bytes(wav(0.5))
    result = runner.invoke(app, ["build", str(folder), "--data", str(tmp_path / "data")])
    assert result.exit_code == 0, result.output
    assert result.stdout.rstrip().splitlines()[-1] == "finished: 1 samples written"


def test_build_refuses_a_sidecar_no_encoding_reads_and_writes_the_rest(tmp_path, wav):
    folder = tmp_path / "songs"
    folder.mkdir()
    for name in ("a.wav", "b.wav"):
        (folder / name).write_bytes(wav(0.5))
    (folder / "a.txt").write_bytes(b"caption: caf\xe9 \x81\n")  # 0x81: not cp1252 either
    (folder / "b.txt").write_bytes("caption: Café\n".encode("cp1252"))  # read as cp1252
    data = tmp_path / "data"
    result = runner.invoke(app, ["build", str(folder), "--data", str(data)])
    assert result.exit_code == common.EXIT_PARTIAL, result.output
    assert (
        f"warning: a.wav: cannot read sidecar {folder / 'a.txt'}: byte 0xe9 at offset 12 is not "
        "UTF-8 and byte 0x81 at offset 14 is not cp1252; re-save it as UTF-8"
    ) in _flat(result.stdout)
    assert result.stdout.rstrip().splitlines()[-1] == (
        "finished: 1 samples written, 1 failed — see above"
    )
    doc = json.loads((data / "datasets" / "songs" / "dataset.json").read_text("utf-8"))
    assert [(s["filename"], s["caption"]) for s in doc["samples"]] == [("b.wav", "Café")]


def test_inspect_names_a_sidecar_read_as_cp1252(tmp_path):
    (tmp_path / "x.txt").write_bytes("caption: Café\nlyrics:\nDéjà vu\n".encode("cp1252"))
    report = json.loads(runner.invoke(app, ["inspect", str(tmp_path / "x.txt"), "--json"]).stdout)
    assert report["legacy_encoded"] == [str(tmp_path / "x.txt")]
    assert report["fields"] == {"caption": "Café", "lyrics": "Déjà vu"}
    table = runner.invoke(app, ["inspect", str(tmp_path / "x.txt")])
    assert table.exit_code == 0
    assert f"not UTF-8, read as cp1252: {tmp_path / 'x.txt'}" in _flat(table.stdout)
