"""Band-limited resampling in torch: a Kaiser-windowed sinc applied as a polyphase filter bank.

No scipy/torchaudio/librosa in the environment, and the ratio we need most (44.1 -> 48 kHz) is
rational, so this is the textbook exact-ratio design: reduce the ratio to `up / down` (e.g.
160 / 147), build one FIR phase per output position inside a period of `up` outputs, and run the
bank over a strided view of the input (period q reads the window starting at q * down) whose
phases are then interleaved. Output sample k sits at input position k * down / up exactly, so
pitch is preserved to floating-point precision (no drift, no accumulated phase error over a
4-minute song).

The bank runs as GEMMs, not a strided `conv1d`: each phase's filter is nonzero on only ~2·half
of the bank's `down + 2·half` taps (69 of 215 at 44.1 -> 48 kHz), so the phases are split into
`PHASE_GROUPS` groups, each multiplying only the tap range its phases use. One 240 s stereo
song at 44.1 kHz on one thread (`bench/decode_bench.py`, docs/BENCHMARKS.md): the whole bank as
one conv1d 0.47 s, 4 groups 0.21 s (1, 8, 16 groups: 0.34 / 0.26 / 0.39 s). A decode task runs
on one CPU, so this sets how many CPU cores keep one GPU's encoder fed.

Quality (defaults): 32 zero crossings each side, cutoff at 0.945 of the lower Nyquist, Kaiser
beta 12 (~ 110 dB stopband). The kernel is computed in float64 and applied in float32.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

ZERO_CROSSINGS = 32  # one-sided filter length, in zero crossings of the lowpass sinc
PHASE_GROUPS = 4  # GEMMs the filter bank is split into (see the module docstring)
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


def resample(
    audio: torch.Tensor,
    orig_hz: int,
    new_hz: int,
    *,
    zero_crossings: int = ZERO_CROSSINGS,
    rolloff: float = ROLLOFF,
    beta: float = KAISER_BETA,
) -> torch.Tensor:
    """[C, T] float audio at `orig_hz` -> [C, ceil(T * new_hz / orig_hz)] float32 at `new_hz`.

    Samples outside the signal count as zero, so the first and last ~`zero_crossings` output
    samples see a one-sided filter (as every FIR resampler does).
    """
    if audio.ndim != 2:
        raise ValueError(f"expected [C, T] audio, got shape {tuple(audio.shape)}")
    if orig_hz <= 0 or new_hz <= 0:
        raise ValueError(f"sample rates must be positive, got {orig_hz} -> {new_hz}")
    audio = audio.to(torch.float32)
    if orig_hz == new_hz:
        return audio.clone()
    gcd = math.gcd(int(orig_hz), int(new_hz))
    up, down = int(new_hz) // gcd, int(orig_hz) // gcd
    channels, length = audio.shape
    out_length = math.ceil(length * up / down)
    if length == 0:
        return audio.new_zeros(channels, 0)
    half, taps, groups = _phase_groups(up, down, zero_crossings, float(rolloff), float(beta))
    periods = math.ceil(out_length / up)  # outputs needed per phase
    # Left pad so tap 0 of period 0 reads x[-half]; right pad so the last period is complete.
    right = max(0, (periods - 1) * down + taps - half - length)
    padded = torch.nn.functional.pad(audio, (half, right)).contiguous()  # [C, T']
    out = audio.new_empty(channels, periods, up)  # period q, phase i -> output q * up + i
    for first, last, lo, hi, weights in groups:
        for channel in range(channels):
            row = padded[channel]
            # [periods, hi - lo] view: row q holds the taps lo..hi-1 of period q (no copy)
            windows = row.as_strided((periods, hi - lo), (down, 1), row.storage_offset() + lo)
            out[channel, :, first:last] = windows @ weights  # [periods, phases of the group]
    return out.reshape(channels, -1)[:, :out_length].contiguous()


@lru_cache(maxsize=16)
def _phase_groups(
    up: int, down: int, zero_crossings: int, rolloff: float, beta: float
) -> tuple[int, int, tuple[tuple[int, int, int, int, torch.Tensor], ...]]:
    """(half, the bank's taps, groups): `PHASE_GROUPS` groups of consecutive phases, each
    (first phase, end phase, first tap, end tap, float32 weights [taps, phases]): the union of
    the group's nonzero taps and its filters restricted to them, transposed for
    `windows @ weights`."""
    bank, half = _filter_bank(up, down, zero_crossings, rolloff, beta)  # [up, taps] float64
    size = -(-up // min(up, PHASE_GROUPS))
    groups = []
    for first in range(0, up, size):
        last = min(up, first + size)
        used = (bank[first:last] != 0).any(0).nonzero().squeeze(1)
        lo, hi = int(used[0]), int(used[-1]) + 1
        weights = bank[first:last, lo:hi].t().to(torch.float32).contiguous()
        groups.append((first, last, lo, hi, weights))
    return half, bank.shape[1], tuple(groups)
