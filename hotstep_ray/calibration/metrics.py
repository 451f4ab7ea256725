"""Calibration metrics: how close generated output comes to the dataset, and the guards.

LM (5 Hz FSQ codes, 0 <= c < 64000; 5 codes = 1 s of audio)

- Marginal distance D_marg = JS(P, Q), P and Q the empirical code histograms of the generated
  sequences and of the dataset songs (every code of every sequence counted once).
- Transition distance D_trans = JS(P2, Q2), P2 and Q2 the empirical histograms of consecutive code
  pairs (c_t, c_t+1) counted inside each sequence (never across two songs or two generations):
  the joint bigram distribution, which carries the transition structure P(c_t+1 | c_t).
- JS(P, Q) = ½ Σ_k p_k log2(p_k / m_k) + ½ Σ_k q_k log2(q_k / m_k), m = (p + q) / 2, in bits:
  0 iff P = Q, 1 iff the supports are disjoint. No smoothing: JS stays finite with empty bins
  (m_k > 0 wherever a term is nonzero), and additive smoothing over 64,000 (or 64,000²) bins would
  swamp a few thousand codes. Sums run over the union of the observed keys only, so the cost is
  linear in the number of codes. An empty side (no codes, or no pairs) scores the maximum, 1.
- Score = D_marg + D_trans in [0, 2] bits; lower is better (HOT-Step picks the minimum sum).
- Memorisation guard: the longest run of generated codes equal to a contiguous run of one training
  song (a suffix automaton over the songs, exact, linear time). It trips when the run is longer
  than 25 codes = 5 s (`MEMORISATION_LIMIT_CODES`): a 5 s run passes, 5.2 s does not.
- Length guard: mean generated codes of a grid point / mean of the base model on the same prompts
  and seeds; it passes at >= 0.6 (`LENGTH_FLOOR`).

DiT (VAE latents, 25 frames/s, 64 channels)

- Each side is a Gaussian fit N(mu, Sigma) of its per-frame 64-d latent vectors (mean and the
  unbiased covariance, float64). Fréchet distance, in squared latent units:
      FD = |mu1 - mu2|² + Tr(S1) + Tr(S2) - 2 Tr((S1 S2)^½)
  with Tr((S1 S2)^½) = Tr((S1^½ S2 S1^½)^½) (similar matrices), both square roots taken by
  symmetric eigendecomposition (eigh) with negative round-off eigenvalues clipped to 0: no complex
  sqrtm, no NaN on rank-deficient covariances. `LatentStats` accumulates (n, mean, M2) with Chan's
  parallel update, so workers ship 64 + 64² numbers per render instead of the frames.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

CODE_HZ = 5  # LM codes per second of audio
MEMORISATION_LIMIT_S = 5.0
MEMORISATION_LIMIT_CODES = int(MEMORISATION_LIMIT_S * CODE_HZ)  # 25
LENGTH_FLOOR = 0.6  # generated length >= 60 % of the base model's
LATENT_DIM = 64


# -- LM: histograms and Jensen-Shannon -----------------------------------------------------------
def code_histogram(sequences: Iterable[Sequence[int]]) -> Counter[int]:
    """Count of every code over all sequences."""
    counts: Counter[int] = Counter()
    for seq in sequences:
        counts.update(int(c) for c in seq)
    return counts


def bigram_histogram(sequences: Iterable[Sequence[int]]) -> Counter[tuple[int, int]]:
    """Count of every consecutive pair (c_t, c_t+1) inside each sequence."""
    counts: Counter[tuple[int, int]] = Counter()
    for seq in sequences:
        values = [int(c) for c in seq]
        counts.update(zip(values[:-1], values[1:], strict=True))
    return counts


def js_divergence(p_counts: Mapping[Hashable, float], q_counts: Mapping[Hashable, float]) -> float:
    """Jensen-Shannon divergence (bits, in [0, 1]) of two histograms given as raw counts.
    Both empty: 0; exactly one empty: 1."""
    p_total = float(sum(p_counts.values()))
    q_total = float(sum(q_counts.values()))
    if p_total <= 0 or q_total <= 0:
        return 0.0 if p_total <= 0 and q_total <= 0 else 1.0
    total = 0.0
    for key in p_counts.keys() | q_counts.keys():
        p = p_counts.get(key, 0) / p_total
        q = q_counts.get(key, 0) / q_total
        m = 0.5 * (p + q)
        if p > 0:
            total += p * math.log2(p / m)
        if q > 0:
            total += q * math.log2(q / m)
    return min(1.0, max(0.0, 0.5 * total))


def marginal_distance(
    generated: Sequence[Sequence[int]], dataset: Sequence[Sequence[int]]
) -> float:
    """D_marg: JS of the code histograms (bits)."""
    return js_divergence(code_histogram(generated), code_histogram(dataset))


def transition_distance(
    generated: Sequence[Sequence[int]], dataset: Sequence[Sequence[int]]
) -> float:
    """D_trans: JS of the in-sequence bigram histograms (bits)."""
    return js_divergence(bigram_histogram(generated), bigram_histogram(dataset))


@dataclass(frozen=True)
class DatasetCodes:
    """The dataset side, counted once and reused for every grid point."""

    songs: tuple[tuple[int, ...], ...]
    names: tuple[str, ...]
    marginal: Counter[int]
    bigrams: Counter[tuple[int, int]]

    @classmethod
    def from_songs(cls, songs: Sequence[Sequence[int]], names: Sequence[str] = ()) -> DatasetCodes:
        seqs = tuple(tuple(int(c) for c in s) for s in songs)
        labels = tuple(names) or tuple(f"song-{i}" for i in range(len(seqs)))
        return cls(seqs, labels, code_histogram(seqs), bigram_histogram(seqs))

    @property
    def total_codes(self) -> int:
        return sum(len(s) for s in self.songs)


# -- LM: memorisation ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Match:
    """The longest generated run found verbatim in a training song."""

    length: int  # codes
    song: int = -1  # index into the indexed songs (-1: no match)
    song_offset: int = 0  # first matching code in the song
    generated_offset: int = 0  # first matching code in the generated sequence

    @property
    def seconds(self) -> float:
        return self.length / CODE_HZ


class CorpusIndex:
    """Suffix automaton over the training songs joined by unique negative separators (a match
    can never span two songs, since generated codes are >= 0). `longest_match` walks a generated
    sequence through it: O(len(songs) + len(generated)) in total."""

    def __init__(self, songs: Sequence[Sequence[int]]) -> None:
        self._len: list[int] = [0]
        self._link: list[int] = [-1]
        self._next: list[dict[int, int]] = [{}]
        self._first: list[int] = [-1]  # corpus position where the state's first occurrence ends
        self._last = 0
        self.starts: list[int] = []  # corpus offset of each song's first code
        pos = 0
        for k, song in enumerate(songs):
            self.starts.append(pos)
            for code in song:
                self._extend(int(code), pos)
                pos += 1
            self._extend(-(k + 1), pos)
            pos += 1

    def _state(self, length: int, link: int, nxt: dict[int, int], first: int) -> int:
        self._len.append(length)
        self._link.append(link)
        self._next.append(nxt)
        self._first.append(first)
        return len(self._len) - 1

    def _extend(self, symbol: int, pos: int) -> None:
        cur = self._state(self._len[self._last] + 1, -1, {}, pos)
        p = self._last
        while p != -1 and symbol not in self._next[p]:
            self._next[p][symbol] = cur
            p = self._link[p]
        if p == -1:
            self._link[cur] = 0
        else:
            q = self._next[p][symbol]
            if self._len[p] + 1 == self._len[q]:
                self._link[cur] = q
            else:
                clone = self._state(
                    self._len[p] + 1, self._link[q], dict(self._next[q]), self._first[q]
                )
                while p != -1 and self._next[p].get(symbol) == q:
                    self._next[p][symbol] = clone
                    p = self._link[p]
                self._link[q] = clone
                self._link[cur] = clone
        self._last = cur

    def longest_match(self, codes: Sequence[int]) -> Match:
        state, length, best = 0, 0, Match(0)
        nxt, link, lens = self._next, self._link, self._len
        for i, raw in enumerate(codes):
            code = int(raw)
            while state and code not in nxt[state]:
                state = link[state]
                length = lens[state]
            if code in nxt[state]:
                state = nxt[state][code]
                length += 1
            else:
                state, length = 0, 0
            if length > best.length:
                start = self._first[state] - length + 1
                song = bisect_right(self.starts, start) - 1
                best = Match(length, song, start - self.starts[song], i - length + 1)
        return best


@dataclass(frozen=True)
class MemorisationResult:
    longest_codes: int
    longest_s: float
    tripped: bool
    song: str = ""  # the song the longest run was copied from
    song_offset_s: float = 0.0
    generation: int = -1  # which generation held it
    limit_codes: int = MEMORISATION_LIMIT_CODES

    def to_dict(self) -> dict[str, Any]:
        return {
            "longest_codes": self.longest_codes,
            "longest_s": self.longest_s,
            "limit_codes": self.limit_codes,
            "limit_s": self.limit_codes / CODE_HZ,
            "tripped": self.tripped,
            "song": self.song,
            "song_offset_s": self.song_offset_s,
            "generation": self.generation,
        }


def memorisation_guard(
    generated: Sequence[Sequence[int]],
    index: CorpusIndex,
    names: Sequence[str] = (),
    limit_codes: int = MEMORISATION_LIMIT_CODES,
) -> MemorisationResult:
    """Longest verbatim copy over all generations; trips when longer than `limit_codes`."""
    best, which = Match(0), -1
    for g, seq in enumerate(generated):
        found = index.longest_match(seq)
        if found.length > best.length:
            best, which = found, g
    song = ""
    if best.song >= 0:
        song = names[best.song] if best.song < len(names) else f"song-{best.song}"
    return MemorisationResult(
        longest_codes=best.length,
        longest_s=best.seconds,
        tripped=best.length > limit_codes,
        song=song,
        song_offset_s=best.song_offset / CODE_HZ,
        generation=which,
        limit_codes=limit_codes,
    )


# -- LM: length ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class LengthResult:
    mean_codes: float
    base_mean_codes: float
    ratio: float  # mean / base mean (1.0 when the base produced nothing)
    passed: bool
    floor: float = LENGTH_FLOOR

    def to_dict(self) -> dict[str, Any]:
        return {
            "mean_codes": self.mean_codes,
            "base_mean_codes": self.base_mean_codes,
            "ratio": self.ratio,
            "floor": self.floor,
            "passed": self.passed,
        }


def length_guard(
    lengths: Sequence[int], base_lengths: Sequence[int], floor: float = LENGTH_FLOOR
) -> LengthResult:
    """Mean generated length (codes) against the base model's; passes at ratio >= `floor`."""
    mean = sum(lengths) / len(lengths) if lengths else 0.0
    base = sum(base_lengths) / len(base_lengths) if base_lengths else 0.0
    ratio = mean / base if base > 0 else 1.0
    return LengthResult(mean, base, ratio, ratio >= floor, floor)


