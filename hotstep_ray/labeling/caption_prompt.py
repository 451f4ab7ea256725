"""The caption prompt (five lines, genre first) and the parse chain for what a model answers.

The structure follows the seed (measured against ACE-Step's own reference captions: two sentences,
~30 words, no tempo or key in the text); the wording is ours. When the model hears the audio, the
existing local caption is left out of the prompt so the model describes what it hears instead of
paraphrasing what it was told.

Parse chain, first that yields fields wins: a mapping → a JSON object (code fences allowed) → a
`{...}` blob inside prose → a scan for `label: value` lines (first occurrence wins; prose before
the first label is the caption). "N/A"-style values are dropped; if nothing is left, the whole
answer is the caption.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hotstep_ray.dataset.dataset_json import normalize_keyscale

FIELDS = ("genre", "caption", "bpm", "key", "signature")
MAX_CAPTION_CHARS = 4000
MAX_GENRE_CHARS = 300
LYRICS_EXCERPT_CHARS = 500
_ALIASES = {
    "genres": "genre",
    "tags": "genre",
    "description": "caption",
    "tempo": "bpm",
    "keyscale": "key",
    "key_scale": "key",
    "time_signature": "signature",
    "timesignature": "signature",
    "time signature": "signature",
    "meter": "signature",
}
_NOT_KNOWN = frozenset({"", "n/a", "na", "none", "null", "unknown", "-", "?", "not applicable"})
_LABEL_LINE = re.compile(
    r"^\s*(?:[-*•]\s*)?\**\s*(genres?|tags|caption|description|bpm|tempo|key(?:[ _]?scale)?|"
    r"(?:time[ _]?)?signature|meter)\s*\**\s*[:=]\s*\**\s*(.*?)\s*$",
    re.IGNORECASE,
)
_FENCE = re.compile(r"^```[a-zA-Z]*\s*|\s*```$")
_INVISIBLE = re.compile(r"[\u200b-\u200f\u2060\ufeff]|[\x00-\x08\x0b-\x1f\x7f]")

SYSTEM_PROMPT = """\
You write training labels for a music-generation model. Answer with exactly five plain-text \
lines, in this order, and nothing else:
genre: comma-separated genre tags, the most specific first
caption: two to four sentences (about 25 to 60 words) on a single line
bpm: the tempo as a whole number
key: tonic and mode, written like "C minor"
signature: beats per bar, one of 2, 3, 4 or 6

