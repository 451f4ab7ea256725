"""Metrics on constructed cases: JS distances, memorisation and length guards, Fréchet distance."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from hotstep_ray.calibration import metrics


def _songs(count: int, length: int, seed: int, low: int = 0, high: int = 64000) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(low, high) for _ in range(length)] for _ in range(count)]


# -- Jensen-Shannon distances --------------------------------------------------------------------
def test_identical_distributions_score_zero():
    songs = _songs(3, 200, seed=1, high=50)
    # Exact: p == q bin by bin (c/N and 2c/2N are the same correctly rounded float64), so every
    # log2(p / m) is log2(1) = 0. Pure Python arithmetic: the same on every CPU.
    assert metrics.marginal_distance(songs, songs) == 0.0
    assert metrics.transition_distance(songs, songs) == 0.0
    # Same histogram at another sample size (each song twice) is the same distribution.
    assert metrics.marginal_distance(songs + songs, songs) == 0.0
    assert metrics.transition_distance(songs + songs, songs) == 0.0


def test_disjoint_distributions_score_the_maximum():
    low, high = _songs(2, 100, seed=2, high=100), _songs(2, 100, seed=3, low=1000, high=1100)
    # Disjoint: log2(p / m) = log2(2) = 1 exactly, so JS = ½ (Σ p + Σ q): float64 sums of <= 200
    # probabilities, round-off <= 200 eps_f64 ~ 4e-14.
    assert metrics.marginal_distance(low, high) == pytest.approx(1.0, abs=1e-12)
    assert metrics.transition_distance(low, high) == pytest.approx(1.0, abs=1e-12)
    assert metrics.marginal_distance([], high) == 1.0  # nothing generated: the maximum
    assert metrics.transition_distance([[5]], high) == 1.0  # no pairs at all


def test_js_matches_the_closed_form_and_orders_by_closeness():
    # P = (1/2, 1/2, 0), Q = (0, 1/2, 1/2): M = (1/4, 1/2, 1/4); JS = 1/2 bit (a few float64
    # operations on powers of two: approx's default rel 1e-6 is slack).
    assert metrics.js_divergence({0: 1, 1: 1}, {1: 1, 2: 1}) == pytest.approx(0.5)
    data = _songs(4, 300, seed=4, high=40)
    near = [s[:] for s in data]
    near[0][:30] = [39] * 30
    far = _songs(4, 300, seed=5, high=80)
    assert 0 < metrics.marginal_distance(near, data) < metrics.marginal_distance(far, data)


def test_transitions_see_order_that_the_marginal_does_not():
    data = [list(range(50)) * 4]
    shuffled = [random.Random(0).sample(data[0], len(data[0]))]
    assert metrics.marginal_distance(shuffled, data) == 0.0
    # The sorted cycle has 50 distinct bigrams of 2,500: a random order shares almost none, so JS
    # is near its 1-bit maximum; order-blind bigrams would give 0. (random.Random is the same
    # stream on every platform.)
    assert metrics.transition_distance(shuffled, data) > 0.5


def test_bigrams_never_span_two_sequences():
    counts = metrics.bigram_histogram([[1, 2], [3, 4]])
    assert counts == {(1, 2): 1, (3, 4): 1}


# -- memorisation guard --------------------------------------------------------------------------
def test_a_copied_training_run_trips_the_memorisation_guard():
    songs = _songs(3, 400, seed=6)
    index = metrics.CorpusIndex(songs)
    copied = _songs(1, 50, seed=7)[0] + songs[1][120:160] + _songs(1, 50, seed=8)[0]  # 8 s copy
    result = metrics.memorisation_guard([copied], index, ["a", "b", "c"])
    assert result.tripped and result.longest_codes == 40 and result.longest_s == 8.0
    assert result.song == "b" and result.song_offset_s == 24.0 and result.generation == 0


def test_a_shuffled_training_run_passes_the_memorisation_guard():
    songs = _songs(3, 400, seed=6)
    index = metrics.CorpusIndex(songs)
    shuffled = songs[1][120:160]
    random.Random(1).shuffle(shuffled)
    result = metrics.memorisation_guard([shuffled], index)
    assert not result.tripped and result.longest_codes <= 3


def test_the_limit_is_five_seconds_inclusive_and_runs_do_not_join_songs():
    songs = _songs(2, 100, seed=9)
    index = metrics.CorpusIndex(songs)
    assert not metrics.memorisation_guard([songs[0][10:35]], index).tripped  # 25 codes = 5 s
    assert metrics.memorisation_guard([songs[0][10:36]], index).tripped  # 26 codes
    straddle = songs[0][-20:] + songs[1][:20]  # 20 + 20 codes from two songs: never one run
    assert metrics.CorpusIndex(songs).longest_match(straddle).length == 20


def test_longest_match_agrees_with_brute_force():
    rng = random.Random(3)
    songs = [[rng.randrange(4) for _ in range(60)] for _ in range(3)]
    index = metrics.CorpusIndex(songs)
    for _ in range(20):
        query = [rng.randrange(4) for _ in range(40)]
        brute = max(
            (j - i)
            for song in songs
            for i in range(len(query))
            for j in range(i + 1, len(query) + 1)
            if any(song[k : k + j - i] == query[i:j] for k in range(len(song) - (j - i) + 1))
        )
        found = index.longest_match(query)
        assert found.length == brute
        start = found.song_offset
        assert songs[found.song][start : start + brute] == query[found.generated_offset :][:brute]


# -- length guard --------------------------------------------------------------------------------
def test_length_guard_needs_sixty_percent_of_the_base_length():
    base = [100, 100, 100]
    assert metrics.length_guard([60, 60, 60], base).passed
    # ratios of small integer means in float64: within an ulp or two of the fraction
    assert metrics.length_guard([100, 20, 60], base).ratio == pytest.approx(0.6)
    short = metrics.length_guard([50, 60, 60], base)
    assert not short.passed and short.ratio == pytest.approx(170 / 300)
    assert metrics.length_guard([10], [0]).passed  # a base that produced nothing cannot fail it


# -- Fréchet distance ----------------------------------------------------------------------------
def _spd(dim: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((dim, dim))
    return a @ a.T / dim + 0.1 * np.eye(dim)


def test_frechet_of_identical_gaussians_is_zero():
    mu, sigma = np.arange(64, dtype=float) / 10, _spd(64, 0)
    # float64 round-off of 2 Tr(S) - 2 Σ √eig(S^½ S S^½) (LAPACK's order differs by CPU): each
    # eigenvalue λ² of S² (<= 17) is off by <~ d eps_f64 ||S²|| ~ 2e-13, its root λ by that / 2λ
    # (λ >= 0.1), 2 x 64 of them: <~ 2e-10.
    assert metrics.frechet_distance(mu, sigma, mu, sigma) == pytest.approx(0.0, abs=1e-8)


def test_frechet_matches_the_closed_form_for_known_gaussians():
    # Diagonal covariances commute: FD = |mu1 - mu2|² + Σ (√a_i - √b_i)².
    mu1, mu2 = np.zeros(3), np.array([1.0, 2.0, 2.0])
    a, b = np.array([1.0, 4.0, 9.0]), np.array([4.0, 1.0, 9.0])
    expected = 9.0 + (1 - 2) ** 2 + (2 - 1) ** 2 + 0.0  # float64 on diagonals: default rel 1e-6
    assert metrics.frechet_distance(mu1, np.diag(a), mu2, np.diag(b)) == pytest.approx(expected)
    # 1-D: (m1 - m2)² + (s1 - s2)².
    assert metrics.frechet_distance([0.0], [[4.0]], [3.0], [[1.0]]) == pytest.approx(9 + 1)


def test_frechet_matches_a_float64_reference_on_full_covariances():
    """Reference: Tr((S1 S2)^½) as Σ √λ over the (real, >= 0) eigenvalues of the non-symmetric
    product S1 S2 (np.linalg.eigvals, float64): a different route than the eigh-based one."""
    s1, s2 = _spd(64, 1), _spd(64, 2)
    rng = np.random.default_rng(3)
    mu1, mu2 = rng.standard_normal(64), rng.standard_normal(64)
    roots = np.sqrt(np.clip(np.linalg.eigvals(s1 @ s2).real, 0, None)).sum()
    reference = float((mu1 - mu2) @ (mu1 - mu2) + np.trace(s1) + np.trace(s2) - 2 * roots)
    value = metrics.frechet_distance(mu1, s1, mu2, s2)
    # Two float64 routes: the non-symmetric eigvals are off by <~ d eps_f64 ||S1 S2|| κ(S1^½)
    # ~ 1e-12 each, roots amplify by 1 / 2√λ_min, 64 of them against FD ~ 2e2: <~ 1e-11 relative.
    assert value == pytest.approx(reference, rel=1e-9)
    # float32 inputs (torch) go through float64 too. Rounding S1 to float32 moves each entry by
    # <= 2^-24 relative: |δFD| <~ 2^-24 Σ|S1_ij| (~5e2) x ||∂FD/∂S1|| (~2) ~ 6e-5, ~3e-7 of FD.
    as_torch = metrics.frechet_distance(
        torch.tensor(mu1), torch.tensor(s1, dtype=torch.float32), mu2, s2
    )
    assert as_torch == pytest.approx(reference, rel=1e-5)


def test_sqrtm_is_stable_on_rank_deficient_covariances():
    v = np.random.default_rng(4).standard_normal((64, 3))
    low_rank = v @ v.T  # rank 3: eigenvalues round to tiny negatives
    root = metrics.sqrtm_psd(low_rank)
    # eigh reconstruction in float64: <~ d eps_f64 ||A||_2 (~80) ~ 1e-12 per entry (no rtol: the
    # bound is absolute; |A| entries reach ~10).
    assert np.all(np.isfinite(root)) and np.allclose(root @ root, low_rank, rtol=0, atol=1e-8)
    value = metrics.frechet_distance(np.zeros(64), low_rank, np.zeros(64), low_rank)
    # The 61 null-space eigenvalues of S^½ S S^½ are round-off (~1e-12), whose roots (~1e-6) only
    # ever add to Σ √λ, pushing FD below 0, where it is clipped; the three real ones are good to
    # ~d eps_f64 Tr(A) ~ 1e-12.
    assert math.isfinite(value) and value == pytest.approx(0.0, abs=1e-6)


def test_latent_stats_merge_equals_one_fit_and_feeds_frechet():
    rng = np.random.default_rng(5)
    frames = rng.standard_normal((500, 64)) * 2 + 1
    whole = metrics.LatentStats.of(frames)
    parts = metrics.LatentStats.of(frames[:123]).merge(metrics.LatentStats.of(frames[123:]))
    mu, sigma = parts.gaussian()
    assert whole.count == parts.count == 500
    # float64 Chan merge vs one pass: ~n eps_f64 ~ 1e-13 relative, far inside allclose's default
    # (rtol 1e-5); dropping the δδᵀ term would miss by ~1e-3 of the covariance.
    assert np.allclose(mu, frames.mean(axis=0)) and np.allclose(sigma, np.cov(frames.T))
    # identical fits up to float64 round-off: FD <~ 1e-10 (as in the identical-Gaussians test)
    assert metrics.latent_frechet(parts, whole) == pytest.approx(0.0, abs=1e-8)
    shifted = metrics.LatentStats.of(torch.tensor(frames + 0.5, dtype=torch.float32))
    # FD = 64 x 0.5²; float32 storage moves each frame by <= 2^-24 x |x| (<~ 10), so each
    # channel's mean shift by <~ 6e-7: <~ 4e-6 relative on FD (the covariance term is second
    # order). A dropped mean term or wrong shift misses by O(1).
    assert metrics.latent_frechet(shifted, whole) == pytest.approx(64 * 0.25, rel=1e-4)
    with pytest.raises(ValueError):
        metrics.LatentStats.of(frames[:1]).gaussian()
