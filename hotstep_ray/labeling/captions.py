"""Caption providers: Gemini and OpenAI-compatible models that hear the song, and an offline
captioner that writes from the analysis alone (the embedded default: no network, no key).

A provider takes a `CaptionRequest` and returns a `CaptionResult` of normalised fields (caption,
genre, bpm, key, signature). Providers are plain picklable objects so a Ray actor can hold one.
Keys come from the environment (`GEMINI_API_KEY`, `OPENAI_API_KEY`); base URLs and models are
options (env `GEMINI_BASE_URL`/`OPENAI_BASE_URL`/`*_MODEL` as fallbacks).
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from hotstep_ray.audio.io import load_audio
from hotstep_ray.core.storage import Storage
from hotstep_ray.labeling.analysis import AudioFeatures
from hotstep_ray.labeling.audio_prep import encode_mp3
from hotstep_ray.labeling.caption_prompt import (
    SYSTEM_PROMPT,
    PromptFacts,
    build_user_prompt,
    normalize_fields,
    parse_caption_response,
)
from hotstep_ray.labeling.http import HttpClient, ProviderError

MAX_INLINE_AUDIO_BYTES = 15 * 1024 * 1024  # Gemini's inline-data budget, with headroom
# 96 kbps fills 15 MB in ~21 minutes; longer songs are cut there rather than refused.
MAX_AUDIO_S = MAX_INLINE_AUDIO_BYTES * 8 / 96_000 * 0.95
DEFAULT_TEMPERATURE = 0.45
DEFAULT_TOP_P = 0.9


@dataclass(frozen=True)
class CaptionRequest:
    sample_id: str
    title: str = ""
    artist: str = ""
    bpm: int | None = None
    key: str = ""
    signature: str = ""
    local_caption: str = ""
    lyrics: str = ""  # the lyrics this pass settled on (for the excerpt and vocal wording)
    is_instrumental: bool | None = None  # None: not known
    features: AudioFeatures | None = None
    analysis_error: str = ""  # why there are no features, when the analysis failed
    source_url: str = ""  # folder of the song, for providers that listen
    rel_path: str = ""
    include_lyrics_excerpt: bool = True

    def facts(self) -> PromptFacts:
        return PromptFacts(
            self.title,
            self.artist,
            self.bpm,
            self.key,
            self.signature,
            self.local_caption,
            self.lyrics,
        )


@dataclass(frozen=True)
class CaptionResult:
    fields: dict[str, Any]
    provider: str
    model: str = ""
    audio: bool = False  # whether the model heard the song
    note: str = ""  # e.g. why the audio was not attached


class CaptionProvider(Protocol):
    name: str

    def caption(self, request: CaptionRequest) -> CaptionResult: ...


def load_mp3(request: CaptionRequest) -> bytes:
    """The song as 96 kbps stereo 44.1 kHz MP3, cut to fit the inline-audio budget."""
    audio, rate = load_audio(Storage(request.source_url), request.rel_path, MAX_AUDIO_S)
    data = encode_mp3(audio, rate)
    if len(data) > MAX_INLINE_AUDIO_BYTES:
        raise ProviderError(f"MP3 is {len(data)} bytes, over the inline budget")
    return data


# -- network providers ---------------------------------------------------------------------------
@dataclass(frozen=True)
class _ListeningProvider:
    """Shared flow: encode the song (or fall back to text-only), ask, parse, normalise."""

    api_key: str
    model: str
    base_url: str
    temperature: float = DEFAULT_TEMPERATURE
    send_audio: bool = True
    http: HttpClient = field(default_factory=lambda: HttpClient(timeout_s=120, min_interval_s=0.25))

    name = "listening"

    def for_concurrency(self, copies: int):
        return replace(self, http=self.http.for_concurrency(copies))

    def _ask(self, prompt: str, mp3: bytes | None) -> Any:
        raise NotImplementedError

    def caption(self, request: CaptionRequest) -> CaptionResult:
        mp3, note = None, ""
        if self.send_audio and request.source_url and request.rel_path:
            try:
                mp3 = load_mp3(request)
            except Exception as exc:  # a song we cannot encode still gets a text-only caption
                note = f"audio not attached: {exc}"
        prompt = build_user_prompt(request.facts(), mp3 is not None, request.include_lyrics_excerpt)
        raw = self._ask(prompt, mp3)
        fields = normalize_fields(parse_caption_response(raw))
        if not fields.get("caption"):
            raise ProviderError(f"{self.name} answered without a caption")
        return CaptionResult(fields, self.name, self.model, mp3 is not None, note)


@dataclass(frozen=True)
class GeminiCaptioner(_ListeningProvider):
    model: str = "gemini-2.5-flash"
    base_url: str = "https://generativelanguage.googleapis.com/v1beta"

    name = "gemini"

    def _ask(self, prompt: str, mp3: bytes | None) -> Any:
        parts: list[dict[str, Any]] = []
        if mp3 is not None:
            data = base64.b64encode(mp3).decode("ascii")
            parts.append({"inline_data": {"mime_type": "audio/mpeg", "data": data}})
        parts.append({"text": prompt})
        payload = {
            "systemInstruction": {"parts": [{"text": SYSTEM_PROMPT}]},
            "contents": [{"role": "user", "parts": parts}],
            "generationConfig": {"temperature": self.temperature, "topP": DEFAULT_TOP_P},
        }
        url = f"{self.base_url.rstrip('/')}/models/{self.model}:generateContent"
        data = self.http.post_json(url, payload, {"x-goog-api-key": self.api_key}).json()
        return gemini_text(data)


def gemini_text(data: Any) -> str:
    """The text of the first candidate of a generateContent answer."""
    candidates = data.get("candidates") if isinstance(data, dict) else None
    if not candidates:
        reason = ((data or {}).get("promptFeedback") or {}).get("blockReason", "no candidates")
        raise ProviderError(f"Gemini returned no answer ({reason})")
    parts = ((candidates[0] or {}).get("content") or {}).get("parts") or []
    text = "".join(str(p.get("text", "")) for p in parts if isinstance(p, dict))
    if not text.strip():
        reason = candidates[0].get("finishReason", "empty")
        raise ProviderError(f"Gemini returned an empty answer ({reason})")
    return text


@dataclass(frozen=True)
class OpenAICaptioner(_ListeningProvider):
    """Any OpenAI-compatible `chat/completions` endpoint that accepts `input_audio` parts."""

    model: str = "gpt-4o-audio-preview"
    base_url: str = "https://api.openai.com/v1"

    name = "openai"

    def _ask(self, prompt: str, mp3: bytes | None) -> Any:
        content: list[dict[str, Any]] = [{"type": "text", "text": prompt}]
        if mp3 is not None:
            audio = {"data": base64.b64encode(mp3).decode("ascii"), "format": "mp3"}
            content.append({"type": "input_audio", "input_audio": audio})
        payload = {
            "model": self.model,
            "temperature": self.temperature,
            "top_p": DEFAULT_TOP_P,
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": content},
            ],
        }
        url = f"{self.base_url.rstrip('/')}/chat/completions"
        auth = {"Authorization": f"Bearer {self.api_key}"}
        return openai_text(self.http.post_json(url, payload, auth).json())


def openai_text(data: Any) -> Any:
    """The message content of the first choice (a string, or a list of text parts joined). A
    `parsed` object (structured outputs) is returned as the mapping it is."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not choices:
        raise ProviderError("OpenAI-compatible endpoint returned no choices")
    message = (choices[0] or {}).get("message") or {}
    if isinstance(message.get("parsed"), dict):
        return message["parsed"]
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    if not content or not str(content).strip():
        raise ProviderError("OpenAI-compatible endpoint returned an empty message")
    return content


