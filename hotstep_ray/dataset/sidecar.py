"""Side-Step sidecars (`<stem>.txt`): parse, load by convention, normalise, write.

Reading matches Side-Step byte for byte (`parse_txt_metadata`, `load_sidecar_metadata`,
`normalize_sidecar`; pinned by `tests/fixtures/sidestep/sidecars.json`) for every UTF-8 file:

- bytes are decoded as `utf-8-sig` (a BOM is dropped); the text is stripped and split with
  `str.splitlines()` (CRLF, lone CR, form feed and U+2028 all end a line);
- a line starts a field when, left-stripped, it has a `:`, does not start with `[`, and the
  lower-cased text before the first `:` is a known key; aliases become canonical names;
- other lines continue the current field (right-stripped, joined with `\\n`, the value stripped),
  so an unknown `mood: happy` line folds into the previous value; lines before the first key are
  dropped; a repeated key overwrites; everything after `lyrics:` is lyrics.

The writer produces Side-Step's canonical layout (six fixed lines even when empty, then the other
non-empty keys sorted, then `lyrics:` last, `\\n` joins, one trailing `\\n`, UTF-8), backs the
previous file up (see `write_sidecar`) and replaces the file atomically through `Storage`.

Text that is not UTF-8 (deliberate difference 6 below). Side-Step decodes with `errors="replace"`,
so the `é` of a cp1252 `Café` reads as U+FFFD, and the next write of that text (a label run)
stores the U+FFFD for good. Here nothing is ever decoded lossily:

- a file that is not valid UTF-8 and holds no UTF-8 text at all is read as cp1252 (Windows'
  "ANSI" code page, what Notepad and most Windows tools wrote before UTF-8): that decoding is
  one-to-one on the 251 bytes it defines, so the text keeps every byte's meaning and the next
  write stores it as UTF-8, which Side-Step reads back unchanged; `LoadedSidecar.legacy_files`
  names such files;
- a file with a byte cp1252 leaves undefined (0x81, 0x8D, 0x8F, 0x90, 0x9D), or one that mixes
  valid UTF-8 text with invalid bytes (no single encoding reads it), is refused with an
  `InputError` naming the file and the byte offset: the scan reports that sample and the label
  job leaves its sidecar alone;
- `write_sidecar` refuses to write a U+FFFD the current file does not already hold.

Deliberate differences from Side-Step (each asserted in tests/dataset/test_sidecar_io.py):

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
5. Writing bytes identical to the current file is skipped. The first backup, `<stem>.txt.bak`, is
   never replaced (Side-Step overwrites it on every write, losing the user's original); later
   writes keep the file they replace as `<stem>.txt.bak.1` (see `write_sidecar`).
6. A sidecar that is not UTF-8 is read as cp1252 or refused, never with U+FFFD (see above).

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
import errno
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


# Tried only when the bytes are not UTF-8 (see the module docstring for why cp1252).
LEGACY_ENCODING = "cp1252"
REPLACEMENT_CHARACTER = "\ufffd"


def _has_utf8_text(data: bytes) -> bool:
    """Whether `data` holds at least one well-formed non-ASCII UTF-8 character (the invalid bytes
    come back as lone surrogates U+DC80..U+DCFF, which no valid sequence decodes to)."""
    text = data.decode("utf-8", errors="surrogateescape")
    return any(ord(c) > 0x7F and not 0xDC80 <= ord(c) <= 0xDCFF for c in text)


def decode_sidecar_as(data: bytes) -> tuple[str, str]:
    """(text, encoding) of sidecar bytes, losslessly: `utf-8` (a BOM is dropped) or
    `LEGACY_ENCODING`; an `InputError` saying which byte at which offset when neither fits."""
    try:
        return data.decode("utf-8-sig"), "utf-8"
    except UnicodeDecodeError:
        pass
    # utf-8-sig counts offsets after the BOM: take the offset from the plain codec.
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad, offset = data[exc.start], exc.start
    else:  # pragma: no cover - utf-8-sig only fails where utf-8 does
        raise AssertionError("utf-8-sig failed on valid UTF-8")
    if _has_utf8_text(data):
        raise InputError(
            f"byte 0x{bad:02x} at offset {offset} is not UTF-8, yet the file also holds UTF-8 "
            f"text, so no single encoding reads it; re-save it as UTF-8"
        )
    try:
        text = data.decode(LEGACY_ENCODING)
    except UnicodeDecodeError as exc:
        raise InputError(
            f"byte 0x{bad:02x} at offset {offset} is not UTF-8 and byte 0x{data[exc.start]:02x} "
            f"at offset {exc.start} is not {LEGACY_ENCODING}; re-save it as UTF-8"
        ) from None
    # cp1252 is one-to-one on the bytes it defines; checked anyway, since the rewrite depends on it
    if text.encode(LEGACY_ENCODING) != data:  # pragma: no cover
        raise InputError(f"{LEGACY_ENCODING} does not round-trip; re-save it as UTF-8")
    return text, LEGACY_ENCODING


def decode_sidecar(data: bytes) -> str:
    """The text of sidecar bytes (`decode_sidecar_as` without the encoding). Unlike Side-Step's
    `errors="replace"`, never a U+FFFD for a byte it could not read: an `InputError` instead."""
    return decode_sidecar_as(data)[0]


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


def read_sidecar_decoded(storage: Storage, key: str) -> tuple[str, str] | None:
    """(text, encoding) of a sidecar file (`decode_sidecar_as`); None when it does not exist;
    InputError naming the file when it cannot be read (a folder, no permission, bytes that no
    encoding reads losslessly), so the CLI can say which file and exit non-zero."""
    if not storage.exists(key):
        return None
    try:
        data = storage.read_bytes(key)
    except StorageError:
        return None  # vanished between the check and the read
    except OSError as exc:
        raise InputError(f"cannot read sidecar {storage.url_of(key)}: {exc}") from exc
    try:
        return decode_sidecar_as(data)
    except InputError as exc:
        raise InputError(f"cannot read sidecar {storage.url_of(key)}: {exc}") from None


def read_sidecar_text(storage: Storage, key: str) -> str | None:
    """`read_sidecar_decoded` without the encoding."""
    decoded = read_sidecar_decoded(storage, key)
    return None if decoded is None else decoded[0]


# -- loader convention ---------------------------------------------------------------------------
@dataclass(frozen=True)
class LoadedSidecar:
    """What the loader convention found for one audio stem."""

    fields: dict[str, str] = field(default_factory=dict)
    convention: Convention = "none"
    # Files that exist among `<stem>.txt`, `<stem>.caption.txt`, `<stem>.lyrics.txt` (keys).
    files: tuple[str, ...] = ()
    # Those of `files` that were not UTF-8 and were read as LEGACY_ENCODING.
    legacy_files: tuple[str, ...] = ()

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
    keys = (f"{stem}.txt", f"{stem}.caption.txt", f"{stem}.lyrics.txt")
    decoded = {key: read_sidecar_decoded(storage, key) for key in keys}
    read = {key: value for key, value in decoded.items() if value is not None}
    txt, caption, lyrics = (read[k][0] if k in read else None for k in keys)
    found = {
        "files": tuple(read),
        "legacy_files": tuple(k for k, (_, encoding) in read.items() if encoding != "utf-8"),
    }
    if txt is not None:
        parsed = parse_sidecar_text(txt)
        # Side-Step tests the caption's value, not the key: a `caption:` line without a value
        # falls through to the split files, then to "the whole text is lyrics".
        if parsed.get("caption"):
            return LoadedSidecar(parsed, "txt", **found)
    if caption is not None or lyrics is not None:
        split: dict[str, str] = {}
        if caption is not None:
            split["caption"] = caption.strip()
        if lyrics is not None:
            split["lyrics"] = lyrics.strip()
        return LoadedSidecar(split, "split", **found)
    if txt is not None and txt.strip():
        return LoadedSidecar({"lyrics": txt.strip()}, "lyrics_only", **found)
    return LoadedSidecar({}, "none", **found)


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


def _holds_replacement(data: bytes | None) -> bool:
    """Whether `data`, read the way `load_sidecar` reads it, contains U+FFFD."""
    if data is None:
        return False
    try:
        return REPLACEMENT_CHARACTER in decode_sidecar(data)
    except InputError:
        return False


def _put(storage: Storage, sidecar: str, key: str, data: bytes) -> None:
    """`storage.write_bytes`, with an error that names the sidecar: the atomic write fails on
    its temporary file, whose name means nothing to the user."""
    try:
        storage.write_bytes(key, data)
    except OSError as exc:
        url = storage.url_of(sidecar)
        reason = exc.strerror or str(exc)  # strerror: the reason without the temp file's name
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            folder = storage.url_of(posixpath.dirname(sidecar))
            raise StorageError(
                f"cannot write sidecar {url}: the folder {folder} is read-only or not "
                f"writable ({reason})"
            ) from exc
        raise StorageError(f"cannot write sidecar {url}: {reason}") from exc


def write_sidecar(storage: Storage, key: str, fields: Mapping[str, Any]) -> bool:
    """Write `fields` as the sidecar at `key`, atomically, after backing up the file it replaces.
    Returns False (and touches nothing) when the bytes would not change.

    Backups: the first write that replaces a file copies it to `<key>.bak`, and that file is
    never overwritten, so it keeps the user's original however many label runs and edits
    follow. Every later write copies the file it replaces to `<key>.bak.1` (overwriting the
    previous `.bak.1`), so the last version is one step back too. Two files at most: a studio
    session's many small edits do not pile up numbered copies.

    An empty caption beside other fields is written as the file-name caption: with no value
    there, Side-Step (and `load_sidecar`) would read the whole file as lyrics and drop those
    fields. A U+FFFD (the mark of a lossy decode, here or upstream) that the current file does
    not already hold is refused with an `InputError`: once written, the original is lost.
    A write that fails (a read-only folder) raises `StorageError` naming the sidecar."""
    others = any(str(v or "").strip() for k, v in fields.items() if k != "caption")
    if others and not str(fields.get("caption") or "").strip():
        fields = {**fields, "caption": caption_from_filename(posixpath.basename(key))}
    data = render_sidecar(fields)
    previous = storage.read_bytes(key) if storage.exists(key) else None
    if previous == data:
        return False
    if REPLACEMENT_CHARACTER in data.decode("utf-8") and not _holds_replacement(previous):
        raise InputError(
            f"refusing to write {storage.url_of(key)}: a value holds U+FFFD, the mark of text "
            "that was decoded lossily"
        )
    if previous is not None:
        backup = f"{key}.bak" if not storage.exists(f"{key}.bak") else f"{key}.bak.1"
        _put(storage, key, backup, previous)
    _put(storage, key, key, data)
    return True
