"""Codes -> WAV without waste: the PCM16 WAV bytes, the tile-sized whole decode, the warm-up
that captures the largest CUDA graph first, and ShapeGraphs giving back eager activations.

CUDA graphs are stood in for on the CPU (a fake capture that replays `fn`), so the ordering and
cache bookkeeping run here; the pinned staging path needs a GPU and is covered by the bench.
"""

from __future__ import annotations

import io
import struct
import wave

import numpy as np
import pytest
import torch

from hotstep_ray.audio.io import wav_header
from hotstep_ray.audition.decode import TiledVaeDecoder, pcm16_wav
from hotstep_ray.models.oobleck_fast import ShapeGraphs

RATE = 48_000


def reference_wav(audio: np.ndarray, rate: int = RATE) -> bytes:
    """The plain recipe in numpy (float32 math, round half to even), written by `wave`."""
    clipped = np.clip(audio.astype(np.float32), np.float32(-1.0), np.float32(1.0))
    pcm = np.rint(clipped * np.float32(32767.0)).astype("<i2")  # [C, T]
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(audio.shape[0])
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(pcm.T.tobytes())  # interleaved [T, C]
    return out.getvalue()


def exact_halves(count: int, seed: int) -> np.ndarray:
    """float32 values v in (-1, 1) whose float32 product v * 32767 is exactly k + 0.5."""
    rng = np.random.default_rng(seed)
    k = rng.integers(-32767, 32767, size=8 * count)
    v = ((k + 0.5) / 32767.0).astype(np.float32)
    product = v * np.float32(32767.0)
    halves = v[product == (k + 0.5)]
    assert len(halves) >= count
    return halves[:count]


