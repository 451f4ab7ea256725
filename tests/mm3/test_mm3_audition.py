"""MM3 audition on the plain class (tiny MM3, CPU): same seed A/B, base side byte-identical to a
run of a DiT that never carried an adapter, adapter side different and reproducible."""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
from mm3_helpers import write_lora

from hotstep_ray.audition.errors import NotFoundError
from hotstep_ray.core.storage import Storage
from hotstep_ray.mm3.audition import Mm3Audition, Mm3AuditionRequest, file_rank

pytestmark = pytest.mark.slow
REQUEST = dict(caption="Global Metadata: calm lo-fi", lyrics="", duration_s=1.6, steps=2, seed=7)


@pytest.fixture(scope="module")
def audition(mm3_checkpoints, tmp_path_factory):
    storage = Storage(tmp_path_factory.mktemp("data"))
    run = write_lora(storage, mm3_checkpoints)
    engine = Mm3Audition(mm3_checkpoints, storage, device="cpu")
    return engine, run


def test_base_side_is_byte_identical_and_the_adapter_changes_the_audio(audition):
    engine, run = audition
    plain = engine.generate(Mm3AuditionRequest(**REQUEST))  # the DiT has never held an adapter
    assert list(plain.audio) == ["base"] and plain.adapter_key is None
    ab = engine.generate(Mm3AuditionRequest(**REQUEST, adapter="band"))  # artist -> newest run
    assert ab.adapter_key == f"{run}/mm3_lora.safetensors"
    assert ab.audio["base"] == plain.audio["base"]  # WAV bytes
    base, rate = sf.read(__import__("io").BytesIO(ab.audio["base"]), dtype="float32")
    adapted, _ = sf.read(__import__("io").BytesIO(ab.audio["adapter"]), dtype="float32")
    assert rate == 44_100 and base.shape == adapted.shape and base.shape[1] == 2
    assert np.abs(base - adapted).max() > 1e-4  # the LoRA is heard
    again = engine.generate(Mm3AuditionRequest(**REQUEST, adapter=run))  # run folder key
    assert again.audio == ab.audio  # same seed, same bytes on both sides
    half = engine.generate(Mm3AuditionRequest(**REQUEST, adapter=run, adapter_scale=0.0))
    assert half.audio["adapter"] == ab.audio["base"]  # scale 0 is the base model


def test_unknown_adapter_is_not_found_and_rank_is_read_from_the_file(audition):
    engine, _ = audition
    with pytest.raises(NotFoundError, match="no MM3 LoRA 'nobody'"):
        engine.generate(Mm3AuditionRequest(**REQUEST, adapter="nobody"))
    from safetensors.torch import load

    data = engine.storage.read_bytes(engine.adapter_key)
    assert file_rank(load(data), None) == 4 == file_rank({}, {"rank": "4"})
