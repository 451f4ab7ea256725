"""Caption providers against fake Gemini / OpenAI endpoints, the parse chain, and the offline
captioner."""

from __future__ import annotations

import base64
import io

import pytest
import soundfile as sf

from hotstep_ray.audio.synth import SongSpec
from hotstep_ray.core.storage import Storage
from hotstep_ray.labeling.analysis import EssentiaAnalyzer
from hotstep_ray.labeling.caption_prompt import (
    SYSTEM_PROMPT,
    normalize_fields,
    parse_caption_response,
)
from hotstep_ray.labeling.captions import (
    CaptionRequest,
    GeminiCaptioner,
    OfflineCaptioner,
    OpenAICaptioner,
    make_captioner,
)
from hotstep_ray.labeling.http import HttpClient, ProviderError

LOCAL_CAPTION = "OLD LOCAL CAPTION that must not anchor the model"
FIVE_LINES = (
    "genre: synthwave, electronic\n"
    "caption: Pulsing synthwave with gated drums, a rubbery bass and a glassy lead; nostalgic "
    "and wide.\nbpm: 120\nkey: c min\nsignature: 4"
)


@pytest.fixture
def song(tmp_path, song_writer) -> CaptionRequest:
    song_writer(tmp_path / "song.wav", SongSpec("Glass", 120, "A", "major", 3.0, 5))
    return CaptionRequest(
        sample_id="s1",
        title="Glass",
        artist="Band",
        bpm=120,
        key="A major",
        local_caption=LOCAL_CAPTION,
        lyrics="[Verse]\nla la la",
        source_url=str(tmp_path),
        rel_path="song.wav",
    )


def _http() -> HttpClient:
    return HttpClient(timeout_s=5, sleep=lambda s: None)


def _gemini_answer(text: str) -> dict:
    return {"candidates": [{"content": {"parts": [{"text": text}]}, "finishReason": "STOP"}]}


# MP3 durations are checked to +-0.1 s: LAME's encoder delay and end padding add a few frames
# (~1152 samples each, ~26 ms at 44.1 kHz), far less than a wrong rate or a missing second.
def _mp3_seconds(b64: str) -> float:
    info = sf.info(io.BytesIO(base64.b64decode(b64)))
    assert (info.samplerate, info.channels) == (44_100, 2)
    return info.duration


def test_gemini_hears_the_song_without_the_local_caption(fake_http, song):
    fake_http.handler = lambda seen: _gemini_answer(FIVE_LINES)
    provider = GeminiCaptioner(
        "gkey", model="gemini-test", base_url=f"{fake_http.url}/v1beta", http=_http()
    )
    result = provider.caption(song)

    (seen,) = fake_http.requests
    assert seen.path == "/v1beta/models/gemini-test:generateContent"
    assert seen.headers["x-goog-api-key"] == "gkey"
    body = seen.json()
    parts = body["contents"][0]["parts"]
    audio = parts[0]["inline_data"]
    assert audio["mime_type"] == "audio/mpeg"
    assert _mp3_seconds(audio["data"]) == pytest.approx(3.0, abs=0.1)
    prompt = parts[1]["text"]
    assert LOCAL_CAPTION not in seen.body.decode()
    assert "Audio attached: yes" in prompt and "la la la" in prompt
    assert body["systemInstruction"]["parts"][0]["text"] == SYSTEM_PROMPT
    assert body["generationConfig"] == {"temperature": 0.45, "topP": 0.9}
    assert result.audio and result.provider == "gemini"
    assert result.fields == {
        "caption": "Pulsing synthwave with gated drums, a rubbery bass and a glassy lead; "
        "nostalgic and wide.",
        "genre": "synthwave, electronic",
        "bpm": 120,
        "key": "C minor",
        "signature": "4/4",
    }


def test_text_only_fallback_shows_the_local_caption(fake_http, song):
    fake_http.handler = lambda seen: _gemini_answer(FIVE_LINES)
    provider = GeminiCaptioner("k", base_url=fake_http.url, http=_http())
    missing = CaptionRequest(**{**song.__dict__, "rel_path": "gone.wav"})
    result = provider.caption(missing)
    parts = fake_http.requests[0].json()["contents"][0]["parts"]
    assert len(parts) == 1 and LOCAL_CAPTION in parts[0]["text"]
    assert "Audio attached: no" in parts[0]["text"]
    assert not result.audio and "audio not attached" in result.note


