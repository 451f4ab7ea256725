"""Labeling benchmark: Essentia analysis cost per audio-second, and throughput over 1..N actors.

    python bench/label_bench.py --seconds 120 --actors 1,2,4,8,16 --time-budget-s 250 \
        --out label_bench.json

Renders `--distinct` deterministic songs (hotstep_ray.audio.synth) as 48 kHz stereo FLAC in
parallel processes, then
1. analyses `--in-process-songs` of them in this process and reports audio-seconds analysed per
   CPU-second (`time.process_time`, so other load on the machine does not inflate it) and per
   wall-second;
2. starts a local Ray with every CPU of the machine and no dashboard, writes a list of `--songs`
   files cycling over the renders (same bytes, each one a full decode + analysis; `--songs 0`
   sizes the list from the in-process cost so that every pass fits in the time budget);
3. analyses the whole list through the labeling stage's Ray actor pool (`ActorPoolMap`) with
   1, 2, ... actors (counts above the machine's CPUs are skipped) and reports wall-clock throughput
   (audio-s per wall-s), the speed-up over the first count, and the efficiency (speed-up / actors).

The JSON result is printed at the end and rewritten to `--out` after every step, so a run cut short
still leaves what it measured (`"complete": false`); an actor count whose estimated time would
overrun `--time-budget-s` is skipped and marked so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

_REPO = str(Path(__file__).resolve().parents[1])
if _REPO not in sys.path:  # run as `python bench/label_bench.py` without the package installed
    sys.path.insert(0, _REPO)
    # Ray's worker processes inherit the environment: let them import hotstep_ray too.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (_REPO, os.environ.get("PYTHONPATH", "")) if p
    )

from hotstep_ray.audio.example_songs import EXAMPLE_RATE_HZ  # noqa: E402
from hotstep_ray.audio.io import encode_audio  # noqa: E402
from hotstep_ray.audio.synth import NOTE_NAMES, SongSpec, render_song  # noqa: E402
from hotstep_ray.core.storage import Storage  # noqa: E402
from hotstep_ray.labeling.analysis import EssentiaAnalyzer  # noqa: E402


class _Analyse:
    """Picklable per-song work: decode + analyse one file of a local folder."""

    def __init__(self, root: str) -> None:
        self.root = root

    def __call__(self, key: str) -> float:
        storage = Storage(self.root)
        features, _ = EssentiaAnalyzer().analyze(storage, key)
        return float(features.bpm or 0)


def _render(index: int, seconds: float) -> bytes:
    """FLAC bytes of the index-th distinct song (tempo and key vary with the index)."""
    mode = "major" if index % 2 == 0 else "minor"
    spec = SongSpec(
        f"s{index}", 80 + 7 * (index % 12), NOTE_NAMES[index % 12], mode, seconds, index
    )
    return encode_audio(render_song(spec, EXAMPLE_RATE_HZ), EXAMPLE_RATE_HZ, "FLAC")


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in ("ray", "essentia", "numpy", "soundfile"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "?"
    return out


class _Report:
    """The result dict, printed and rewritten (atomically) to `path` after every step."""

    def __init__(self, path: str, data: dict) -> None:
        self.path, self.data = path, data

    def save(self, final: bool = False) -> None:
        self.data["complete"] = final
        self.data["actors"] = self.data.pop("actors")  # keep the table last, after the scalars
        text = json.dumps(self.data, indent=2)
        if self.path:
            tmp = f"{self.path}.tmp"
            with open(tmp, "w", encoding="utf-8") as handle:
                handle.write(text + "\n")
            os.replace(tmp, self.path)
        if final:
            print(text, flush=True)


def _log(t_start: float, message: str) -> None:
    print(f"[{time.perf_counter() - t_start:6.1f}s] {message}", file=sys.stderr, flush=True)


def _auto_songs(budget_left_s: float, per_song_s: float, counts: list[int], cap: int) -> int:
    """The longest list whose passes (1/n of it per count n, with a 25 % margin) fit in the budget,
    a multiple of the largest count so every actor gets the same number of songs."""
    step = max(counts)
    fit = budget_left_s / (1.25 * per_song_s * sum(1.0 / n for n in counts))
    return max(2 * step, min(cap, int(fit)) // step * step)


def main() -> None:
    t_start = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--songs",
        type=int,
        default=0,
        help="files analysed per actor count (0: as many as the time budget allows, "
        "a multiple of the largest actor count, at most --max-songs)",
    )
    parser.add_argument("--max-songs", type=int, default=128)
    parser.add_argument("--seconds", type=float, default=120.0, help="length of each song")
    parser.add_argument(
        "--distinct", type=int, default=0, help="different renders (0: one per CPU, at most 16)"
    )
    parser.add_argument("--in-process-songs", type=int, default=8)
    parser.add_argument("--actors", default="1,2,4,8,16")
    parser.add_argument("--time-budget-s", type=float, default=270.0)
    parser.add_argument("--out", default="")
    args = parser.parse_args()

    cpus = _cpu_count()
    counts = [int(x) for x in args.actors.split(",") if x.strip()]
    distinct = max(1, args.distinct or min(cpus, 16))
    if args.songs:
        distinct = min(distinct, args.songs)
    report = _Report(
        args.out,
        {
            "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}",
            "cpus": cpus,
            "versions": _versions(),
            "distinct_songs": distinct,
            "seconds_per_song": args.seconds,
            "time_budget_s": args.time_budget_s,
            "actors": [],
        },
    )
    result = report.data

    def elapsed() -> float:
        return time.perf_counter() - t_start

    # 1. Render `distinct` songs in parallel processes.
    root = tempfile.mkdtemp(prefix="label-bench-")
    storage = Storage(root)
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=min(cpus, distinct)) as executor:
        renders = list(executor.map(_render, range(distinct), [args.seconds] * distinct))
    for i, data in enumerate(renders):
        storage.write_bytes(f"distinct_{i:03d}.flac", data)
    result["render_wall_s"] = round(time.perf_counter() - t0, 2)
    report.save()
    _log(t_start, f"rendered {distinct} songs of {args.seconds:g} s in {root}")

    # 2. In-process cost per song (the first call also pays Essentia's import: warm it up).
    work = _Analyse(root)
    work("distinct_000.flac")
    n_in = max(1, args.in_process_songs)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for i in range(n_in):
        work(f"distinct_{i % distinct:03d}.flac")
    cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
    audio_in = n_in * args.seconds
    result["in_process"] = {
        "songs": n_in,
        "cpu_s_per_song": round(cpu_s / n_in, 3),
        "wall_s_per_song": round(wall_s / n_in, 3),
        "audio_s_per_cpu_s": round(audio_in / cpu_s, 1),
        "audio_s_per_wall_s": round(audio_in / wall_s, 1),
        "cpu_s_per_4min_song": round(cpu_s / n_in * 240.0 / args.seconds, 3),
    }
    report.save()
    _log(t_start, f"in process: {result['in_process']}")

    # 3. A local Ray with every CPU of the machine and no dashboard.
    from hotstep_ray.distributed.runtime import ensure_ray, shutdown_ray
    from hotstep_ray.labeling.ray_pool import ActorPoolMap

    t0 = time.perf_counter()
    ray = ensure_ray(num_cpus=cpus)  # address="local", include_dashboard=False
    result["ray_start_s"] = round(time.perf_counter() - t0, 2)
    result["ray_cpus"] = ray_cpus = int(ray.cluster_resources().get("CPU", 0))
    _log(t_start, f"ray up with {ray_cpus} CPUs")

    # 4. The list of songs: the files cycle over the distinct renders (same bytes, full analysis).
    per_song = wall_s / n_in  # wall seconds per song on one core, for the budget estimates
    runnable = [n for n in counts if n <= ray_cpus] or [1]
    warmups = sum(5.0 + 2.0 * per_song for _ in runnable)
    songs = args.songs or _auto_songs(
        args.time_budget_s - elapsed() - warmups, per_song, runnable, args.max_songs
    )
    keys = [f"song_{i:03d}.flac" for i in range(songs)]
    for i, key in enumerate(keys):
        storage.write_bytes(key, renders[i % distinct])
    audio_s = songs * args.seconds
    result.update({"songs": songs, "audio_s_per_pass": audio_s})
    report.save()
    _log(t_start, f"{songs} songs of {args.seconds:g} s per pass")

    # 5. The actor pool with 1..N actors.
    base, base_n = None, 1
    for n in counts:
        row: dict = {"actors": n}
        result["actors"].append(row)
        if n > ray_cpus:
            row["skipped"] = f"more actors than the {ray_cpus} CPUs of this machine"
            report.save()
            continue
        # Startup + warm-up (~one song per actor) + the pass, with a margin for a slow machine.
        estimate = 5.0 + 1.5 * per_song * (1 + songs / n)
        if elapsed() + estimate > args.time_budget_s:
            row["skipped"] = f"time budget: ~{estimate:.0f} s needed, {elapsed():.0f} s used"
            report.save()
            _log(t_start, f"{n} actors: skipped ({row['skipped']})")
            continue
        pool = ActorPoolMap("analysis", n, num_cpus=1.0, spread=True)
        t0 = time.perf_counter()
        list(pool(work, keys[:n]))  # start and warm the actors (imports) outside the timing
        row["warmup_s"] = round(time.perf_counter() - t0, 2)
        t0 = time.perf_counter()
        list(pool(work, keys))
        wall = time.perf_counter() - t0
        pool.shutdown()
        rate = audio_s / wall
        if base is None:
            base, base_n = rate, n
        speedup = rate / base
        row.update(
            {
                "wall_s": round(wall, 2),
                "songs_per_actor": round(songs / n, 1),
                "audio_s_per_wall_s": round(rate, 1),
                "speedup": round(speedup, 2),
                "efficiency": round(speedup * base_n / n, 2),
            }
        )
        per_song = max(per_song, wall * n / songs)
        report.save()
        _log(t_start, f"{n} actors: {row}")

    result["total_wall_s"] = round(elapsed(), 1)
    report.save(final=True)
    shutdown_ray()
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
