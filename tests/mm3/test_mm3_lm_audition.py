"""MM3 audition with a composer-LM LoRA (tiny MM3, CPU): the adapter side is composed by the
adapted LM (same seed), the base side is untouched, scale 0 is the base composer."""

from __future__ import annotations

import pytest
import torch

from hotstep_ray.audition.errors import NotFoundError
from hotstep_ray.core import layout
from hotstep_ray.core.storage import Storage
from hotstep_ray.mm3 import checkpoint as ckpt
from hotstep_ray.mm3.audition import Mm3Audition, Mm3AuditionRequest
from hotstep_ray.mm3.lm_train import LM_TARGETS
from hotstep_ray.training import adapters, export

pytestmark = pytest.mark.slow
REQUEST = dict(caption="Global Metadata: calm lo-fi", lyrics="", duration_s=1.6, steps=2, seed=7)


def write_lm_lora(storage: Storage, checkpoints, name: str = "band", rank: int = 4) -> str:
    """A random, clearly non-zero composer LoRA as `mm3 train-lm` exports it; returns the run."""
    lm = ckpt.load_language_model(ckpt.Mm3Paths.find(checkpoints), torch.float32)
    adapters.inject(
        lm, adapters.AdapterSpec(kind="lora", rank=rank, alpha=rank, targets=LM_TARGETS)
    )
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for _, param in adapters.trainable_parameters(lm):
            param.copy_(2.0 * torch.randn(param.shape, generator=gen))
    run = layout.new_mm3_lm_run_dir(storage, name)
    export.export_lora(lm, storage, run)
    return run


def test_lm_adapter_recomposes_the_adapter_side_only(mm3_checkpoints, tmp_path):
    storage = Storage(tmp_path / "data")
    run = write_lm_lora(storage, mm3_checkpoints)
    engine = Mm3Audition(mm3_checkpoints, storage, device="cpu")
    plain = engine.generate(Mm3AuditionRequest(**REQUEST))
    ab = engine.generate(Mm3AuditionRequest(**REQUEST, lm_adapter="band"))  # name -> newest run
    assert ab.lm_adapter_key == run and ab.adapter_key is None
    assert ab.audio["base"] == plain.audio["base"]  # base composer + base DiT, same seed
    assert ab.audio["adapter"] != ab.audio["base"]  # a different composition
    assert "compose_adapter" in ab.timings_ms and ab.to_json_dict()["lmAdapter"] == run
    zero = engine.generate(Mm3AuditionRequest(**REQUEST, lm_adapter=run, lm_adapter_scale=0.0))
    assert zero.audio["adapter"] == plain.audio["base"]  # scale 0 is the base composer
    with pytest.raises(NotFoundError):
        engine.generate(Mm3AuditionRequest(**REQUEST, lm_adapter="nobody"))
