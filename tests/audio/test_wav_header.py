"""Hand-written WAV headers (`audio.io.wav_header`): what libsndfile reads back."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf

from hotstep_ray.audio.io import wav_header


@pytest.mark.parametrize("sample_format", ["pcm16", "float32"])
def test_libsndfile_reads_back_every_sample(sample_format) -> None:
    rng = np.random.default_rng(0)
    audio = rng.uniform(-1, 1, size=(2, 1000)).astype(np.float32)
    if sample_format == "pcm16":
        data = np.round(audio.T * 32767).astype("<i2").tobytes()
    else:
        data = np.ascontiguousarray(audio.T, dtype="<f4").tobytes()
    blob = wav_header(2, 48_000, 1000, sample_format) + data
    back, rate = sf.read(io.BytesIO(blob), dtype="float32", always_2d=True)
    assert rate == 48_000 and back.shape == (1000, 2)
    # pcm16: the int16 values back over 32768 (libsndfile's scale); float32: bit for bit
    expected = np.round(audio.T * 32767) / 32768 if sample_format == "pcm16" else audio.T
    np.testing.assert_array_equal(back, expected.astype(np.float32))


def test_sixteen_bit_pcm_has_the_canonical_44_byte_header() -> None:
    header = wav_header(1, 44_100, 10, "pcm16")
    assert len(header) == 44 and header[:4] == b"RIFF" and header[36:40] == b"data"
    assert int.from_bytes(header[4:8], "little") == 36 + 20  # RIFF size: all after these 8 bytes
