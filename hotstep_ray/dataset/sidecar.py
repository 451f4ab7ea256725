"""Side-Step sidecars (`<stem>.txt`): parse, load by convention, normalise, write.

Reading matches Side-Step byte for byte (`parse_txt_metadata`, `load_sidecar_metadata`,
`normalize_sidecar`; pinned by `tests/fixtures/sidestep/sidecars.json`):

- bytes are decoded as `utf-8-sig` with `errors="replace"`; the text is stripped and split with
  `str.splitlines()` (CRLF, lone CR, form feed and U+2028 all end a line);
- a line starts a field when, left-stripped, it has a `:`, does not start with `[`, and the
  lower-cased text before the first `:` is a known key; aliases become canonical names;
- other lines continue the current field (right-stripped, joined with `\\n`, the value stripped),
  so an unknown `mood: happy` line folds into the previous value; lines before the first key are
  dropped; a repeated key overwrites; everything after `lyrics:` is lyrics.

The writer produces Side-Step's canonical layout (six fixed lines even when empty, then the other
non-empty keys sorted, then `lyrics:` last, `\\n` joins, one trailing `\\n`, UTF-8), keeps the
previous file as `<stem>.txt.bak` and replaces the file atomically through `Storage`.

Deliberate differences from Side-Step's writer (each asserted in tests/dataset/test_sidecar_io.py):

1. `None` is written as an empty value. Side-Step writes the literal text `None`, which reads back
   as the caption/genre "None".
2. A key the parser does not know (e.g. `alpha`, `zeta`) with a non-empty value is refused with an
   `InputError` instead of written. Side-Step writes it, and its own parser then folds the line into
   the previous field (`is_instrumental` reads back as `"alpha: a"`), silently corrupting one field
   and losing the other. Refusing keeps every user field intact; the caller must store such data
   elsewhere (the label store). `audio_codes` is dropped silently: it never enters a sidecar.
3. A value (other than lyrics) with a later line that would read back as a key line
   (`"line1\\nbpm: 5"`) is refused for the same reason.
4. Alias keys (`keyscale`, `tempo`, ...) are written under their canonical name; when both are
   given, the canonical key wins.
5. Writing bytes identical to the current file is skipped, so `.bak` keeps the last real change.

Choices where Side-Step's behaviour is not pinned by the fixtures (picked so that files written by
either writer, which always emit `caption:` and `is_instrumental:` lines, read back sensibly):

- an empty caption beside other fields is written as the file-name caption (Side-Step's own
  default), because Side-Step reads a `caption:` line without a value as "the whole file is
  lyrics" and would drop them;
- an empty `is_instrumental:` value counts as absent (instrumental is then inferred from lyrics);
- the split convention applies when `<stem>.caption.txt` or `<stem>.lyrics.txt` exists;
- a bpm of zero or below reads as unknown (`None`).
"""

from __future__ import annotations

import ast
import json
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from hotstep_ray.core.errors import InputError, StorageError
from hotstep_ray.core.storage import Storage

CANONICAL_KEYS: frozenset[str] = frozenset(
    {
        "caption",
        "genre",
        "bpm",
        "key",
        "signature",
        "lyrics",
        "tags",
        "custom_tag",
        "trigger",
        "is_instrumental",
        "repeat",
        "prompt_override",
        "duration",
        "language",
    }
)
ALIASES: dict[str, str] = {
    "keyscale": "key",
    "scale": "key",
    "timesignature": "signature",
    "time_signature": "signature",
    "sig": "signature",
    "lang": "language",
    "tempo": "bpm",
    "repeats": "repeat",
}
KNOWN_KEYS: frozenset[str] = CANONICAL_KEYS | frozenset(ALIASES)
# Written first, in this order, even when empty.
FIXED_KEYS: tuple[str, ...] = ("caption", "genre", "bpm", "key", "signature", "is_instrumental")
# Studio-private data that must never be written into a sidecar.
NEVER_WRITTEN: frozenset[str] = frozenset({"audio_codes"})
INSTRUMENTAL_LYRICS = "[Instrumental]"
_TRUE_WORDS = frozenset({"true", "1", "yes"})

Convention = Literal["txt", "split", "lyrics_only", "none"]


# -- parsing -------------------------------------------------------------------------------------
def key_of_line(line: str) -> str | None:
    """The canonical key a line starts, or None when it is a continuation line."""
    stripped = line.lstrip()
    if ":" not in stripped or stripped.startswith("["):
        return None
    name = stripped.split(":", 1)[0].strip().lower()
    if name not in KNOWN_KEYS:
        return None
    return ALIASES.get(name, name)


def decode_sidecar(data: bytes) -> str:
    """Side-Step's decoding: a BOM is dropped and invalid bytes become U+FFFD."""
    return data.decode("utf-8-sig", errors="replace")


