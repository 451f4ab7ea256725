"""Band-limited resampling in torch: a Kaiser-windowed sinc applied as a polyphase filter bank.

No scipy/torchaudio/librosa in the environment, and the ratio we need most (44.1 -> 48 kHz) is
rational, so this is the textbook exact-ratio design: reduce the ratio to `up / down` (e.g.
160 / 147), build one FIR phase per output position inside a period of `up` outputs, and run the
bank over a strided view of the input (period q reads the window starting at q * down) whose
phases are then interleaved. Output sample k sits at input position k * down / up exactly, so
pitch is preserved to floating-point precision (no drift, no accumulated phase error over a
4-minute song).

Where it can, the bank runs as GEMMs, not a strided `conv1d`: each phase's filter is nonzero on
only ~2·half of the bank's `down + 2·half` taps (69 of 215 at 44.1 -> 48 kHz), so the phases are
split into `PHASE_GROUPS` groups, each multiplying only the tap range its phases use. One 240 s
stereo song at 44.1 kHz on one thread (`bench/decode_bench.py`, docs/BENCHMARKS.md): the whole
bank as one conv1d 0.47 s, 4 groups 0.21 s (8, 16 groups: 0.26 / 0.39 s; 1 group spans all 215
taps, so it runs the conv1d, see below). A decode task runs on one CPU, so this sets how many
CPU cores keep one GPU's encoder fed.

A group's GEMM reads a [periods, taps of the group] view of the signal whose rows start `down`
samples apart. That is a valid BLAS matrix (leading dimension `down`) only while the group spans
at most `down` taps; wider, the rows overlap and the matmul first copies the whole view
(periods x taps floats per channel: 4-20x slower than the conv1d on 30 s songs, one thread, and
gigabytes for a 240 s one). Ratios with a small `down` hit that: 8, 16, 24, 32 -> 48 kHz
upsampling (down 1 or 2) and 96 -> 48 kHz (up 1: one phase of 137 nonzero taps, down 2). Those
run the whole bank as one strided conv1d (`resample_whole_bank`, the design before phase
groups); 44.1 and 22.05 kHz (down 147, groups of ~105 taps) keep the GEMMs.

Quality (defaults): 32 zero crossings each side, cutoff at 0.945 of the lower Nyquist, Kaiser
beta 12 (~ 110 dB stopband). The kernel is computed in float64 and applied in float32.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F

ZERO_CROSSINGS = 32  # one-sided filter length, in zero crossings of the lowpass sinc
PHASE_GROUPS = 4  # GEMMs `resample` splits the filter bank into, by default (module docstring)
ROLLOFF = 0.945  # cutoff as a fraction of the lower of the two Nyquist frequencies
KAISER_BETA = 12.0


@lru_cache(maxsize=16)
def _filter_bank(
    up: int, down: int, zero_crossings: int, rolloff: float, beta: float
) -> tuple[torch.Tensor, int]:
    """([up, down + 2 * half] float64 kernel, half) for a reduced ratio up / down.

    Output y[q * up + i] (i = 0..up-1) is centred at input position q * down + i * down / up;
    tap t of phase i multiplies input x[q * down + t - half], so its filter argument is
    (i * down / up) - (t - half), in input samples.
    """
    cutoff = min(1.0, up / down) * rolloff  # cycles per input sample, relative to Nyquist
    half = math.ceil(zero_crossings / cutoff)  # one-sided support in input samples
    taps = torch.arange(down + 2 * half, dtype=torch.float64) - half  # [K] input offsets
    centres = torch.arange(up, dtype=torch.float64) * down / up  # [up] fractional positions
    arg = centres[:, None] - taps[None, :]  # [up, K] distance from each tap, in input samples
    # Kaiser window over [-half, half]; zero outside (the bank is wider than one filter).
    ratio = (arg / half).clamp(-1.0, 1.0)
    window = torch.special.i0(beta * torch.sqrt(1.0 - ratio**2)) / torch.special.i0(
        torch.tensor(beta, dtype=torch.float64)
    )
    window = torch.where(arg.abs() <= half, window, torch.zeros_like(window))
    kernel = cutoff * torch.sinc(cutoff * arg) * window  # unity DC gain per phase (approx.)
    return kernel, half


def _ratio(orig_hz: int, new_hz: int) -> tuple[int, int]:
    """(up, down): `new_hz / orig_hz` in lowest terms."""
    if orig_hz <= 0 or new_hz <= 0:
        raise ValueError(f"sample rates must be positive, got {orig_hz} -> {new_hz}")
    gcd = math.gcd(int(orig_hz), int(new_hz))
    return int(new_hz) // gcd, int(orig_hz) // gcd


def _padded(audio: torch.Tensor, half: int, taps: int, down: int, periods: int) -> torch.Tensor:
    """[C, T] -> [C, half + T + right]: left pad so tap 0 of period 0 reads x[-half], right pad
    so the last period (q = periods - 1, taps q * down .. q * down + taps - 1) is complete."""
    right = max(0, (periods - 1) * down + taps - half - audio.shape[1])
    return F.pad(audio, (half, right))  # a new contiguous tensor


def _whole_bank(
    audio: torch.Tensor, up: int, down: int, zero_crossings: int, rolloff: float, beta: float
) -> torch.Tensor:
    """[C, T] (T > 0) -> [C, ceil(T * up / down)] in the audio's dtype: every tap of the
    [up, taps] bank (zeros included) as one conv1d of `up` output channels, stride `down`."""
    bank, half = _filter_bank(up, down, zero_crossings, rolloff, beta)  # [up, taps] float64
    channels, length = audio.shape
    out_length = math.ceil(length * up / down)
    periods = math.ceil(out_length / up)  # outputs needed per phase
    padded = _padded(audio, half, bank.shape[1], down, periods)  # [C, T']
    weight = bank.to(audio.dtype).unsqueeze(1)  # [up, 1, taps]: one output channel per phase
    phases = F.conv1d(padded.unsqueeze(1), weight, stride=down)[..., :periods]  # [C, up, periods]
    # period q, phase i -> output q * up + i
    return phases.transpose(1, 2).reshape(channels, -1)[:, :out_length].contiguous()


def resample_whole_bank(
    audio: torch.Tensor,
    orig_hz: int,
    new_hz: int,
    *,
    zero_crossings: int = ZERO_CROSSINGS,
    rolloff: float = ROLLOFF,
    beta: float = KAISER_BETA,
) -> torch.Tensor:
    """`resample` as one strided conv1d over the whole filter bank (every tap, zeros included),
    in the audio's dtype (float32, or float64 for a reference): the design before phase groups.
    `resample` runs it where its groups would overlap (`_phase_groups`); the tests and
    `bench/decode_bench.py` compare the groups against it."""
    if audio.ndim != 2:
        raise ValueError(f"expected [C, T] audio, got shape {tuple(audio.shape)}")
    up, down = _ratio(orig_hz, new_hz)
    if not audio.is_floating_point():
        audio = audio.to(torch.float32)
    if up == down:
        return audio.clone()
    if audio.shape[1] == 0:
        return audio.new_zeros(audio.shape[0], 0)
    return _whole_bank(audio, up, down, zero_crossings, float(rolloff), float(beta))


def resample(
    audio: torch.Tensor,
    orig_hz: int,
    new_hz: int,
    *,
    zero_crossings: int = ZERO_CROSSINGS,
    rolloff: float = ROLLOFF,
    beta: float = KAISER_BETA,
    phase_groups: int = PHASE_GROUPS,
) -> torch.Tensor:
    """[C, T] float audio at `orig_hz` -> [C, ceil(T * new_hz / orig_hz)] float32 at `new_hz`.

    Samples outside the signal count as zero, so the first and last ~`zero_crossings` output
    samples see a one-sided filter (as every FIR resampler does). `phase_groups`: GEMMs the
    bank is split into where their windows do not overlap, else the whole bank runs as one
    conv1d (`_phase_groups`); the same values either way, up to float32 rounding.
    """
    if audio.ndim != 2:
        raise ValueError(f"expected [C, T] audio, got shape {tuple(audio.shape)}")
    up, down = _ratio(orig_hz, new_hz)
    audio = audio.to(torch.float32)
    if up == down:
        return audio.clone()
    channels, length = audio.shape
    if length == 0:
        return audio.new_zeros(channels, 0)
    rolloff, beta = float(rolloff), float(beta)
    half, taps, groups = _phase_groups(up, down, zero_crossings, rolloff, beta, phase_groups)
    if groups is None:
        return _whole_bank(audio, up, down, zero_crossings, rolloff, beta)
    out_length = math.ceil(length * up / down)
    periods = math.ceil(out_length / up)  # outputs needed per phase
    padded = _padded(audio, half, taps, down, periods)  # [C, T']
    out = audio.new_empty(channels, periods, up)  # period q, phase i -> output q * up + i
    for first, last, lo, hi, weights in groups:
        for channel in range(channels):
            row = padded[channel]
            # [periods, hi - lo] view: row q holds the taps lo..hi-1 of period q; hi - lo <= down,
            # so the rows do not overlap and BLAS reads it in place (leading dimension down)
            windows = row.as_strided((periods, hi - lo), (down, 1), row.storage_offset() + lo)
            out[channel, :, first:last] = windows @ weights  # [periods, phases of the group]
    return out.reshape(channels, -1)[:, :out_length].contiguous()


def uses_phase_groups(
    orig_hz: int,
    new_hz: int,
    *,
    zero_crossings: int = ZERO_CROSSINGS,
    rolloff: float = ROLLOFF,
    beta: float = KAISER_BETA,
    phase_groups: int = PHASE_GROUPS,
) -> bool:
    """Whether `resample` runs `orig_hz -> new_hz` as phase-group GEMMs; False: the whole bank
    as one conv1d (groups that would overlap, `_phase_groups`) or a copy (equal rates)."""
    up, down = _ratio(orig_hz, new_hz)
    if up == down:
        return False
    groups = _phase_groups(up, down, zero_crossings, float(rolloff), float(beta), phase_groups)
    return groups[2] is not None


@lru_cache(maxsize=16)
def _phase_groups(
    up: int,
    down: int,
    zero_crossings: int,
    rolloff: float,
    beta: float,
    phase_groups: int = PHASE_GROUPS,
) -> tuple[int, int, tuple[tuple[int, int, int, int, torch.Tensor], ...] | None]:
    """(half, the bank's taps, groups): `phase_groups` groups of consecutive phases, each
    (first phase, end phase, first tap, end tap, float32 weights [taps, phases]): the union of
    the group's nonzero taps and its filters restricted to them, transposed for
    `windows @ weights`. Groups None: some group spans more than `down` taps, so its window
    view would have overlapping rows that the matmul copies (module doc); the whole bank then
    runs as one conv1d."""
    if phase_groups < 1:
        raise ValueError(f"phase_groups must be >= 1, got {phase_groups}")
    bank, half = _filter_bank(up, down, zero_crossings, rolloff, beta)  # [up, taps] float64
    size = -(-up // min(up, phase_groups))
    groups = []
    for first in range(0, up, size):
        last = min(up, first + size)
        used = (bank[first:last] != 0).any(0).nonzero().squeeze(1)
        lo, hi = int(used[0]), int(used[-1]) + 1
        if hi - lo > down:
            return half, bank.shape[1], None
        weights = bank[first:last, lo:hi].t().to(torch.float32).contiguous()
        groups.append((first, last, lo, hi, weights))
    return half, bank.shape[1], tuple(groups)
