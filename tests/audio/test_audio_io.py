"""`encode_audio` writes long audio in every format it is asked for (block writes: one libsndfile
write of a minute of Vorbis crashes the process)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

ENCODE_70_S_OF_OGG = textwrap.dedent(
    """
    import io
    import numpy as np
    import soundfile as sf
    from hotstep_ray.audio.io import encode_audio

    audio = 0.05 * np.random.default_rng(0).standard_normal((2, 70 * 48000)).astype(np.float32)
    data, rate = sf.read(io.BytesIO(encode_audio(audio, 48000, "OGG")))
    print(data.shape, rate)
    """
)


def test_seventy_seconds_of_ogg_encode_and_decode_back() -> None:
    """In a child process, so a crash of the encoder fails this test instead of the suite."""
    done = subprocess.run(
        [sys.executable, "-c", ENCODE_70_S_OF_OGG], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.strip() == "(3360000, 2) 48000"
