"""Lyrics from Genius: search with a four-step retry ladder, match the artist, scrape the page.

Ladder (each step searches `"<title> <artist>"` and takes the first hit that matches):
  1. the tags as they are, exact artist match;
  2. featuring clauses stripped ("Song (feat. X)", "Artist ft. Y");
  3. edition parentheticals stripped when they name an edition ("(2011 Remaster)", "[Live]");
  4. relaxed match on the most-stripped names: collaborations and duos ("Electric Callboy &
     BABYMETAL" vs "Electric Callboy", "Hall & Oates" vs "Daryl Hall & John Oates").
A step whose query and mode repeat an earlier one is skipped (no wasted call).

Both modes also require the titles to contain one another: a search ranks other songs of the same
artist highly, and writing another song's lyrics is worse than writing none.
"""

from __future__ import annotations

import os
import re
import unicodedata
import urllib.parse
from dataclasses import dataclass, field, replace
from html.parser import HTMLParser
from typing import Any

from hotstep_ray.labeling.http import HttpClient, ProviderError

DEFAULT_API_BASE = "https://api.genius.com"
TOKEN_ENV = "GENIUS_ACCESS_TOKEN"
BASE_URL_ENV = "GENIUS_API_BASE"
MAX_LYRICS_CHARS = 20_000
SEARCH_PER_PAGE = 5

_FEAT = re.compile(
    r"\s*[\(\[]\s*(?:feat\.?|ft\.?|featuring|with)\s[^\)\]]*[\)\]]"  # (feat. X) [with Y]
    r"|\s+(?:feat\.?|ft\.?|featuring)\s.*$",  # Artist feat. X
    re.IGNORECASE,
)
_EDITION_WORDS = (
    "remaster",
    "remastered",
    "remix",
    "mix",
    "live",
    "demo",
    "version",
    "edit",
    "mono",
    "stereo",
    "deluxe",
    "acoustic",
    "bonus",
    "single",
    "radio",
    "extended",
    "instrumental",
    "anniversary",
    "explicit",
    "clean",
)
_EDITION = re.compile(
    r"\s*[\(\[][^\)\]]*[\)\]]|\s+-\s+[^-]+$"  # any (…) / […] group, or a trailing " - …" suffix
)
_EDITION_HINT = re.compile(rf"\b(?:{'|'.join(_EDITION_WORDS)})\b|\b(?:19|20)\d\d\b", re.IGNORECASE)
_HEADER = re.compile(r"^(\s*\[)([^\]:\n]+?)\s*:[^\]\n]*(\]\s*)$", re.MULTILINE)
# The page header Genius prints before the lyrics, on the first line: "12 ContributorsSong Lyrics".
_CONTRIBUTORS = re.compile(r"^[^\n]*?\bContributors?\b[^\n]*?Lyrics", re.IGNORECASE)
_TRAILER = re.compile(r"\d*\s*Embed\s*$")
_VOID_TAGS = frozenset({"br", "img", "hr", "input", "meta", "link", "wbr", "source", "area"})
_NOISE_LINES = re.compile(r"^(You might also like|See .* Live|Get tickets as low as .*)$")


class GeniusNoArtistError(ProviderError):
    """No artist could be found (tags, file name, dataset default)."""


class GeniusNotFoundError(ProviderError):
    """Genius has no matching song (a normal outcome, not a failure of the service)."""


# -- names ---------------------------------------------------------------------------------------
def normalize_name(text: str) -> str:
    """Lower-case, diacritics and punctuation removed, `&` as "and", curly quotes straight."""
    text = unicodedata.normalize("NFD", text or "")
    text = "".join(ch for ch in text if not unicodedata.combining(ch))
    text = text.replace("\u2019", "'").replace("\u2018", "'").replace("\u201c", '"')
    text = text.replace("\u201d", '"').replace("&", " and ").lower()
    text = re.sub(r"[^\w\s]", "", text)
    return re.sub(r"\s+", " ", text).strip()


