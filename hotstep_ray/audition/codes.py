"""5 Hz audio codes as the audition takes them: parse, validate, fingerprint.

A code is an FSQ index in [0, 64000) (8*8*8*5*5*5); the LM writes it as the token
`<|audio_code_N|>` (id 151669 + N). 5 codes = 1 s = 25 latent frames = 48,000 samples.
Input is either such a token string, a list of ints, or a `,`/space separated list of ints.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from hotstep_ray.audition.errors import TooLargeError
from hotstep_ray.core.errors import InputError

CODE_HZ = 5  # codes per second
FRAMES_PER_CODE = 5  # 25 Hz latent frames per code
NUM_CODES = 64000  # valid FSQ indices are 0..63999
MAX_SECONDS = 600  # longest decode (the silence latent and the engine's limit: 10 min)
MAX_CODES = MAX_SECONDS * CODE_HZ

_TOKEN = re.compile(r"<\|audio_code_(-?\d+)\|>")
_INTS = re.compile(r"^\s*-?\d+(\s*[,\s]\s*-?\d+)*\s*,?\s*$")


def parse_codes(value: str | Sequence[int]) -> list[int]:
    """Codes from a token string, a CSV/space list of ints, or a list of ints (not validated
    against the codebook: see `validate_codes`). Malformed text raises InputError naming it."""
    if isinstance(value, str):
        text = value.strip()
        if "<|" in text:
            leftover = _TOKEN.sub(" ", text).strip()
            if leftover:
                raise InputError(
                    f"audio_codes: unexpected text {leftover[:40]!r} between <|audio_code_N|> tokens"
                )
            return [int(n) for n in _TOKEN.findall(text)]
        if not text:
            return []
        if not _INTS.match(text):
            bad = next(t for t in re.split(r"[,\s]+", text) if t and not re.fullmatch(r"-?\d+", t))
            raise InputError(f"audio_codes: {bad[:40]!r} is not an integer code")
        return [int(t) for t in re.split(r"[,\s]+", text) if t]
    codes = list(value)
    for i, code in enumerate(codes):
        if isinstance(code, bool) or not isinstance(code, int):
            raise InputError(f"audio_codes[{i}] = {code!r} is not an integer")
    return codes


def validate_codes(codes: Sequence[int], max_seconds: float = MAX_SECONDS) -> None:
    """Raise InputError for an empty list or a code outside [0, 64000), TooLargeError for more
    than `max_seconds` of audio."""
    if not codes:
        raise InputError("audio_codes is empty: nothing to decode")
    limit = int(max_seconds * CODE_HZ)
    if len(codes) > limit:
        raise TooLargeError(
            f"audio_codes has {len(codes)} codes = {len(codes) / CODE_HZ:.1f} s; "
            f"the limit is {max_seconds:g} s ({limit} codes)"
        )
    for i, code in enumerate(codes):
        if not 0 <= code < NUM_CODES:
            raise InputError(
                f"audio code {code} at position {i} is outside the codebook 0..{NUM_CODES - 1}"
            )


def codes_sha1(codes: Sequence[int]) -> str:
    """sha1 of the codes as CSV (`12,7,40321`): the determinism receipt of an A/B side."""
    return hashlib.sha1(",".join(str(int(c)) for c in codes).encode("ascii")).hexdigest()


def codes_text(codes: Sequence[int]) -> str:
    """Codes as the LM's token string."""
    return "".join(f"<|audio_code_{int(c)}|>" for c in codes)


@dataclass
class DecodeResult:
    audio: bytes  # the encoded file
    format: str  # wav | flac
    sample_rate_hz: int
    channels: int
    num_samples: int  # per channel = codes * 9600
    duration_s: float
    codes_count: int
    codes_sha1: str
    decode_ms: float

    def info(self) -> dict:
        """Everything but the audio bytes (for JSON headers and logs)."""
        out = asdict(self)
        out.pop("audio")
        return out
