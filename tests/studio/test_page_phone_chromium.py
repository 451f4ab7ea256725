"""The studio page in headless Chromium at an iPhone-sized viewport (390×844 CSS px, 3 device px
per CSS px), against the server that ran the whole pipeline: the page body never scrolls
sideways (wide tables scroll inside their own box), the forms' buttons span the form, and each
side of an A/B draws its waveform under its player: the audition preview's two sides in the
Previews section, and a same-seed A/B preview (base/adapter, written to the preview store as
`run_ab` writes one, the adapter side half as loud) shown as the "Make an adapter" A/B by the
page's own `showMakeAb`, fed the preview id a make job's result carries (a real make run is the
pipeline tests' work). The canvases are read back: drawn pixels on each, and the quieter side
drawn half as tall (one vertical scale for both sides); a side that cannot be decoded keeps its
player and shows no picture; a seek draws the playback position."""

from __future__ import annotations

import dataclasses
import io
import math
import os
import shutil
import struct
import uuid
import wave as wav_file
from pathlib import Path

import pytest
from cdp import Chromium
from test_page_chromium import SCREENSHOT_DIR_ENV, _click_row, _js
from test_page_chromium import chromium as chromium  # the fixture: chromium or a skip

from hotstep_ray.audition.ab import PreviewStore
from hotstep_ray.audition.codes import DecodeResult
from hotstep_ray.core.storage import Storage

pytestmark = [pytest.mark.ray, pytest.mark.slow]
PHONE = {"width": 390, "height": 844, "deviceScaleFactor": 3, "mobile": True}

# Elements wider than the window, outside a box that scrolls them: why the body would scroll.
OVERFLOW = """(() => {
  const width = window.innerWidth;
  const inScroll = (node) => !!node.closest('.scroll');
  return [...document.querySelectorAll('body *')]
    .filter((node) => node.offsetParent && !inScroll(node) && node.getBoundingClientRect().right > width + 0.5)
    .map((node) => `${node.tagName.toLowerCase()}#${node.id}.${node.className}`
      + ` right=${node.getBoundingClientRect().right.toFixed(0)}`).slice(0, 12);
})()"""

# Per canvas of `selector`: its slot, label, drawn pixels (alpha > 0) and rows they span.
WAVES = """((selector) => [...document.querySelectorAll(selector)].map((canvas) => {
  const pixels = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
  let drawn = 0;
  const rows = new Set();
  for (let i = 3; i < pixels.length; i += 4) {
    if (pixels[i] > 0) { drawn += 1; rows.add(Math.floor((i - 3) / 4 / canvas.width)); }
  }
  return { slot: canvas.dataset.slot, role: canvas.getAttribute('role'),
           label: canvas.getAttribute('aria-label'), width: canvas.width, height: canvas.height,
           drawn, rows: rows.size };
}))"""


def _tone(amplitude: float, seconds: float = 2.0, rate_hz: int = 48000) -> DecodeResult:
    """A stereo 16-bit WAV of a 220 Hz tone under a rising-then-falling envelope."""
    count = int(seconds * rate_hz)
    frames = io.BytesIO()
    for i in range(count):
        envelope = math.sin(math.pi * i / count)
        value = round(32767 * amplitude * envelope * math.sin(2 * math.pi * 220 * i / rate_hz))
        frames.write(struct.pack("<hh", value, value))
    data = io.BytesIO()
    with wav_file.open(data, "wb") as out:
        out.setnchannels(2)
        out.setsampwidth(2)
        out.setframerate(rate_hz)
        out.writeframes(frames.getvalue())
    return DecodeResult(data.getvalue(), "wav", rate_hz, 2, count, seconds, 0, "", 0.0)


def _write_ab_preview(data_root: Path, adapter: DecodeResult) -> str:
    """A base/adapter preview in the studio's store, as `run_ab` leaves one; its id."""
    preview_id = uuid.uuid4().hex
    sides = {"base": _tone(0.8), "adapter": adapter}
    meta = {"previewId": preview_id, "caption": "tiny band", "seed": 7, "sides": []}
    PreviewStore(Storage(data_root)).write(preview_id, meta, sides)
    return preview_id


def _no_sideways_scroll(page: Chromium, where: str) -> None:
    widths = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert widths[0] <= widths[1], (where, widths, page.evaluate(OVERFLOW))


def _waves(page: Chromium, selector: str) -> list[dict]:
    page.wait_for(
        f"(() => {{ const c = [...document.querySelectorAll({_js(selector)})];"
        " return c.length === 2 && c.every(x => x.dataset.drawn); })()"
    )
    return page.evaluate(f"{WAVES}({_js(selector)})")


def _assert_drawn(waves: list[dict], slots: list[str]) -> None:
    assert [w["slot"] for w in waves] == slots, waves
    for wave in waves:
        assert wave["role"] == "img", wave
        assert wave["label"].startswith(f"waveform of the {wave['slot']} side, peak "), wave
        assert wave["width"] >= 300 * 3 - 60, wave  # the canvas spans the phone's column
        # pixels in most columns, over more than the silent centre line
        assert wave["drawn"] >= wave["width"] and wave["rows"] > 3 * 3, wave