def strip_featuring(text: str) -> str:
    return _FEAT.sub("", text).strip()


def strip_edition(text: str) -> str:
    """Drop parenthesised/bracketed groups and " - suffixes" that name an edition."""

    def drop(match: re.Match[str]) -> str:
        return "" if _EDITION_HINT.search(match.group(0)) else match.group(0)

    return re.sub(r"\s+", " ", _EDITION.sub(drop, text)).strip()


def artists_match(wanted: str, found: str, relaxed: bool) -> bool:
    a, b = normalize_name(wanted), normalize_name(found)
    if not a or not b:
        return False
    if a == b:
        return True
    if not relaxed:
        return False
    if a in b or b in a:
        return True
    short, long_ = sorted((a.split(), b.split()), key=len)
    return len(short) >= 2 and set(short) <= set(long_)


def titles_match(wanted: str, found: str) -> bool:
    a, b = normalize_name(wanted), normalize_name(found)
    return bool(a and b) and (a in b or b in a)


def sanitize_headers(lyrics: str) -> str:
    """`[Verse 1: Artist]` -> `[Verse 1]` (who sings a part is noise for a music model)."""
    return _HEADER.sub(lambda m: f"{m.group(1)}{m.group(2).strip()}{m.group(3)}", lyrics)


# -- page scraping -------------------------------------------------------------------------------
class _LyricsExtractor(HTMLParser):
    """Text of every `div[data-lyrics-container="true"]`, `<br>` as a newline, skipping elements
    marked `data-exclude-from-selection` (Genius puts its page header there)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.blocks: list[list[str]] = []
        self._depth = 0  # open tags inside the current container
        self._skip_depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if self._depth == 0:
            if tag == "div" and attributes.get("data-lyrics-container") == "true":
                self._depth = 1
                self.blocks.append([])
            return
        if tag in _VOID_TAGS:  # no end tag follows: must not change the depth
            if tag == "br" and not self._skip_depth:
                self.blocks[-1].append("\n")
            return
        self._depth += 1
        if self._skip_depth or attributes.get("data-exclude-from-selection") == "true":
            self._skip_depth += 1

    def handle_endtag(self, tag: str) -> None:
        if self._depth == 0 or tag in _VOID_TAGS:
            return
        self._depth -= 1
        if self._skip_depth:
            self._skip_depth -= 1

    def handle_data(self, data: str) -> None:
        if self._depth and not self._skip_depth:
            # A newline in HTML source is just whitespace; only <br> breaks a lyric line.
            self.blocks[-1].append(data.replace("\r", " ").replace("\n", " "))


def extract_lyrics(html: str, sanitize: bool = True) -> str:
    parser = _LyricsExtractor()
    parser.feed(html)
    parser.close()
    text = "\n".join("".join(block) for block in parser.blocks)
    text = _CONTRIBUTORS.sub("", text, count=1) if _CONTRIBUTORS.match(text) else text
    text = _TRAILER.sub("", text.strip())
    lines = [line.strip() for line in text.splitlines() if not _NOISE_LINES.match(line.strip())]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    if sanitize:
        text = sanitize_headers(text)
    return text[:MAX_LYRICS_CHARS].strip()


# -- client --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LyricsMatch:
    lyrics: str
    url: str
    title: str
    artist: str
    step: int  # 1..4: which rung of the ladder found it


@dataclass(frozen=True)
class _Step:
    number: int
    title: str
    artist: str
    relaxed: bool


def ladder(title: str, artist: str) -> list[_Step]:
    """The retry ladder for one song, duplicates removed."""
    t2, a2 = strip_featuring(title), strip_featuring(artist)
    t3 = strip_edition(t2)
    candidates = [
        _Step(1, title, artist, False),
        _Step(2, t2, a2, False),
        _Step(3, t3, a2, False),
        _Step(4, t3, a2, True),
    ]
    steps: list[_Step] = []
    seen: set[tuple[str, str, bool]] = set()
    for step in candidates:
        key = (step.title.lower(), step.artist.lower(), step.relaxed)
        if step.title and key not in seen:
            seen.add(key)
            steps.append(step)
    return steps


@dataclass(frozen=True)
class GeniusClient:
    token: str
    base_url: str = DEFAULT_API_BASE
    http: HttpClient = field(default_factory=lambda: HttpClient(timeout_s=15, min_interval_s=0.4))
    sanitize: bool = True

    name = "genius"

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **kwargs: Any) -> GeniusClient | None:
        env = dict(os.environ if env is None else env)
        token = env.get(TOKEN_ENV, "").strip()
        if not token:
            return None
        return cls(token=token, base_url=env.get(BASE_URL_ENV) or DEFAULT_API_BASE, **kwargs)

    def for_concurrency(self, copies: int) -> GeniusClient:
        return replace(self, http=self.http.for_concurrency(copies))

    def search(self, query: str) -> list[dict[str, Any]]:
        """Song hits (`result` objects) of one search."""
        params = urllib.parse.urlencode({"q": query, "per_page": SEARCH_PER_PAGE})
        url = f"{self.base_url.rstrip('/')}/search?{params}"
        data = self.http.get(url, {"Authorization": f"Bearer {self.token}"}).json()
        hits = (data.get("response") or {}).get("hits") if isinstance(data, dict) else None
        if not isinstance(hits, list):
            raise ProviderError("unexpected Genius search response (no response.hits)")
        return [
            h["result"]
            for h in hits
            if isinstance(h, dict)
            and h.get("type", "song") == "song"
            and isinstance(h.get("result"), dict)
        ]

    @staticmethod
    def _pick(hits: list[dict[str, Any]], step: _Step) -> dict[str, Any] | None:
        """The first hit by the artist whose title equals ours, else the first whose title
        contains ours or is contained in it ("Song" vs "Song (Live)")."""
        by_artist = []
        for hit in hits:
            primary = str((hit.get("primary_artist") or {}).get("name") or "")
            credits = [primary] + (
                [str(hit["artist_names"])] if step.relaxed and hit.get("artist_names") else []
            )
            title = str(hit.get("title") or hit.get("full_title") or "")
            if titles_match(step.title, title) and any(
                artists_match(step.artist, name, step.relaxed) for name in credits
            ):
                by_artist.append((title, hit))
        wanted = normalize_name(step.title)
        exact = [hit for title, hit in by_artist if normalize_name(title) == wanted]
        return (exact or [hit for _, hit in by_artist] or [None])[0]

    def fetch_lyrics(self, url: str) -> str:
        return extract_lyrics(self.http.get(url).text(), self.sanitize)

    def find_lyrics(self, artist: str, title: str) -> LyricsMatch:
        """Walk the ladder; raise `GeniusNotFoundError` when no step matches."""
        if not artist.strip():
            raise GeniusNoArtistError("no artist (tags, file name or dataset default) to search")
        if not title.strip():
            raise GeniusNotFoundError("no title to search")
        searched: dict[str, list[dict[str, Any]]] = {}  # a relaxed rung re-reads, not re-asks
        for step in ladder(title.strip(), artist.strip()):
            query = f"{step.title} {step.artist}"
            if query not in searched:
                searched[query] = self.search(query)
            hit = self._pick(searched[query], step)
            if hit is None:
                continue
            url = str(hit.get("url") or "")
            lyrics = self.fetch_lyrics(url) if url else ""
            if not lyrics:
                raise GeniusNotFoundError(f"Genius page has no lyrics: {url}")
            artist_name = str((hit.get("primary_artist") or {}).get("name") or "")
            return LyricsMatch(lyrics, url, str(hit.get("title") or ""), artist_name, step.number)
        raise GeniusNotFoundError(f"no Genius match for {artist!r} - {title!r}")
