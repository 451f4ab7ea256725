"""Render the bundled example songs (drums, bass, chords, melody at a known tempo and key).

    python examples/make_songs.py OUT_DIR [--overwrite]

Deterministic: the same catalogue gives the same audio every time. Each song comes with a sidecar
that exercises one corner of Side-Step's format. `hotstep-ray demo` renders the same songs into
`<data>/examples/songs/` by itself; this script is for using them elsewhere.
"""

from __future__ import annotations

import argparse

from hotstep_ray.audio.example_songs import CATALOGUE, write_example_songs
from hotstep_ray.core.storage import Storage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="folder (or s3:// URL) to write the songs into")
    parser.add_argument("--overwrite", action="store_true", help="replace existing files")
    args = parser.parse_args()
    keys = write_example_songs(Storage(args.out_dir), overwrite=args.overwrite)
    for key, (_, spec, _) in zip(keys, CATALOGUE, strict=True):
        print(f"{key}\t{spec.bpm} BPM\t{spec.key}\t{spec.duration_s:.0f} s")


if __name__ == "__main__":
    main()