def test_openai_compatible_endpoint_gets_input_audio(fake_http, song):
    answer = {"choices": [{"message": {"content": [{"type": "text", "text": FIVE_LINES}]}}]}
    fake_http.handler = lambda seen: answer
    provider = OpenAICaptioner(
        "okey", model="audio-model", base_url=f"{fake_http.url}/v1", http=_http()
    )
    result = provider.caption(song)
    (seen,) = fake_http.requests
    assert seen.path == "/v1/chat/completions"
    assert seen.headers["authorization"] == "Bearer okey"
    body = seen.json()
    assert body["model"] == "audio-model" and body["messages"][0]["content"] == SYSTEM_PROMPT
    text, audio = body["messages"][1]["content"]
    assert audio["type"] == "input_audio" and audio["input_audio"]["format"] == "mp3"
    assert _mp3_seconds(audio["input_audio"]["data"]) == pytest.approx(3.0, abs=0.1)
    assert LOCAL_CAPTION not in seen.body.decode()
    assert result.fields["key"] == "C minor" and result.provider == "openai"


def test_provider_errors_surface_after_retries(fake_http, song):
    fake_http.handler = lambda seen: fake_http.Reply(500, {"error": "boom"})
    provider = GeminiCaptioner("k", base_url=fake_http.url, http=_http(), send_audio=False)
    with pytest.raises(ProviderError, match="gave up after 3"):
        provider.caption(song)
    fake_http.handler = lambda seen: {"candidates": [], "promptFeedback": {"blockReason": "SAFETY"}}
    with pytest.raises(ProviderError, match="SAFETY"):
        provider.caption(song)
    fake_http.handler = lambda seen: _gemini_answer("genre: rock\nbpm: 99")
    with pytest.raises(ProviderError, match="without a caption"):
        provider.caption(song)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (FIVE_LINES, {"genre", "caption", "bpm", "key", "signature"}),
        (
            '```json\n{"genre": ["rock", "indie"], "caption": "Guitars.", "bpm": "N/A"}\n```',
            {"genre", "caption"},
        ),
        (
            'Sure! Here it is: {"caption": "Warm pads.", "key": "D major"} Enjoy.',
            {"caption", "key"},
        ),
        ("{'caption': 'Python dict.', 'tempo': 101}", {"caption", "bpm"}),
        ("A soft piano piece with strings.\n**Genre:** classical\nkey: N/A", {"caption", "genre"}),
        ("- caption: One.\n- caption: Two.\n- time signature: 3/4", {"caption", "signature"}),
        ("Just a description with no labels.", {"caption"}),
        ({"description": "A mapping already.", "genres": "pop"}, {"caption", "genre"}),
    ],
)
def test_parse_chain(raw, expected):
    assert set(parse_caption_response(raw)) == expected


def test_parse_details():
    assert parse_caption_response("- caption: One.\n- caption: Two.")["caption"] == "One."
    prose = parse_caption_response("A soft piano piece.\ngenre: classical")
    assert prose["caption"] == "A soft piano piece."
    assert parse_caption_response("N/A") == {}
    fields = normalize_fields(
        {
            "caption": "Line one\r\nline\u200b two",
            "bpm": "about 98.6 bpm",
            "signature": "6",
            "key": "F# Major",
        }
    )
    assert fields == {
        "caption": "Line one line two",
        "bpm": 99,
        "signature": "6/8",
        "key": "F# major",
    }
    assert normalize_fields({"bpm": "999", "key": "G", "signature": "5"}) == {}


def test_offline_captioner_writes_from_the_analysis(tmp_path, song_writer):
    song_writer(tmp_path / "s.wav", SongSpec("t", 124, "E", "minor", 6.0, 3))
    features, _ = EssentiaAnalyzer().analyze(Storage(tmp_path), "s.wav")
    request = CaptionRequest(sample_id="x", features=features, lyrics="[Verse]\nhello")
    caption = OfflineCaptioner().caption(request).fields["caption"]
    assert caption.startswith("Upbeat song with vocals built on")
    assert not any(ch.isdigit() for ch in caption)  # no tempo or key numbers in the text
    assert 15 <= len(caption.split()) <= 60
    with pytest.raises(ProviderError, match="needs the audio analysis"):
        OfflineCaptioner().caption(CaptionRequest(sample_id="x"))


def test_providers_from_the_environment():
    env = {
        "GEMINI_API_KEY": "g",
        "GEMINI_BASE_URL": "http://127.0.0.1:9/v1beta",
        "OPENAI_MODEL": "m",
    }
    gemini = make_captioner("gemini", env=env)
    assert isinstance(gemini, GeminiCaptioner) and gemini.base_url == "http://127.0.0.1:9/v1beta"
    assert make_captioner("gemini", model="x", env=env).model == "x"
    with pytest.raises(ProviderError, match="OPENAI_API_KEY"):
        make_captioner("openai", env=env)
    with pytest.raises(ProviderError, match="unknown caption provider"):
        make_captioner("moss", env=env)
    assert isinstance(make_captioner("offline", env={}), OfflineCaptioner)