# -- offline -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class OfflineCaptioner:
    """A caption composed from the analysis: tempo feel, mood (mode and energy), a guess at the
    instrumentation from the spectrum and the pulse, vocals when lyrics are known, and the mix.
    It never guesses a genre: nothing in the descriptors supports one honestly."""

    name = "offline"
    model = "descriptors-v1"

    def caption(self, request: CaptionRequest) -> CaptionResult:
        features = request.features
        if features is None:
            # Say the real reason: the analysis may have run and failed (bad audio, a timeout).
            why = request.analysis_error or "Essentia analysis is off (enable it: --essentia)"
            raise ProviderError(f"offline captioner needs the audio analysis: {why}")
        return CaptionResult({"caption": compose_caption(features, request)}, self.name, self.model)


def _tempo_word(bpm: int | None) -> str:
    if not bpm:
        return "free-flowing"
    for limit, word in ((70, "slow"), (95, "laid-back"), (115, "mid-tempo"), (140, "upbeat")):
        if bpm < limit:
            return word
    return "fast"


def _mood(scale: str, energy: float) -> str:
    if scale == "minor":
        return "dark, driving" if energy >= 0.55 else "moody, melancholic"
    return "bright, uplifting" if energy >= 0.55 else "warm, easygoing"


def _instruments(d: Mapping[str, float]) -> list[str]:
    parts: list[str] = []
    pulse, onsets = d.get("danceability", 0.0), d.get("onset_rate", 0.0)
    if pulse >= 0.5 and onsets >= 1.0:
        parts.append("punchy drums" if d.get("energy", 0.0) >= 0.4 else "a steady drum groove")
    elif onsets >= 1.0:
        parts.append("loose percussion")
    bass = d.get("bass_share", 0.0)
    if bass >= 0.45:
        parts.append("a heavy, deep bass line")
    elif bass >= 0.15:
        parts.append("a round bass line")
    if d.get("treble_share", 0.0) >= 0.2:
        parts.append("shimmering cymbals and bright top end")
    brightness = d.get("brightness_hz", 0.0)
    if d.get("flatness", 1.0) < 0.2:  # tonal content dominates: chords and melody
        lead = "a bright melodic lead" if brightness >= 1200 else "warm sustained chords"
        parts.append(lead)
    return parts or ["a sparse arrangement"]


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def compose_caption(features: AudioFeatures, request: CaptionRequest) -> str:
    d = features.descriptors
    energy = float(d.get("energy", 0.5))
    if request.lyrics.strip() and request.is_instrumental is not True:
        kind = "song with vocals"
    elif request.is_instrumental:
        kind = "instrumental"
    else:
        kind = "track"
    first = f"{_tempo_word(features.bpm).capitalize()} {kind} built on {_join(_instruments(d))}."
    mood = _mood(features.scale, energy)
    groove = "a danceable groove" if d.get("danceability", 0.0) >= 0.6 else "an unhurried feel"
    dynamic = float(d.get("dynamic_range_db", 10.0))
    mix = "a dense, compressed mix" if dynamic < 8 else "an open, dynamic mix"
    return f"{first} {mood.capitalize()} mood with {groove} and {mix}."


