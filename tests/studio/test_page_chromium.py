"""The studio page in a real headless Chromium (Debian's `chromium`), driven over the DevTools
protocol against the server that ran the whole pipeline (a bearer token is configured):
the token typed into the page unlocks it; a dataset created from the form is listed with its
warning; a song's caption fixed in the edit dialog lands in its sidecar on disk (a bad BPM is
refused in the dialog first); a build started from the page shows its progress live; the
train-dit job draws a loss chart with one point per reported step; the audition preview plays in
`<audio>` players; the Adapters table shows the trained run's state and ΔW/W verdict; the make
form reports a refused folder.

Skipped only when chromium is absent and `CI` is unset: on CI a missing browser is a failure
(install it with `apt-get install -y chromium`)."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from cdp import Chromium, find_chromium
from live_server import PIPELINE_SONGS

pytestmark = [pytest.mark.ray, pytest.mark.slow]
SCREENSHOT_DIR_ENV = "HOTSTEP_SCREENSHOT_DIR"  # keep the screenshot somewhere to look at it


@pytest.fixture(scope="module")
def chromium() -> str:
    binary = find_chromium()
    if binary:
        return binary
    if os.environ.get("CI"):
        pytest.fail("CI is set but chromium is not installed: apt-get install -y chromium")
    pytest.skip("chromium is not installed (apt-get install -y chromium)")


def _js(value: str) -> str:
    return json.dumps(value)


def _click_row(page: Chromium, table: str, attribute: str, value: str) -> None:
    page.wait_for(f"!!document.querySelector('#{table} tr[{attribute}={_js(value)}]')")
    page.evaluate(f"document.querySelector('#{table} tr[{attribute}={_js(value)}]').click()")


def test_the_page_drives_the_studio(chromium, studio_pipeline, rendered_songs, tmp_path):
    pipeline = studio_pipeline
    more = pipeline.root / "library" / "one-more"
    more.mkdir()
    song = next(
        p
        for p in rendered_songs.iterdir()
        if p.name.startswith(PIPELINE_SONGS[0]) and p.suffix != ".txt"
    )
    shutil.copy(song, more / song.name)
    sidecar = more / f"{song.stem}.txt"
    shutil.copy(rendered_songs / sidecar.name, sidecar)  # the song's own caption, to fix
    original = sidecar.read_bytes()

    with Chromium(chromium, tmp_path / "profile") as page:
        page.navigate(pipeline.url + "/")
        page.wait_for("document.body.dataset.ready")
        # no token yet: the page says so instead of showing an empty studio
        assert page.evaluate("document.getElementById('health').textContent") == "token needed"
        page.evaluate(
            f"document.getElementById('token').value = {_js(pipeline.token)};"
            "document.getElementById('token-form').requestSubmit()"
        )
        page.wait_for("document.getElementById('health').textContent === 'connected'")
        _click_row(page, "datasets", "data-slug", pipeline.dataset["slug"])
        assert page.evaluate("sessionStorage.getItem('hotstep-token')") == pipeline.token
        assert pipeline.token not in page.evaluate("location.href")

        # -- the audition preview: both sides playable (audio fetched with the token)
        page.wait_for("document.querySelectorAll('#previews audio[data-loaded]').length === 2")
        durations = page.wait_for(
            "(() => { const a = [...document.querySelectorAll('#previews audio')];"
            " return a.every(x => x.readyState >= 1) && a.map(x => x.duration); })()"
        )
        assert all(abs(d - 2.0) < 0.1 for d in durations), durations

        # -- the loss chart of the train-dit job: one point per reported step
        train = pipeline.runs["train-dit"]
        _click_row(page, "jobs", "data-job", train.job_id)
        page.wait_for("document.getElementById('job-status').textContent === 'done'")
        steps = [f for f in train.frames if f["type"] == "metric" and f["metric"] == "step"]
        points = page.wait_for("Number(document.getElementById('loss-chart').dataset.points)")
        assert points == len(steps) >= 4
        assert page.evaluate("document.querySelectorAll('#loss-chart circle.point').length") == (
            len(steps)
        )

        shots = [page.screenshot(tmp_path / "studio-training.png")]

        # -- the adapter the pipeline trained, with its run's state, ΔW/W and (none) calibration
        rows = page.wait_for(
            "(() => { const r = [...document.querySelectorAll('#adapters tbody tr')];"
            " return r.length && r.map(x => [x.dataset.id,"
            " ...['state', 'delta', 'calibration'].map(c => x.querySelector(`td.${c}`).textContent)]);"
            " })()"
        )
        ((adapter, state, delta, calibration),) = rows  # the pipeline trains one: its DiT
        assert adapter.startswith(f"dit-turbo/{pipeline.dataset['slug']}/") and state == "finished"
        assert delta.startswith("ΔW/W ") and calibration == "–"

        # -- a dataset created from the form is listed, with its warning
        page.evaluate(
            f"document.getElementById('create-source').value = {_js(str(more))};"
            "document.getElementById('create-name').value = 'One More';"
            "document.getElementById('create-form').requestSubmit()"
        )
        page.wait_for("document.getElementById('detail-title').textContent === 'One More'")
        names = page.evaluate(
            "[...document.querySelectorAll('#datasets tbody tr td:first-child')]"
            ".map(td => td.textContent)"
        )
        assert sorted(names) == ["One More", "Tiny Band"]
        warnings = page.evaluate("document.getElementById('detail-warnings').textContent")
        assert "Only 1 samples" in warnings
        assert page.evaluate("document.querySelectorAll('#samples tbody tr').length") == 1

        # -- fix the song's caption in the edit dialog: a bad BPM first (refused in the dialog)
        page.evaluate("document.querySelector('#samples tbody tr').click()")
        page.wait_for("document.getElementById('song-dialog').open")
        page.wait_for("document.getElementById('song-caption').value !== ''")
        page.evaluate(
            "document.getElementById('song-caption').value = 'Sunrise synth-pop, fixed by hand';"
            "document.getElementById('song-bpm').value = 'fast';"
            "document.getElementById('song-form').requestSubmit()"
        )
        page.wait_for("!document.getElementById('song-error').hidden")
        error = page.evaluate("document.getElementById('song-error').textContent")
        assert error.startswith("bpm:") and "whole number" in error, error
        assert sidecar.read_bytes() == original  # nothing written
        shots.append(page.screenshot(tmp_path / "studio-song-dialog.png"))
        page.evaluate(
            "document.getElementById('song-bpm').value = '118';"
            "document.getElementById('song-form').requestSubmit()"
        )
        page.wait_for("!document.getElementById('song-dialog').open")
        page.wait_for(
            "document.querySelector('#samples tbody tr td:nth-child(5)').textContent"
            " === 'Sunrise synth-pop, fixed by hand'"
        )
        text = sidecar.read_text()
        assert "caption: Sunrise synth-pop, fixed by hand\n" in text and "bpm: 118\n" in text
        assert (more / f"{sidecar.name}.bak").read_bytes() == original

        # -- the make form: a folder outside the allowed roots is refused with one message
        page.evaluate(
            f"document.getElementById('make-songs').value = {_js(str(tmp_path))};"
            "document.getElementById('make-form').requestSubmit()"
        )
        page.wait_for("document.getElementById('notice').textContent.startsWith('Could not start')")
        assert "outside the allowed roots" in page.evaluate(
            "document.getElementById('notice').textContent"
        )

        # -- a job started from the page: its progress appears as it runs, then done
        page.evaluate("document.querySelector('button[data-kind=\"build\"]').click()")
        page.wait_for(
            "document.getElementById('job-title').textContent.startsWith('build')", timeout_s=30
        )
        page.wait_for("document.getElementById('job-status').textContent === 'done'", timeout_s=90)
        assert page.evaluate("document.getElementById('job-progress-text').textContent") == (
            "1 / 1 build"
        )
        assert "dataset.json written" in page.evaluate(
            "document.getElementById('job-log').textContent"
        )
        page.wait_for(  # the dataset's row and facts follow the job
            "document.querySelector('#datasets tr.selected td:last-child').textContent === 'built'"
        )

        shots.append(page.screenshot(tmp_path / "studio-new-dataset.png"))
    for shot in shots:
        assert shot.stat().st_size > 20_000  # a rendered page, not a blank one
        if os.environ.get(SCREENSHOT_DIR_ENV):
            shutil.copy(shot, os.path.join(os.environ[SCREENSHOT_DIR_ENV], shot.name))
