"""CPU cost of preprocessing's decode task per song, on one thread (a decode task holds one CPU).

Two measurements, each the best of `--repeat` wall-clock runs after one warm-up:
- resampling one stereo song at each `--rates` to 48 kHz with the one resampler
  (`hotstep_ray.audio.resample`, libsoxr), through the torch wrapper preprocessing's callers use;
- the whole decode task (`preprocess.audio_prep.prepare_audio`: probe, codec, stereo, resample,
  cut, peak normalisation) of one 44.1 kHz song per container, written here as a 220 Hz tone
  plus noise (`audio.io.encode_audio`, in 1 s blocks: one long Vorbis write crashes
  libsndfile's encoder).

    python3 bench/decode_bench.py --seconds 240 --out decode_bench.json
    python3 bench/decode_bench.py --seconds 30 --rates 8000,16000,24000,32000,44100,96000 \\
        --no-decode-task
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, no install

from hotstep_ray.audio.io import encode_audio  # noqa: E402
from hotstep_ray.core.storage import Storage  # noqa: E402
from hotstep_ray.preprocess import resample as resampling  # noqa: E402
from hotstep_ray.preprocess.audio_prep import prepare_audio  # noqa: E402

RATE = 44100  # the decode task's songs
NEW_RATE = 48000
FORMATS = {".wav": "WAV", ".flac": "FLAC", ".mp3": "MP3", ".ogg": "OGG"}


def best_s(fn: Callable[[], object], repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return round(min(times), 3)


def write_song(storage: Storage, key: str, seconds: float) -> None:
    """A stereo 220 Hz tone plus noise at `RATE`, in the container `key`'s suffix names."""
    rng = np.random.default_rng(0)
    t = np.arange(int(seconds * RATE)) / RATE
    tone = 0.3 * np.sin(2 * np.pi * 220 * t)  # [T]
    audio = tone + 0.05 * rng.standard_normal((2, len(t)))  # [2, T] planar
    storage.write_bytes(key, encode_audio(audio, RATE, FORMATS[Path(key).suffix]))


def resample_times(rate: int, seconds: float, repeat: int) -> dict:
    """Seconds to resample `seconds` of stereo noise at `rate` to 48 kHz."""
    audio = 0.1 * torch.randn(2, int(seconds * rate), generator=torch.Generator().manual_seed(0))
    return {"soxr": best_s(lambda: resampling.resample(audio, rate, NEW_RATE), repeat)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=240.0, help="length of the song")
    parser.add_argument("--rates", default=str(RATE), help="comma list of source rates, Hz")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-decode-task", action="store_true", help="time the resampling only")
    parser.add_argument("--out", type=Path, default=Path("decode_bench.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    report: dict = {"seconds": args.seconds, "threads": 1, "resample_s": {}, "decode_task_s": {}}
    for rate in (int(r) for r in args.rates.split(",")):
        report["resample_s"][str(rate)] = resample_times(rate, args.seconds, args.repeat)
    if not args.no_decode_task:
        with tempfile.TemporaryDirectory() as folder:
            storage = Storage(folder)
            for suffix in FORMATS:
                write_song(storage, f"song{suffix}", args.seconds)
                report["decode_task_s"][suffix] = best_s(
                    lambda s=suffix: prepare_audio(storage, f"song{s}"), args.repeat
                )
    print(json.dumps(report, indent=1))
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