def parse_sidecar_text(text: str) -> dict[str, str]:
    """`parse_txt_metadata` on decoded text: canonical key -> stripped value."""
    fields: dict[str, str] = {}
    current: str | None = None
    parts: list[str] = []

    def flush() -> None:
        if current is not None:
            fields[current] = "\n".join(parts).strip()

    for line in text.strip().splitlines():
        key = None if current == "lyrics" else key_of_line(line)
        if key is not None:
            flush()
            current, parts = key, [line.split(":", 1)[1].strip()]
        elif current is not None:
            parts.append(line.rstrip())
    flush()
    return fields


def parse_sidecar_bytes(data: bytes) -> dict[str, str]:
    return parse_sidecar_text(decode_sidecar(data))


def read_sidecar_text(storage: Storage, key: str) -> str | None:
    """Decoded text of a sidecar file; None when it does not exist; InputError when unreadable
    (a folder, no permission), so the CLI can say which file and exit non-zero."""
    if not storage.exists(key):
        return None
    try:
        data = storage.read_bytes(key)
    except StorageError:
        return None  # vanished between the check and the read
    except OSError as exc:
        raise InputError(f"cannot read sidecar {storage.url_of(key)}: {exc}") from exc
    return decode_sidecar(data)


# -- loader convention ---------------------------------------------------------------------------
@dataclass(frozen=True)
class LoadedSidecar:
    """What the loader convention found for one audio stem."""

    fields: dict[str, str] = field(default_factory=dict)
    convention: Convention = "none"
    # Files that exist among `<stem>.txt`, `<stem>.caption.txt`, `<stem>.lyrics.txt` (keys).
    files: tuple[str, ...] = ()

    @property
    def has_caption(self) -> bool:
        return bool(self.fields.get("caption"))


def stem_key(audio_key: str) -> str:
    """`sub/song.flac` -> `sub/song` (Side-Step's `Path.stem`, keeping the folder)."""
    return posixpath.splitext(audio_key)[0]


def sidecar_key(audio_key: str) -> str:
    return stem_key(audio_key) + ".txt"


def load_sidecar(storage: Storage, stem: str) -> LoadedSidecar:
    """Side-Step's convention for one stem (a key without extension):

    1. `<stem>.txt` with a non-empty `caption:` value: its parsed fields;
    2. else `<stem>.caption.txt` and/or `<stem>.lyrics.txt`: caption and lyrics only;
    3. else the whole `<stem>.txt` text (stripped) as lyrics, every other field dropped.
    """
    txt_key, cap_key, lyr_key = f"{stem}.txt", f"{stem}.caption.txt", f"{stem}.lyrics.txt"
    txt = read_sidecar_text(storage, txt_key)
    caption = read_sidecar_text(storage, cap_key)
    lyrics = read_sidecar_text(storage, lyr_key)
    files = tuple(
        k for k, v in ((txt_key, txt), (cap_key, caption), (lyr_key, lyrics)) if v is not None
    )
    if txt is not None:
        parsed = parse_sidecar_text(txt)
        # Side-Step tests the caption's value, not the key: a `caption:` line without a value
        # falls through to the split files, then to "the whole text is lyrics".
        if parsed.get("caption"):
            return LoadedSidecar(parsed, "txt", files)
    if caption is not None or lyrics is not None:
        split: dict[str, str] = {}
        if caption is not None:
            split["caption"] = caption.strip()
        if lyrics is not None:
            split["lyrics"] = lyrics.strip()
        return LoadedSidecar(split, "split", files)
    if txt is not None and txt.strip():
        return LoadedSidecar({"lyrics": txt.strip()}, "lyrics_only", files)
    return LoadedSidecar({}, "none", files)


def load_sidecar_metadata(storage: Storage, audio_key: str) -> dict[str, str]:
    """`load_sidecar_metadata(audio_path)`: the fields the convention yields ({} when none)."""
    return load_sidecar(storage, stem_key(audio_key)).fields


# -- value rules (normalize_sidecar) -------------------------------------------------------------
def caption_from_filename(filename: str) -> str:
    """The default caption: the file's stem with `_` and `-` as spaces."""
    stem = posixpath.splitext(posixpath.basename(filename))[0]
    return stem.replace("_", " ").replace("-", " ")


def _whole_number(value: Any) -> int | None:
    try:
        return int(float(value))
    except (TypeError, ValueError, OverflowError):
        return None


def parse_bpm(value: Any) -> int | None:
    """`int(float(x))`; anything unparsable, zero or negative is unknown."""
    bpm = _whole_number(value)
    return bpm if bpm is not None and bpm > 0 else None


def parse_duration(value: Any) -> int:
    """Whole seconds, truncated; 0 (= measure the audio) when absent, invalid or not positive."""
    seconds = _whole_number(value)
    return seconds if seconds is not None and seconds > 0 else 0


def parse_repeat(value: Any) -> int:
    repeat = _whole_number(value)
    return repeat if repeat is not None and repeat >= 1 else 1


