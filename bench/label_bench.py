"""Labeling benchmark: Essentia analysis cost per audio-second, and throughput over 1..N actors.

    python bench/label_bench.py --songs 8 --seconds 240 --actors 1,2 [--out label_bench.json]

Renders deterministic songs (hotstep_ray.audio.synth) as 48 kHz stereo FLAC, then
1. analyses each in this process and reports audio-seconds analysed per CPU-second
   (`time.process_time`, so other load on the machine does not inflate it) and per wall-second;
2. analyses the whole list through the labeling stage's Ray actor pool (`ActorPoolMap`) with
   1, 2, ... actors and reports wall-clock throughput (audio-s per wall-s) and the speed-up.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time

from hotstep_ray.audio.example_songs import EXAMPLE_RATE_HZ
from hotstep_ray.audio.io import encode_audio
from hotstep_ray.audio.synth import NOTE_NAMES, SongSpec, render_song
from hotstep_ray.core.storage import Storage
from hotstep_ray.labeling.analysis import EssentiaAnalyzer


class _Analyse:
    """Picklable per-song work: decode + analyse one file of a local folder."""

    def __init__(self, root: str) -> None:
        self.root = root

    def __call__(self, key: str) -> float:
        storage = Storage(self.root)
        features, _ = EssentiaAnalyzer().analyze(storage, key)
        return float(features.bpm or 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--songs", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=240.0)
    parser.add_argument("--actors", default="1,2")
    parser.add_argument("--out", default="")
    args = parser.parse_args()

    root = tempfile.mkdtemp(prefix="label-bench-")
    storage = Storage(root)
    keys = []
    for i in range(args.songs):
        spec = SongSpec(f"s{i}", 80 + 7 * i, NOTE_NAMES[i % 12], "major", args.seconds, i)
        audio = render_song(spec, EXAMPLE_RATE_HZ)
        keys.append(f"song_{i:02d}.flac")
        storage.write_bytes(keys[-1], encode_audio(audio, EXAMPLE_RATE_HZ, "FLAC"))
    audio_s = args.songs * args.seconds
    work = _Analyse(root)

    cpu0, wall0 = time.process_time(), time.perf_counter()
    for key in keys:
        work(key)
    cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
    result: dict = {
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}",
        "songs": args.songs,
        "seconds_per_song": args.seconds,
        "in_process": {
            "cpu_s_per_song": round(cpu_s / args.songs, 3),
            "audio_s_per_cpu_s": round(audio_s / cpu_s, 1),
            "audio_s_per_wall_s": round(audio_s / wall_s, 1),
        },
        "actors": [],
    }

    from hotstep_ray.distributed.runtime import ensure_ray
    from hotstep_ray.labeling.ray_pool import ActorPoolMap

    ray = ensure_ray()
    result["ray_cpus"] = int(ray.cluster_resources().get("CPU", 0))
    base = None
    for n in [int(x) for x in args.actors.split(",")]:
        pool = ActorPoolMap("analysis", n, num_cpus=1.0, spread=True)
        list(pool(work, keys[:n]))  # start and warm the actors (imports) outside the timing
        t0 = time.perf_counter()
        list(pool(work, keys))
        wall = time.perf_counter() - t0
        pool.shutdown()
        rate = audio_s / wall
        base = base or rate
        result["actors"].append(
            {
                "actors": n,
                "wall_s": round(wall, 2),
                "audio_s_per_wall_s": round(rate, 1),
                "speedup": round(rate / base, 2),
            }
        )
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            handle.write(text + "\n")


if __name__ == "__main__":
    main()