def random_audio(channels: int, samples: int, seed: int) -> np.ndarray:
    """[C, T] float32: mostly in range, some beyond +-1, a run of exact .5 products, the ends."""
    rng = np.random.default_rng(seed)
    audio = rng.uniform(-1.3, 1.3, size=(channels, samples)).astype(np.float32)
    flat = audio.reshape(-1)
    halves = exact_halves(min(4096, flat.size // 4), seed)
    flat[: halves.size] = halves
    ends = np.array([1.0, -1.0, 2.5, -7.0], dtype=np.float32)[: flat.size]
    flat[-ends.size :] = ends
    return audio


def test_exact_halves_round_to_even_both_ways():
    """The fixture really hits the tie: products k + 0.5 with even and odd k."""
    halves = exact_halves(512, seed=3)
    floors = np.floor(halves * np.float32(32767.0)).astype(np.int64)
    assert {0, 1} <= set(floors % 2)


@pytest.mark.parametrize(
    ("channels", "samples", "seed"),
    [(2, 48_000 * 3, 0), (2, 37, 1), (1, 1000, 2), (2, 1, 3)],
)
def test_pcm16_wav_matches_the_numpy_reference(channels, samples, seed):
    audio = random_audio(channels, samples, seed)
    data = pcm16_wav(torch.from_numpy(audio), sample_rate_hz=RATE)
    assert data == reference_wav(audio)
    fields = struct.unpack("<4sI4s4sIHHIIHH4sI", data[:44])
    size = channels * samples * 2
    assert fields == (
        *(b"RIFF", 36 + size, b"WAVE", b"fmt ", 16, 1, channels, RATE),
        *(RATE * channels * 2, channels * 2, 16, b"data", size),
    )
    assert len(data) == 44 + size and isinstance(data, bytes)


def test_pcm16_wav_long_then_short_and_other_dtypes():
    """Repeated calls do not leak one song's samples into the next (the staging buffer on
    CUDA is reused); non-float32 input is cast first, as before."""
    long, short = random_audio(2, 96_000, 4), random_audio(2, 500, 5)
    assert pcm16_wav(torch.from_numpy(long)) == reference_wav(long)
    assert pcm16_wav(torch.from_numpy(short)) == reference_wav(short)
    double = torch.from_numpy(long).double()
    assert pcm16_wav(double) == reference_wav(double.float().numpy())
    half = torch.from_numpy(short).bfloat16()
    assert pcm16_wav(half) == reference_wav(half.float().numpy())


def test_pcm16_wav_leaves_its_input_alone():
    """The in-place ops work on the one temporary, never on the caller's audio."""
    audio = torch.from_numpy(random_audio(2, 300, 6))
    before = audio.clone()
    pcm16_wav(audio)
    assert torch.equal(audio, before)


class _NoEvent:
    def record(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass


def test_pinned_staging_is_reused_grown_and_never_shrunk(monkeypatch):
    """The CUDA transfer path with its CUDA parts stood in for (a CPU build has no pinned
    memory): one buffer per device, grown in whole MiB for a longer song, reused for a shorter
    one, and the bytes equal the numpy reference."""
    from hotstep_ray.audition import decode

    made: list[int] = []
    real_empty = torch.empty

    def fake_empty(*size, pin_memory=False, **kwargs):
        if pin_memory:  # the staging buffer: a flat uint8 one
            assert kwargs == {"dtype": torch.uint8} and len(size) == 1
            made.append(size[0])
        return real_empty(*size, **kwargs)

    monkeypatch.setattr(decode, "_STAGING", {})
    monkeypatch.setattr(torch, "empty", fake_empty)
    monkeypatch.setattr(torch.cuda, "Event", _NoEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    gpu = torch.device("cuda", 0)
    with decode._pinned(gpu, 10) as first:
        pass
    with decode._pinned(gpu, 3 << 20) as grown:
        pass
    with decode._pinned(gpu, 100) as again, decode._pinned(torch.device("cuda", 1), 5) as other:
        pass
    assert made == [1 << 20, 3 << 20, 1 << 20] and again is grown and first is not grown
    assert other is not again  # one buffer per device
    made.clear()
    for samples, seed in [(70_000, 7), (900, 8)]:  # long then short through one buffer
        audio = random_audio(2, samples, seed)
        pcm = decode._pcm16(torch.from_numpy(audio))  # CPU tensor: the staging key is "cpu"
        header = wav_header(2, RATE, samples, "pcm16")
        assert decode._pcm16_from_cuda(pcm, header) == reference_wav(audio)
    assert made == [1 << 20]  # 280 kB then 3.6 kB: one buffer


# ----------------------------------------------------------------------------- whole_max


@pytest.fixture
def fresh_vae(tiny_tree):
    from hotstep_ray.models.text_models import load_vae

    return lambda: load_vae(tiny_tree / "vae", device="cpu", dtype=torch.float32)


def test_whole_decode_is_at_most_one_tile(fresh_vae):
    vae = fresh_vae()
    default = TiledVaeDecoder(vae, fast=False)
    assert default.whole_max == default.tile_frames == 768
    assert default.plan(750).tiles == 0  # 30 s: one piece
    assert default.plan(769).tiles == 2  # used to be whole up to 800
    small = TiledVaeDecoder(vae, tile_frames=64, overlap_frames=16, fast=False)
    assert small.whole_max == 64 and small.plan(64).tiles == 0 and small.plan(65).tiles == 2
    assert TiledVaeDecoder(vae, whole_max_frames=1000, fast=False).whole_max == 1000  # old path
    with pytest.raises(ValueError, match="whole_max_frames"):
        TiledVaeDecoder(
            fresh_vae(), tile_frames=64, overlap_frames=16, whole_max_frames=65, fast=True
        )
    fast = TiledVaeDecoder(fresh_vae(), tile_frames=64, overlap_frames=16, fast=True)
    assert fast.whole_max == 64 and fast.plan(64).tiles == 0


# ----------------------------------------------------------------------------- warm


def test_warm_is_a_no_op_without_graphs(decoder, fresh_vae):
    """CPU: no CUDA graphs, so nothing is decoded and nothing captured."""
    assert decoder.vae.fast is None and decoder.warm() == 0.0
    fast = TiledVaeDecoder(fresh_vae(), tile_frames=64, overlap_frames=16, fast=True)
    assert fast.fast is not None and not fast.fast.uses_graphs
    calls = []
    fast._decode = lambda z: calls.append(z.shape)
    assert fast.warm() == 0.0 and calls == []


def test_replica_decoder_is_built_and_warmed(tiny_tree, monkeypatch):
    from hotstep_ray.audition import decode
    from hotstep_ray.audition.decode import replica_codes_decoder

    warmed = []
    monkeypatch.setattr(decode.CodesDecoder, "warm", lambda self: warmed.append(self) or 0.0)
    decoder = replica_codes_decoder(tiny_tree, device="cpu")
    assert isinstance(decoder, decode.CodesDecoder) and warmed == [decoder]


class FakeGraph:
    """CPU stand-in for a captured CUDA graph: replay reruns fn into the static output."""

    def __init__(self, fn, static_in: torch.Tensor, static_out: torch.Tensor) -> None:
        self.fn, self.static_in, self.static_out = fn, static_in, static_out

    def replay(self) -> None:
        self.static_out.copy_(self.fn(self.static_in))


def graphed(decoder: TiledVaeDecoder, monkeypatch, capture_after: int = 2):
    """Put a ShapeGraphs with a fake capture and a recorded cache release under the fast
    decoder's VAE (as on CUDA); returns (captured shapes, released devices)."""
    captured: list[tuple] = []
    released: list[torch.device] = []
    fn = decoder.fast._decode
    graphs = ShapeGraphs(fn, max_graphs=8, capture_after=capture_after)

    def fake_capture(key, x):
        captured.append(key[0])
        static_in = x.clone()
        static_out = fn(static_in)
        graphs.graphs[key] = (FakeGraph(fn, static_in, static_out), static_in, static_out)

    monkeypatch.setattr(graphs, "_capture", fake_capture)
    monkeypatch.setattr(graphs, "_release_cache", released.append)
    monkeypatch.setattr(decoder.fast, "_decode", graphs)
    monkeypatch.setattr(decoder.fast, "uses_graphs", True)
    options = decoder.fast.options.model_copy(update={"capture_after": capture_after})
    monkeypatch.setattr(decoder.fast, "options", options)
    return captured, released


@pytest.mark.parametrize("capture_after", [1, 2, 3])
def test_warm_captures_the_tile_window_before_any_shorter_shape(
    fresh_vae, monkeypatch, capture_after
):
    reference = TiledVaeDecoder(fresh_vae(), tile_frames=64, overlap_frames=16, fast=True)
    tiled = TiledVaeDecoder(fresh_vae(), tile_frames=64, overlap_frames=16, fast=True)
    captured, released = graphed(tiled, monkeypatch, capture_after)
    assert tiled.warm() > 0.0
    assert captured == [(1, 64, 64)]  # [tile_batch, C, tile_frames]: the pool's first graph
    assert len(released) == (1 if capture_after > 1 else 0)  # the first eager call's cache
    short = torch.randn(1, 40, 64, generator=torch.Generator().manual_seed(0))  # whole decode
    long = torch.randn(1, 150, 64, generator=torch.Generator().manual_seed(1))  # 3 windows
    for _ in range(capture_after):
        out_short = tiled.decode(short)
    out_long = tiled.decode(long)
    assert captured == [(1, 64, 64), (1, 64, 40)]  # shorter shapes only after the tile's
    # The fake replay reruns the same fast decode on the same shapes in this process (same kernels
    # and order: bit-identical); atol 1e-6 (~2e-6 of the peak |audio|) is slack, while a stale or
    # wrongly shaped static buffer misses by O(|audio|).
    torch.testing.assert_close(out_short, reference.decode(short), rtol=0, atol=1e-6)
    torch.testing.assert_close(out_long, reference.decode(long), rtol=0, atol=1e-6)


def test_warm_respects_tile_batch(fresh_vae, monkeypatch):
    tiled = TiledVaeDecoder(fresh_vae(), tile_frames=64, overlap_frames=16, tile_batch=2, fast=True)
    captured, _ = graphed(tiled, monkeypatch)
    tiled.warm()
    assert captured == [(2, 64, 64)]  # the largest stack the windows loop hands the VAE
    assert tiled.warm() >= 0.0 and captured == [(2, 64, 64)]  # again: replays, no capture


def test_shape_graphs_release_the_cache_after_each_new_shapes_first_eager_call(monkeypatch):
    released: list[torch.device] = []
    graphs = ShapeGraphs(lambda x: x + 1, max_graphs=1, capture_after=3)

    def fake_capture(key, x):
        graphs.graphs[key] = (FakeGraph(graphs.fn, x.clone(), x + 1), x.clone(), x + 1)

    monkeypatch.setattr(graphs, "_capture", fake_capture)
    monkeypatch.setattr(graphs, "_release_cache", released.append)
    one, two = torch.zeros(1), torch.zeros(2)
    graphs(one)
    assert released == [one.device]  # first sight of (1,): eager, then released
    graphs(one)
    graphs(one)  # third: captured, replayed
    assert len(released) == 1 and len(graphs.graphs) == 1
    graphs(two), graphs(two), graphs(two), graphs(two)  # past max_graphs: eager for ever
    assert len(released) == 2  # once per shape, not per eager call


def test_release_cache_is_a_no_op_on_the_cpu(monkeypatch):
    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(1))
    ShapeGraphs._release_cache(torch.device("cpu"))
    assert emptied == []
    ShapeGraphs._release_cache(torch.device("cuda", 0))
    assert emptied == [1]