def infer_instrumental(raw: Mapping[str, str]) -> bool:
    """An explicit `is_instrumental` wins (`true|1|yes`, any case); without one, empty lyrics or
    lyrics containing `[Instrumental]` mean instrumental."""
    flag = raw.get("is_instrumental")
    if flag:
        return str(flag).strip().lower() in _TRUE_WORDS
    lyrics = raw.get("lyrics", "")
    return not lyrics or INSTRUMENTAL_LYRICS in lyrics


def normalize_sidecar(
    raw: Mapping[str, str], filename: str, audio_duration_s: float = 0.0
) -> dict[str, Any]:
    """Side-Step's folder-mode sample record for one file. `audio_duration_s` is the measured
    length, used when the sidecar has no usable `duration`."""
    return {
        "filename": filename,
        "caption": raw.get("caption") or caption_from_filename(filename),
        "lyrics": raw.get("lyrics") or INSTRUMENTAL_LYRICS,
        "genre": raw.get("genre", ""),
        "bpm": parse_bpm(raw.get("bpm")),
        "keyscale": raw.get("key", ""),
        "timesignature": raw.get("signature", ""),
        "duration": parse_duration(raw.get("duration")) or int(max(audio_duration_s, 0.0)),
        "is_instrumental": infer_instrumental(raw),
        "custom_tag": raw.get("custom_tag") or raw.get("trigger") or "",
        "prompt_override": raw.get("prompt_override") or None,
    }


# -- writing -------------------------------------------------------------------------------------
def _unwrap_caption(value: Any) -> Any:
    """An LLM sometimes returns the caption as a mapping literal (`{'caption': '...'}`); Side-Step
    writes the inner caption, and so do we."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if not (text.startswith("{") and text.endswith("}")):
        return value
    for loads in (ast.literal_eval, json.loads):
        try:
            blob = loads(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        if isinstance(blob, dict) and isinstance(blob.get("caption"), str):
            return blob["caption"]
    return value


def _format_value(value: Any) -> str:
    if value is None:
        return ""  # deliberate: Side-Step writes "None"
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value)
    # Side-Step lower-cases boolean words whatever the key ("TRUE" -> "true").
    return text.lower() if text.lower() in ("true", "false") else text


def _canonical_values(fields: Mapping[str, Any]) -> dict[str, str]:
    canonical: dict[str, str] = {}
    from_alias: dict[str, str] = {}
    unknown: list[str] = []
    for raw_key, raw_value in fields.items():
        name = str(raw_key).strip().lower()
        if name in NEVER_WRITTEN:
            continue
        value = _format_value(_unwrap_caption(raw_value) if name == "caption" else raw_value)
        if name in ALIASES:
            if value:
                from_alias[ALIASES[name]] = value
        elif name in CANONICAL_KEYS:
            canonical[name] = value
        elif value:
            unknown.append(str(raw_key))
    if unknown:
        raise InputError(
            f"sidecar keys {sorted(unknown)} are not Side-Step fields: written as lines they "
            "would fold into the previous field on re-read; keep them in the label store"
        )
    for name, value in from_alias.items():
        if not canonical.get(name):
            canonical[name] = value
    return canonical


def _check_round_trip(values: Mapping[str, str]) -> None:
    for name, value in values.items():
        if name == "lyrics":
            continue  # lyrics are terminal: any line is safe there
        for line in value.splitlines()[1:]:
            if key_of_line(line) is not None:
                raise InputError(
                    f"sidecar value of {name!r} has a line that would read back as a field: "
                    f"{line.strip()!r}"
                )


def render_sidecar(fields: Mapping[str, Any]) -> bytes:
    """The canonical sidecar bytes for `fields` (see the module docstring for the layout)."""
    values = _canonical_values(fields)
    _check_round_trip(values)
    lines = [f"{name}: {values.get(name, '')}" for name in FIXED_KEYS]
    extras = sorted(k for k in values if k not in FIXED_KEYS and k != "lyrics" and values[k])
    lines.extend(f"{name}: {values[name]}" for name in extras)
    lyrics = values.get("lyrics", "")
    lines.append(f"lyrics:\n{lyrics}" if lyrics else "lyrics:")
    return ("\n".join(lines) + "\n").encode("utf-8")


def write_sidecar(storage: Storage, key: str, fields: Mapping[str, Any]) -> bool:
    """Write `fields` as the sidecar at `key`, atomically, after copying the previous file to
    `<key>.bak`. Returns False (and touches nothing) when the bytes would not change. An empty
    caption beside other fields is written as the file-name caption: with no value there,
    Side-Step (and `load_sidecar`) would read the whole file as lyrics and drop those fields."""
    others = any(str(v or "").strip() for k, v in fields.items() if k != "caption")
    if others and not str(fields.get("caption") or "").strip():
        fields = {**fields, "caption": caption_from_filename(posixpath.basename(key))}
    data = render_sidecar(fields)
    previous = storage.read_bytes(key) if storage.exists(key) else None
    if previous == data:
        return False
    if previous is not None:
        storage.write_bytes(f"{key}.bak", previous)
    storage.write_bytes(key, data)
    return True