def test_the_page_fits_a_phone_and_draws_waveforms(chromium, studio_pipeline, tmp_path):
    pipeline = studio_pipeline
    with Chromium(chromium, tmp_path / "profile") as page:
        page.send("Emulation.setDeviceMetricsOverride", **PHONE)
        page.navigate(pipeline.url + "/")
        page.wait_for("document.body.dataset.ready")
        assert page.evaluate("window.innerWidth") == PHONE["width"]
        _no_sideways_scroll(page, "before the token")
        page.evaluate(
            f"document.getElementById('token').value = {_js(pipeline.token)};"
            "document.getElementById('token-form').requestSubmit()"
        )
        page.wait_for("document.getElementById('health').textContent === 'connected'")
        page.wait_for("document.querySelectorAll('#adapters tbody tr').length === 1")
        _click_row(page, "datasets", "data-slug", pipeline.dataset["slug"])

        # -- the audition preview: a waveform under each side's player, on one scale
        _assert_drawn(_waves(page, "#previews canvas.wave"), ["base-render", "adapter-render"])
        assert (
            page.evaluate("document.querySelectorAll('#previews audio[data-loaded]').length") == 2
        )

        # -- the same preview as the make form's A/B: sides stacked, each with its waveform
        page.evaluate(
            "document.getElementById('make-view').hidden = false;"
            "document.getElementById('make-result').hidden = false;"
        )
        show = "showMakeAb({{ preview_id: {}, caption: 'tiny band', seed: 7 }})"
        # a side the browser cannot decode keeps its player and draws no picture
        broken = dataclasses.replace(_tone(0.4), audio=b"RIFF, but not audio")
        page.evaluate(show.format(_js(_write_ab_preview(pipeline.root / "data", broken))))
        page.wait_for(
            "document.querySelector('#make-ab canvas.wave[data-slot=base]')?.dataset.drawn"
            " && !document.querySelector('#make-ab canvas.wave[data-slot=adapter]')"
        )
        assert page.evaluate(
            "!!document.querySelector('#make-ab audio[data-slot=adapter][data-loaded]')"
        )
        page.evaluate(show.format(_js(_write_ab_preview(pipeline.root / "data", _tone(0.4)))))
        base_wave, adapter_wave = _waves(page, "#make-ab canvas.wave")
        _assert_drawn([base_wave, adapter_wave], ["base", "adapter"])
        # one scale for both sides: the base fills the height, the half-as-loud adapter half of it
        assert base_wave["rows"] >= 0.9 * base_wave["height"], base_wave
        assert 0.4 < adapter_wave["rows"] / base_wave["rows"] < 0.6, (base_wave, adapter_wave)
        base, adapter = page.evaluate(
            "[...document.querySelectorAll('#make-ab .ab-side')]"
            ".map(s => { const r = s.getBoundingClientRect(); return [r.left, r.top]; })"
        )
        assert base[0] == adapter[0] and adapter[1] > base[1], (base, adapter)  # stacked

        # -- the playback position: a seek redraws the picture with its line
        page.evaluate(
            "(() => { const a = document.querySelector('#make-ab audio[data-slot=adapter]');"
            " a.currentTime = a.duration / 2; })()"
        )
        line = page.wait_for(  # [r, g, b, a] at the top of the half-way column, once drawn
            "(() => { const a = document.querySelector('#make-ab audio[data-slot=adapter]');"
            " const c = document.querySelector('#make-ab canvas.wave[data-slot=adapter]');"
            " if (!(a.currentTime > 0)) return null;"
            " const x = Math.round((a.currentTime / a.duration) * (c.width - 3));"
            " const pixel = [...c.getContext('2d').getImageData(x + 1, 1, 1, 1).data];"
            " return pixel[3] > 0 && pixel; })()"
        )
        assert line[3] == 255 and line[2] < 100, line  # the ink line, not the blue waveform

        # -- a job open with its loss chart: the whole studio on the screen at once
        _click_row(page, "jobs", "data-job", pipeline.runs["train-dit"].job_id)
        page.wait_for("document.getElementById('job-status').textContent === 'done'")
        page.wait_for("!document.getElementById('loss-figure').hidden")
        _no_sideways_scroll(page, "everything shown")
        widths = page.evaluate(
            "['make-form', 'make-start', 'create-form'].map("
            "id => document.getElementById(id).getBoundingClientRect().width)"
        )
        assert widths[1] == pytest.approx(widths[0], abs=1), widths  # the button spans its form
        assert widths[2] >= PHONE["width"] - 60, widths

        shot = page.screenshot(tmp_path / "studio-phone.png")
    assert shot.stat().st_size > 20_000  # a rendered page, not a blank one
    if os.environ.get(SCREENSHOT_DIR_ENV):
        shutil.copy(shot, os.path.join(os.environ[SCREENSHOT_DIR_ENV], shot.name))