# -- registry ------------------------------------------------------------------------------------
PROVIDERS = ("offline", "gemini", "openai")
_ENV = {
    "gemini": ("GEMINI_API_KEY", "GEMINI_BASE_URL", "GEMINI_MODEL", GeminiCaptioner),
    "openai": ("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_MODEL", OpenAICaptioner),
}


def provider_configured(name: str, env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return name == "offline" or (name in _ENV and bool(env.get(_ENV[name][0], "").strip()))


def make_captioner(
    name: str,
    model: str = "",
    env: Mapping[str, str] | None = None,
    temperature: float = DEFAULT_TEMPERATURE,
) -> CaptionProvider:
    """A provider by name, keys from `env`. Raises `ProviderError` when its key is missing."""
    env = os.environ if env is None else env
    if name == "offline":
        return OfflineCaptioner()
    if name not in _ENV:
        raise ProviderError(f"unknown caption provider {name!r}; choose one of {PROVIDERS}")
    key_env, base_env, model_env, cls = _ENV[name]
    key = env.get(key_env, "").strip()
    if not key:
        raise ProviderError(f"caption provider {name!r} needs ${key_env}")
    options: dict[str, Any] = {"api_key": key, "temperature": temperature}
    if model or env.get(model_env):
        options["model"] = model or env[model_env]
    if env.get(base_env):
        options["base_url"] = env[base_env]
    return cls(**options)