Rules for the caption: it is required. Weave together the genre and subgenre, the concrete \
instruments you hear, the vocal character (or the lead instrument when there are no vocals), the \
mood, and the production sound. Never state the tempo, key or meter in it. Its genre must agree \
with the genre line. Prefer concrete nouns; no marketing words and no listener reactions. Do not \
name the artist or the song. Write N/A for any line you cannot determine."""


@dataclass(frozen=True)
class PromptFacts:
    """What the prompt tells the model besides the audio."""

    title: str = ""
    artist: str = ""
    bpm: int | None = None
    key: str = ""
    signature: str = ""
    local_caption: str = ""
    lyrics: str = ""


def build_user_prompt(facts: PromptFacts, audio_attached: bool, include_lyrics: bool = True) -> str:
    unknown = "unknown"
    lines = [
        "Label this song in the five-line format.",
        "",
        "Song metadata:",
        f"- Audio attached: {'yes' if audio_attached else 'no'}",
        f"- Title: {facts.title or unknown}",
        f"- Artist: {facts.artist or unknown}",
        f"- Local analysis: bpm {facts.bpm or unknown}, key {facts.key or unknown}, "
        f"signature {facts.signature or unknown}",
    ]
    if not audio_attached and facts.local_caption:
        # Text-only: the old caption is the best evidence there is. With audio it would anchor.
        lines.append(f"- Existing caption (may be wrong): {facts.local_caption}")
    if include_lyrics and facts.lyrics.strip():
        excerpt = facts.lyrics.strip()[:LYRICS_EXCERPT_CHARS]
        lines += ["", "Lyrics excerpt:", excerpt]
    lines += [
        "",
        "Reminder: five lines, genre first; no tempo, key or meter inside the caption.",
    ]
    return "\n".join(lines)


# -- parsing -------------------------------------------------------------------------------------
def _canonical(label: str) -> str | None:
    name = label.strip().lower().replace("-", "_")
    name = _ALIASES.get(name, _ALIASES.get(name.replace("_", " "), name))
    return name if name in FIELDS else None


def _as_text(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value if v is not None)
    return "" if value is None else str(value)


def _from_mapping(data: Mapping[str, Any]) -> dict[str, str]:
    fields: dict[str, str] = {}
    for label, value in data.items():
        name = _canonical(str(label))
        if name and name not in fields:
            fields[name] = _as_text(value)
    return fields


def _json_object(text: str) -> dict[str, str]:
    try:
        data = json.loads(_FENCE.sub("", text.strip()))
    except (json.JSONDecodeError, ValueError):
        return {}
    return _from_mapping(data) if isinstance(data, dict) else {}


def _blob(text: str) -> dict[str, str]:
    match = re.search(r"\{.*\}", text, re.DOTALL)
    if not match:
        return {}
    for loads in (json.loads, ast.literal_eval):
        try:
            data = loads(match.group(0))
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        if isinstance(data, dict):
            return _from_mapping(data)
    return {}


def _label_scan(text: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    prose: list[str] = []
    current: str | None = None
    seen_label = False
    for line in text.splitlines():
        match = _LABEL_LINE.match(line)
        name = _canonical(match.group(1)) if match else None
        if name:
            seen_label = True
            current = name if name not in fields else None  # first occurrence wins
            if current:
                fields[current] = match.group(2)
        elif not seen_label:
            if line.strip():
                prose.append(line.strip())
        elif current == "caption" and line.strip():
            fields["caption"] += " " + line.strip()  # a caption the model wrapped
        else:
            current = None
    if prose and "caption" not in fields and seen_label:
        fields["caption"] = " ".join(prose)
    return fields


def _known(value: str) -> bool:
    return value.strip().strip("*").strip().lower() not in _NOT_KNOWN


def parse_caption_response(raw: Any) -> dict[str, str]:
    """Raw fields (strings) from a model's answer, by the chain in the module docstring."""
    if isinstance(raw, Mapping):
        fields = _from_mapping(raw)
        text = ""
    else:
        text = _as_text(raw).strip()
        fields = _json_object(text) or _blob(text) or _label_scan(text)
    fields = {k: v for k, v in fields.items() if _known(v)}
    if not fields and text and _known(text):
        fields = {"caption": text}
    return fields


# -- normalising ---------------------------------------------------------------------------------
def clean_text(text: str, limit: int) -> str:
    """One line: CRLF, zero-width and control characters out, spaces collapsed, markdown and
    quotes trimmed, cut at `limit` characters."""
    text = _INVISIBLE.sub("", text.replace("\r", " ").replace("\n", " "))
    text = re.sub(r"\s+", " ", text).strip().strip("*").strip().strip('"').strip()
    return text[:limit].rstrip()


def parse_signature(text: str) -> str:
    """ "4/4" stays; a bare numerator 2/3/4 becomes "n/4" and 6 becomes "6/8"; anything else ""."""
    match = re.match(r"^\s*(\d{1,2})\s*(?:/\s*(\d{1,2}))?", text or "")
    if not match:
        return ""
    numerator, denominator = int(match.group(1)), match.group(2)
    if denominator:
        return f"{numerator}/{int(denominator)}"
    return {2: "2/4", 3: "3/4", 4: "4/4", 6: "6/8"}.get(numerator, "")


def parse_bpm_text(text: str) -> int | None:
    match = re.search(r"\d+(?:\.\d+)?", text or "")
    if not match:
        return None
    bpm = int(float(match.group(0)) + 0.5)
    return bpm if 30 <= bpm <= 300 else None


def normalize_fields(raw: Mapping[str, str]) -> dict[str, Any]:
    """Typed, cleaned label values; fields that do not parse are left out."""
    out: dict[str, Any] = {}
    caption = clean_text(raw.get("caption", ""), MAX_CAPTION_CHARS)
    if caption:
        out["caption"] = caption
    genre = clean_text(raw.get("genre", ""), MAX_GENRE_CHARS).rstrip(".")
    if genre:
        out["genre"] = genre
    bpm = parse_bpm_text(raw.get("bpm", ""))
    if bpm:
        out["bpm"] = bpm
    key_words = clean_text(raw.get("key", ""), 40).replace(",", " ").split()
    key = normalize_keyscale(" ".join(key_words[:2]))
    if key:
        out["key"] = key
    signature = parse_signature(raw.get("signature", ""))
    if signature:
        out["signature"] = signature
    return out
