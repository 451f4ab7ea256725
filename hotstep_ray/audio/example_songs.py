"""The bundled example songs: a fixed catalogue rendered by `synth.render_song`.

Twelve short songs (enough for the "10+ samples" recommendation) in several formats, each with a
sidecar that exercises one corner of Side-Step's format: BOM, CRLF, aliases, continuation lines,
an unknown key, the `<stem>.caption.txt`/`<stem>.lyrics.txt` pair, a lyrics-only file and no sidecar.
"""

from __future__ import annotations

from hotstep_ray.audio.io import encode_audio
from hotstep_ray.audio.synth import SongSpec, render_song
from hotstep_ray.core.storage import Storage

EXAMPLE_RATE_HZ = 48_000

# (file name, spec, sidecars {file name: exact text}); duration 5-8 s keeps CPU demos fast.
CATALOGUE: list[tuple[str, SongSpec, dict[str, str]]] = [
    (
        "01_morning_drive.flac",
        SongSpec("Morning Drive", 120, "A", "major", 6.0, 1),
        {
            "01_morning_drive.txt": (
                "caption: Bright synth-pop with punchy drums, round bass and a whistling lead\n"
                "genre: synth-pop, electronic\nbpm: 120\nkey: A major\nsignature: 4/4\n"
                "language: en\nis_instrumental: false\ncustom_tag: hsdemo\nlyrics:\n"
                "[Verse]\nWindows down on the morning road\n\n[Chorus]\nDrive, drive, drive\n"
            )
        },
    ),
    (
        "02_night_walk.wav",
        SongSpec("Night Walk", 90, "D", "minor", 6.0, 2),
        {
            "02_night_walk.txt": "\ufeffcaption: Slow minor-key groove with soft pads\r\n"
            "genre: lo-fi\r\ntempo: 90\r\nkeyscale: D minor\r\ntime_signature: 4/4\r\n"
            "is_instrumental: true\r\n"
        },
    ),
    (
        "03_sunrise.flac",
        SongSpec("Sunrise", 100, "C", "major", 5.0, 3),
        {
            "03_sunrise.txt": (
                "caption: Gentle major-key tune with a plucked melody\n"
                "and a warm bass line that carries the whole song\n"
                "genre: acoustic pop\nbpm: 100\nkey: C major\nsignature: 4/4\nlyrics:\n"
                "[Verse]\nSun comes up\ncaption: this line is a lyric, not a key\n"
            )
        },
    ),
    (
        "04_city_lights.ogg",
        SongSpec("City Lights", 128, "F", "minor", 6.0, 4),
        {
            "04_city_lights.caption.txt": "Driving house beat with a minor chord stab",
            "04_city_lights.lyrics.txt": "[Instrumental]",
        },
    ),
    ("05_untitled.flac", SongSpec("Untitled", 110, "G", "major", 5.0, 5), {}),
    (
        "06_rain_song.flac",
        SongSpec("Rain Song", 76, "E", "minor", 7.0, 6),
        {
            "06_rain_song.txt": (
                "[Verse 1]\nRain on the glass\nI hear it pass\n\n[Chorus]\nFall, fall down\n"
            )
        },
    ),
    (
        "07_waltz_for_two.flac",
        SongSpec("Waltz for Two", 96, "B", "minor", 6.0, 7, beats_per_bar=3),
        {
            "07_waltz_for_two.txt": (
                "caption: A small waltz with a bass on every beat\ngenre: waltz\nbpm: 96\n"
                "scale: B minor\nsig: 3/4\nmood: tender\nrepeat: 2\nlyrics:\n"
            )
        },
    ),
    (
        "08_highway.mp3",
        SongSpec("Highway", 140, "E", "major", 5.0, 8),
        {
            "08_highway.txt": (
                "caption: Fast rock-pop shuffle with bright chords\ngenre: pop rock\n"
                "bpm: 140\nkey: E major\nsignature: 4/4\nprompt_override: genre\nlyrics:\n"
                "[Chorus]\nHighway, take me home\n"
            )
        },
    ),
    (
        "09_slow_burn.flac",
        SongSpec("Slow Burn", 70, "G", "minor", 7.0, 9),
        {
            "09_slow_burn.txt": (
                "caption: Slow soul ballad with a deep bass and a thin lead\ngenre: soul\n"
                "bpm: 70\nkey: G minor\nsignature: 4/4\nlang: en\nis_instrumental: yes\n"
            )
        },
    ),
    (
        "10_pocket.wav",
        SongSpec("Pocket", 105, "D", "major", 5.0, 10),
        {
            "10_pocket.txt": (
                "caption: Funky pocket groove, tight hats and a busy bass\ngenre: funk\n"
                "bpm: 105\nkey: D major\nsignature: 4/4\ntrigger: hsdemo\nlyrics:\n"
                "[Verse]\nStay in the pocket\n"
            )
        },
    ),
    (
        "11_last_call.flac",
        SongSpec("Last Call", 84, "C", "minor", 6.0, 11),
        {"11_last_call.txt": "caption: Late-night minor jazz-hop loop\ngenre: jazz hop\nbpm: 84\n"},
    ),
    (
        "12_open_road.flac",
        SongSpec("Open Road", 115, "A", "minor", 6.0, 12),
        {
            "12_open_road.txt": (
                "caption: Mid-tempo indie rock in A minor with steady drums\n"
                "genre: indie rock\nbpm: 115\nkey: A minor\nsignature: 4/4\nlyrics:\n"
                "[Verse]\nOpen road ahead\n\n[Chorus]\nKeep on going\n"
            )
        },
    ),
]


def write_example_songs(target: Storage, overwrite: bool = False) -> list[str]:
    """Render the catalogue into `target` (audio + sidecars); returns the audio keys.
    Existing files are kept unless `overwrite`, so a user's edits to a sidecar survive reruns."""
    keys = []
    for filename, spec, sidecars in CATALOGUE:
        if overwrite or not target.exists(filename):
            fmt = {"flac": "FLAC", "wav": "WAV", "ogg": "OGG", "mp3": "MP3"}[
                filename.rsplit(".")[-1]
            ]
            audio = render_song(spec, EXAMPLE_RATE_HZ)
            target.write_bytes(filename, encode_audio(audio, EXAMPLE_RATE_HZ, fmt))
        for sidecar_name, text in sidecars.items():
            if overwrite or not target.exists(sidecar_name):
                target.write_bytes(sidecar_name, text.encode("utf-8"))
        keys.append(filename)
    return keys
