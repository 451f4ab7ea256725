"""Which analyzers and providers a label job uses, resolved from `LabelOptions` and the env.

The seed's rule: Genius and captions default to on, and a step whose credentials are missing is
skipped with a warning — unless the caller asked for it explicitly (the option was set, or a
caption provider was named), which is an error instead of a silent downgrade. Without a named
provider the caption comes from Gemini when `GEMINI_API_KEY` is set, else an OpenAI-compatible
endpoint when `OPENAI_API_KEY` is set, else the offline captioner.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from hotstep_ray.core.contracts import LabelOptions
from hotstep_ray.core.errors import HotstepError
from hotstep_ray.labeling.analysis import EssentiaAnalyzer, essentia_available
from hotstep_ray.labeling.captions import (
    CaptionProvider,
    make_captioner,
    provider_configured,
)
from hotstep_ray.labeling.genius import TOKEN_ENV, GeniusClient
from hotstep_ray.labeling.http import ProviderError


class ProviderUnavailableError(HotstepError):
    """A step the caller explicitly asked for cannot run (no key, no Essentia)."""


@dataclass(frozen=True)
class Providers:
    analyzer: EssentiaAnalyzer | None = None
    genius: GeniusClient | None = None
    captioner: CaptionProvider | None = None

    @property
    def any(self) -> bool:
        return any((self.analyzer, self.genius, self.captioner))


def auto_caption_provider(env: Mapping[str, str]) -> str:
    for name in ("gemini", "openai"):
        if provider_configured(name, env):
            return name
    return "offline"


def resolve_providers(
    options: LabelOptions, env: Mapping[str, str] | None = None
) -> tuple[Providers, list[str]]:
    """(providers, warnings) for a label job; raises `ProviderUnavailableError` for an explicit
    request that cannot be met."""
    env = os.environ if env is None else env
    asked = options.model_fields_set
    warnings: list[str] = []

    def unavailable(option: str, message: str) -> None:
        if option in asked:
            raise ProviderUnavailableError(message)
        warnings.append(f"{message}; skipped")

    analyzer = None
    if options.use_essentia:
        if essentia_available():
            analyzer = EssentiaAnalyzer(time_limit_s=options.analysis_time_limit_s)
        else:
            unavailable("use_essentia", "Essentia is not installed")

    genius = None
    if options.use_genius:
        genius = GeniusClient.from_env(dict(env))
        if genius is None:
            unavailable("use_genius", f"Genius needs ${TOKEN_ENV}")

    captioner: CaptionProvider | None = None
    if options.use_caption:
        choice = options.caption
        name = choice.provider if choice else auto_caption_provider(env)
        try:
            captioner = make_captioner(name, choice.model if choice else "", env)
        except ProviderError as exc:
            if choice is not None or "use_caption" in asked:
                raise ProviderUnavailableError(str(exc)) from exc
            warnings.append(f"{exc}; captions skipped")
        if captioner is not None and captioner.name == "offline" and analyzer is None:
            # The offline captioner writes from the analysis; without it there is nothing to say.
            unavailable("caption", "the offline captioner needs Essentia analysis")
            captioner = None
    return Providers(analyzer, genius, captioner), warnings