# -- DiT: Gaussian fits and the Fréchet distance -------------------------------------------------
@dataclass
class LatentStats:
    """Running (count, mean, M2 = Σ (x - mean)(x - mean)ᵀ) of d-dim frames, float64."""

    dim: int = LATENT_DIM
    count: int = 0
    mean: np.ndarray = field(default_factory=lambda: np.zeros(0))
    m2: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))

    def __post_init__(self) -> None:
        if self.mean.size == 0:
            self.mean = np.zeros(self.dim)
            self.m2 = np.zeros((self.dim, self.dim))

    @classmethod
    def of(cls, frames: Any) -> LatentStats:
        """Stats of a [N, d] array or tensor (any float dtype)."""
        x = _as_float64(frames)
        if x.ndim != 2:
            raise ValueError(f"frames must be [N, d], got shape {x.shape}")
        mean = x.mean(axis=0) if len(x) else np.zeros(x.shape[1])
        centred = x - mean
        return cls(x.shape[1], len(x), mean, centred.T @ centred)

    def merge(self, other: LatentStats) -> LatentStats:
        """Chan et al.: n = na + nb, δ = mb - ma, mean = ma + δ nb/n, M2 = M2a + M2b + δδᵀ na nb/n."""
        if other.count == 0:
            return self
        if self.count == 0:
            return other
        if other.dim != self.dim:
            raise ValueError(f"cannot merge {self.dim}-d and {other.dim}-d stats")
        n = self.count + other.count
        delta = other.mean - self.mean
        mean = self.mean + delta * (other.count / n)
        m2 = self.m2 + other.m2 + np.outer(delta, delta) * (self.count * other.count / n)
        return LatentStats(self.dim, n, mean, m2)

    def gaussian(self) -> tuple[np.ndarray, np.ndarray]:
        """(mean [d], unbiased covariance [d, d]); needs at least 2 frames."""
        if self.count < 2:
            raise ValueError(f"a Gaussian fit needs >= 2 frames, got {self.count}")
        return self.mean.copy(), self.m2 / (self.count - 1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dim": self.dim,
            "count": self.count,
            "mean": self.mean.tolist(),
            "m2": self.m2.tolist(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LatentStats:
        return cls(
            int(data["dim"]), int(data["count"]), np.asarray(data["mean"]), np.asarray(data["m2"])
        )


def _as_float64(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):  # torch tensor
        x = x.detach().to("cpu").double().numpy()
    return np.asarray(x, dtype=np.float64)


def sqrtm_psd(matrix: Any) -> np.ndarray:
    """Principal square root of a symmetric PSD matrix: V diag(√max(λ, 0)) Vᵀ from eigh (float64;
    the input is symmetrised first)."""
    a = _as_float64(matrix)
    a = 0.5 * (a + a.T)
    values, vectors = np.linalg.eigh(a)
    return (vectors * np.sqrt(np.clip(values, 0.0, None))) @ vectors.T


def trace_sqrt_product(sigma1: Any, sigma2: Any) -> float:
    """Tr((S1 S2)^½) = Tr((S1^½ S2 S1^½)^½) = Σ √max(λ_i, 0), λ of the symmetric middle matrix."""
    root = sqrtm_psd(sigma1)
    middle = root @ _as_float64(sigma2) @ root
    values = np.linalg.eigvalsh(0.5 * (middle + middle.T))
    return float(np.sqrt(np.clip(values, 0.0, None)).sum())


def frechet_distance(mu1: Any, sigma1: Any, mu2: Any, sigma2: Any) -> float:
    """FD between N(mu1, S1) and N(mu2, S2) in squared units (see the module docstring); >= 0."""
    m1, m2 = _as_float64(mu1), _as_float64(mu2)
    s1, s2 = _as_float64(sigma1), _as_float64(sigma2)
    if m1.shape != m2.shape or s1.shape != s2.shape or s1.shape != (m1.size, m1.size):
        raise ValueError(f"shape mismatch: mu {m1.shape}/{m2.shape}, sigma {s1.shape}/{s2.shape}")
    diff = m1 - m2
    value = diff @ diff + np.trace(s1) + np.trace(s2) - 2.0 * trace_sqrt_product(s1, s2)
    return max(0.0, float(value))


def latent_frechet(generated: LatentStats, dataset: LatentStats) -> float:
    """FD between the Gaussian fits of two latent-frame populations."""
    mu1, s1 = generated.gaussian()
    mu2, s2 = dataset.gaussian()
    return frechet_distance(mu1, s1, mu2, s2)
