"""Genius: the retry ladder, relaxed collaboration matching, page scraping and HTTP retries,
all against a fake Genius on 127.0.0.1."""

from __future__ import annotations

import email.utils
import pickle
import socket
import time

import pytest

from hotstep_ray.labeling.genius import (
    GeniusClient,
    GeniusNoArtistError,
    GeniusNotFoundError,
    artists_match,
    extract_lyrics,
    ladder,
    normalize_name,
    sanitize_headers,
    strip_edition,
    strip_featuring,
)
from hotstep_ray.labeling.http import HttpClient, ProviderError

PAGE = """<html><body>
<div data-lyrics-container="true"><div data-exclude-from-selection="true">12 Contributors
<span>Translations</span>RATATATA Lyrics</div>[Verse 1: Electric Callboy]<br>Ra-ta-ta-ta &amp; go<br/>
<a href="/x"><i>Up</i> we go</a><img src="x.png"><br>You might also like<br>[Chorus: BABYMETAL &amp; Electric Callboy]<br>
Ratatata</div><div>not lyrics</div>
<div data-lyrics-container="true">[Outro]<br>End</div>12Embed</body></html>"""


def _hit(title: str, primary: str, url: str, credits: str = "") -> dict:
    return {
        "type": "song",
        "result": {
            "title": title,
            "primary_artist": {"name": primary},
            "artist_names": credits or primary,
            "url": url,
        },
    }


def _client(fake, **http) -> tuple[GeniusClient, list[float]]:
    sleeps: list[float] = []
    options = {"timeout_s": 2.0, "sleep": sleeps.append, **http}
    return GeniusClient("tok", fake.url, HttpClient(**options)), sleeps


def _genius(fake, hits_for: dict[str, list[dict]]):
    """Search answers by query; any other path is the lyrics page."""

    def handle(seen):
        if seen.path == "/search":
            return {"response": {"hits": hits_for.get(seen.query["q"], [])}}
        return PAGE

    fake.handler = handle


@pytest.mark.parametrize(
    ("wanted", "found", "relaxed", "ok"),
    [
        ("Electric Callboy & BABYMETAL", "Electric Callboy", False, False),
        ("Electric Callboy & BABYMETAL", "Electric Callboy", True, True),
        ("Electric Callboy", "Electric Callboy & BABYMETAL", True, True),
        ("Hall & Oates", "Daryl Hall & John Oates", True, True),
        ("Beyoncé", "Beyonce", False, True),
        ("Guns N’ Roses", "Guns N' Roses", False, True),
        ("AC/DC", "ACDC", False, True),
        ("Oasis", "Blur", True, False),
        ("Daft Punk", "Punk Rock Band", True, False),
    ],
)
def test_artist_matching(wanted, found, relaxed, ok):
    assert artists_match(wanted, found, relaxed) is ok


def test_name_normalisation_and_stripping():
    assert normalize_name("  Sigur Rós & Friends! ") == "sigur ros and friends"
    assert strip_featuring("Song (feat. X & Y)") == "Song"
    assert strip_featuring("Artist ft. Guest") == "Artist"
    assert strip_edition("Song (2011 Remaster) [Live]") == "Song"
    assert strip_edition("Song - Radio Edit") == "Song"
    assert strip_edition("Song (Interlude)") == "Song (Interlude)"  # not an edition: kept


def test_ladder_skips_repeated_rungs():
    assert [s.number for s in ladder("Plain", "Artist")] == [1, 4]
    steps = ladder("Song (feat. X) [2011 Remaster]", "A feat. X")
    assert [(s.number, s.title, s.artist, s.relaxed) for s in steps] == [
        (1, "Song (feat. X) [2011 Remaster]", "A feat. X", False),
        (2, "Song [2011 Remaster]", "A", False),
        (3, "Song", "A", False),
        (4, "Song", "A", True),
    ]


def test_headers_are_sanitised():
    text = "[Verse 1: Someone]\nline\n[Chorus: A & B]\n[Bridge]\n[Intro:]"
    assert sanitize_headers(text) == "[Verse 1]\nline\n[Chorus]\n[Bridge]\n[Intro]"


def test_page_scraping_keeps_only_the_lyrics():
    assert extract_lyrics(PAGE) == (
        "[Verse 1]\nRa-ta-ta-ta & go\nUp we go\n[Chorus]\nRatatata\n[Outro]\nEnd"
    )
    assert "[Verse 1: Electric Callboy]" in extract_lyrics(PAGE, sanitize=False)


def test_collaboration_found_on_the_relaxed_rung_with_one_search(fake_http):
    page = f"{fake_http.url}/electric-callboy-ratatata-lyrics"
    hit = _hit("RATATATA", "Electric Callboy", page, "Electric Callboy & BABYMETAL")
    _genius(fake_http, {"RATATATA Electric Callboy & BABYMETAL": [hit]})
    client, _ = _client(fake_http)
    match = client.find_lyrics("Electric Callboy & BABYMETAL", "RATATATA")
    assert match.step == 4 and match.url == page
    assert match.lyrics.startswith("[Verse 1]\nRa-ta-ta-ta & go")
    searches = [r for r in fake_http.requests if r.path == "/search"]
    assert len(searches) == 1  # rung 4 re-reads rung 1's hits instead of asking again
    assert searches[0].headers["authorization"] == "Bearer tok"
    assert searches[0].query["per_page"] == "5"


