"""CPU cost of preprocessing's decode task per song, on one thread (a decode task holds one CPU).

Two measurements, each the best of `--repeat` wall-clock runs after one warm-up:
- resampling one stereo 44.1 kHz song to 48 kHz: the whole filter bank as one strided conv1d
  (every tap, the design before phase groups) against `preprocess.resample` at each
  `PHASE_GROUPS` value of `--groups`;
- the whole decode task (`preprocess.audio_prep.prepare_audio`: probe, codec, stereo, resample,
  cut, peak normalisation) of one song per container, written here as a 220 Hz tone plus noise
  (in 1 s blocks: one long Vorbis write crashes libsndfile's encoder).

    python3 bench/decode_bench.py --seconds 240 --out decode_bench.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, no install

from hotstep_ray.core.storage import Storage  # noqa: E402
from hotstep_ray.preprocess import resample as resampling  # noqa: E402
from hotstep_ray.preprocess.audio_prep import prepare_audio  # noqa: E402

RATE = 44100
FORMATS = {".wav": "WAV", ".flac": "FLAC", ".mp3": "MP3", ".ogg": "OGG"}


def best_s(fn: Callable[[], object], repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return round(min(times), 3)


def whole_bank(audio: torch.Tensor, orig: int, new: int) -> torch.Tensor:
    """The filter bank as one strided conv1d over all its taps (zeros included)."""
    gcd = math.gcd(orig, new)
    up, down = new // gcd, orig // gcd
    bank, half = resampling._filter_bank(
        up, down, resampling.ZERO_CROSSINGS, resampling.ROLLOFF, resampling.KAISER_BETA
    )
    out_length = math.ceil(audio.shape[1] * up / down)
    periods = math.ceil(out_length / up)
    right = max(0, (periods - 1) * down + bank.shape[-1] - half - audio.shape[1])
    padded = torch.nn.functional.pad(audio.unsqueeze(1), (half, right))
    phases = torch.nn.functional.conv1d(padded, bank.float().unsqueeze(1), stride=down)[
        ..., :periods
    ]
    return phases.transpose(1, 2).reshape(audio.shape[0], -1)[:, :out_length]


def write_song(path: Path, seconds: float) -> None:
    rng = np.random.default_rng(0)
    frames = int(seconds * RATE)
    with sf.SoundFile(path, "w", RATE, 2, format=FORMATS[path.suffix]) as handle:
        for start in range(0, frames, RATE):
            t = np.arange(start, min(frames, start + RATE)) / RATE
            tone = 0.3 * np.sin(2 * np.pi * 220 * t)[:, None]
            handle.write((tone + 0.05 * rng.standard_normal((len(t), 2))).astype(np.float32))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=240.0, help="length of the song")
    parser.add_argument("--groups", default="1,4,8,16", help="comma list of PHASE_GROUPS")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("decode_bench.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    audio = 0.1 * torch.randn(
        2, int(args.seconds * RATE), generator=torch.Generator().manual_seed(0)
    )
    report: dict = {"seconds": args.seconds, "threads": 1, "resample_s": {}, "decode_task_s": {}}
    report["resample_s"]["conv1d_whole_bank"] = best_s(
        lambda: whole_bank(audio, RATE, 48000), args.repeat
    )
    default = resampling.PHASE_GROUPS
    try:
        for groups in (int(g) for g in args.groups.split(",")):
            resampling.PHASE_GROUPS = groups
            resampling._phase_groups.cache_clear()
            report["resample_s"][f"groups_{groups}"] = best_s(
                lambda: resampling.resample(audio, RATE, 48000), args.repeat
            )
    finally:
        resampling.PHASE_GROUPS = default
        resampling._phase_groups.cache_clear()
    with tempfile.TemporaryDirectory() as folder:
        storage = Storage(folder)
        for suffix in FORMATS:
            write_song(Path(folder) / f"song{suffix}", args.seconds)
            report["decode_task_s"][suffix] = best_s(
                lambda s=suffix: prepare_audio(storage, f"song{s}"), args.repeat
            )
    print(json.dumps(report, indent=1))
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