def test_ladder_walks_down_to_the_stripped_title(fake_http):
    page = f"{fake_http.url}/song"
    _genius(fake_http, {"Song A": [_hit("Other Song", "A", page), _hit("Song", "A", page)]})
    client, _ = _client(fake_http)
    match = client.find_lyrics("A feat. X", "Song (feat. X) [2011 Remaster]")
    assert match.step == 3 and match.title == "Song"
    queries = [r.query["q"] for r in fake_http.requests if r.path == "/search"]
    assert queries == [
        "Song (feat. X) [2011 Remaster] A feat. X",
        "Song [2011 Remaster] A",
        "Song A",
    ]


def test_another_artists_song_is_not_taken(fake_http):
    _genius(fake_http, {"Song A": [_hit("Song", "Somebody Else", f"{fake_http.url}/x")]})
    client, _ = _client(fake_http)
    with pytest.raises(GeniusNotFoundError):
        client.find_lyrics("A", "Song")
    with pytest.raises(GeniusNoArtistError):
        client.find_lyrics("", "Song")


def test_429_with_retry_after_then_success(fake_http):
    calls = []

    def handle(seen):
        calls.append(seen)
        if len(calls) == 1:
            return fake_http.Reply(429, {"error": "slow down"}, {"Retry-After": "2"})
        return {"response": {"hits": []}}

    fake_http.handler = handle
    client, sleeps = _client(fake_http)
    assert client.search("q") == []
    assert len(calls) == 2 and sleeps == [2.0]


def test_retry_after_dates_are_understood_and_junk_falls_back_to_backoff(fake_http):
    when = email.utils.formatdate(time.time() + 30, usegmt=True)  # an HTTP date 30 s ahead
    busy = [{"Retry-After": when}, {"Retry-After": "soon"}]
    reply = fake_http.Reply
    fake_http.handler = lambda seen: (
        reply(503, "busy", busy[len(fake_http.requests) - 1])
        if len(fake_http.requests) <= len(busy)
        else {"response": {"hits": []}}
    )
    client, sleeps = _client(fake_http, max_wait_s=60.0)
    assert client.search("q") == []
    assert len(fake_http.requests) == 3 and len(sleeps) == 2
    # the date has whole seconds and a little time passes before it is read: 28-30 s
    assert 28.0 <= sleeps[0] <= 30.0
    assert sleeps[1] == 2.0  # no usable Retry-After: the backoff of the second retry


def test_gives_up_after_three_attempts_with_backoff(fake_http):
    reply = fake_http.Reply
    fake_http.handler = lambda seen: reply(
        503, "busy", {"Retry-After": "100"} if len(fake_http.requests) == 1 else {}
    )
    client, sleeps = _client(fake_http)
    with pytest.raises(ProviderError, match="gave up after 3 attempts") as info:
        client.search("q")
    assert info.value.status == 503
    assert len(fake_http.requests) == 3
    assert sleeps == [15.0, 2.0]  # Retry-After capped, then doubling backoff (1 s, 2 s)


def test_client_errors_are_not_retried(fake_http):
    reply = fake_http.Reply
    fake_http.handler = lambda seen: reply(401, {"error": "invalid_token"})
    client, sleeps = _client(fake_http)
    with pytest.raises(ProviderError, match="HTTP 401"):
        client.search("q")
    assert len(fake_http.requests) == 1 and sleeps == []


def test_timeout_is_retried(fake_http):
    reply = fake_http.Reply
    fake_http.handler = lambda seen: (
        reply(200, {"response": {"hits": []}}, delay_s=1.0)
        if len(fake_http.requests) == 1
        else {"response": {"hits": []}}
    )
    client, sleeps = _client(fake_http, timeout_s=0.2)
    assert client.search("q") == []
    assert len(fake_http.requests) == 2 and sleeps == [1.0]


def test_network_errors_are_retried_then_reported(fake_http):
    with socket.socket() as probe:  # a port nobody listens on once this closes
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sleeps: list[float] = []
    client = HttpClient(timeout_s=2.0, sleep=sleeps.append)
    with pytest.raises(ProviderError, match="gave up after 3 attempts .network error") as info:
        client.get(f"http://127.0.0.1:{port}/search")
    assert info.value.status is None and sleeps == [1.0, 2.0]


def test_posts_are_retried_and_loopback_skips_the_proxy(fake_http, monkeypatch):
    # a proxy that refuses everything: reaching the fake server proves loopback bypassed it
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    reply = fake_http.Reply
    fake_http.handler = lambda seen: (
        reply(502, "bad gateway") if len(fake_http.requests) == 1 else {"ok": seen.json()}
    )
    sleeps: list[float] = []
    client = HttpClient(timeout_s=2.0, sleep=sleeps.append)
    assert client.post_json(fake_http.url + "/v1", {"a": 1}).json() == {"ok": {"a": 1}}
    assert [r.method for r in fake_http.requests] == ["POST", "POST"] and sleeps == [1.0]
    assert fake_http.requests[1].headers["content-type"] == "application/json"


def test_a_used_client_pickles_and_keeps_working(fake_http):
    fake_http.handler = lambda seen: {"response": {"hits": []}}
    client, _ = _client(fake_http)
    assert client.search("q") == []
    copy = pickle.loads(pickle.dumps(client.http))  # sessions stay behind; a fresh one is made
    assert copy.get(fake_http.url + "/search?q=x").json() == {"response": {"hits": []}}


def test_malformed_json_is_an_error(fake_http):
    fake_http.handler = lambda seen: "{not json"
    client, _ = _client(fake_http)
    with pytest.raises(ProviderError, match="malformed JSON"):
        client.search("q")


def test_token_and_base_url_come_from_the_environment():
    assert GeniusClient.from_env({}) is None
    client = GeniusClient.from_env({"GENIUS_ACCESS_TOKEN": "t", "GENIUS_API_BASE": "http://x"})
    assert client is not None and (client.token, client.base_url) == ("t", "http://x")
