"""MM3 DiT LoRA on Ray Train (CPU worker, gloo, a fake VRAM_GB of 24 on a 2-CPU node): the VRAM
request gates placement, and a killed worker resumes from the last reported checkpoint and ends
with the adapter an uninterrupted run makes. (The CLI wiring and the request size: test_mm3_vram.)"""

from __future__ import annotations

import json

import pytest
import torch
from mm3_helpers import write_cache
from safetensors.torch import load as load_safetensors

from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage
from hotstep_ray.mm3.ray_train import train_mm3_on_ray
from hotstep_ray.mm3.tiny import COND_DIM
from hotstep_ray.mm3.train import Mm3TrainOptions, run_train_dit

pytestmark = [pytest.mark.slow, pytest.mark.ray]
SLUG = "band"


@pytest.fixture(scope="module")
def cluster():
    """Its own one-node cluster declaring VRAM_GB 24; a session Ray instance started earlier is
    stopped for the module and started again afterwards."""
    import ray
    from ray.cluster_utils import Cluster

    from hotstep_ray.distributed.runtime import ensure_ray

    had_session = ray.is_initialized()
    if had_session:
        ray.shutdown()
    nodes = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"VRAM_GB": 24}}
    )
    ray.init(address=nodes.address, logging_level="WARNING", log_to_driver=False)
    yield nodes
    ray.shutdown()
    nodes.shutdown()
    if had_session:
        ensure_ray(num_cpus=2)


@pytest.fixture
def storage(tmp_path) -> Storage:
    store = Storage(tmp_path / "data")
    gen = torch.Generator().manual_seed(3)
    songs = [
        (
            f"song{i}",
            torch.randn(128, 96, generator=gen),
            torch.randn(96, COND_DIM, generator=gen),
            [(0, 48), (48, 96)],  # a seam at 48: crops of 32 stay on one side
        )
        for i in range(2)
    ]
    write_cache(store, SLUG, "v", songs)
    return store


def options(**overrides) -> Mm3TrainOptions:
    values = dict(
        variant_key="v",
        rank=4,
        alpha=4.0,
        learning_rate=1e-2,
        steps=6,
        crop_latents=32,
        dtype="float32",
        device="cpu",
        delta_every=0,
        save_every=2,
    )
    return Mm3TrainOptions(**{**values, **overrides})


def lora(storage: Storage, run_key: str) -> dict[str, torch.Tensor]:
    return load_safetensors(storage.read_bytes(f"{run_key}/mm3_lora_unfiltered.safetensors"))


def test_a_killed_worker_resumes_and_ends_where_an_uninterrupted_run_ends(
    cluster, storage, mm3_checkpoints
) -> None:
    result = train_mm3_on_ray(
        options(),
        storage,
        SLUG,
        str(mm3_checkpoints),
        vram_gb=8,
        max_failures=1,
        fail_at_step=4,  # the worker dies once the step-4 checkpoint is registered
    )
    worker = json.loads(storage.read_text(f"{result.run_key}/workers/rank-0.json"))
    assert not worker["first_attempt"] and worker["resumed_from"] == [4]
    assert result.metrics["step"] == 6 and result.checkpoint_path
    assert result.run_key.startswith("adapters/mm3-dit/band/")
    report = storage.read_json(f"{result.run_key}/train_report.json")
    assert report["resumed_from"] == [4] and len(report["losses"]) == 6

    plain = run_train_dit(storage, SLUG, str(mm3_checkpoints), options())
    plain_report = storage.read_json(plain["report"])
    # The two runs are separate processes (a Ray worker, this one), so no bit-identity is
    # promised: float32 slack for a loss that is a mean over 128 x 32 latents (u sqrt(4096) ~ 4e-6
    # relative), not assert_close's float64 default for Python floats (1e-7). A resume that loses
    # its optimizer state or schedule moves the later losses far more.
    torch.testing.assert_close(report["losses"], plain_report["losses"], rtol=1e-5, atol=0)
    resumed, uninterrupted = (
        lora(storage, result.run_key),
        lora(storage, plain["lora"].rsplit("/", 1)[0]),
    )
    assert resumed.keys() == uninterrupted.keys()
    moved = [k for k in resumed if k.endswith("lora_B.weight") and resumed[k].abs().max() > 0]
    assert moved  # the adapter trained (B starts at zero)
    for key in resumed:  # float32 defaults (rtol 1.3e-6, atol 1e-5); Adam moves B ~lr = 1e-2
        torch.testing.assert_close(resumed[key], uninterrupted[key])


def test_a_request_no_node_offers_fails_at_once(cluster, storage, mm3_checkpoints) -> None:
    with pytest.raises(InputError, match="largest node offers 24"):
        train_mm3_on_ray(options(), storage, SLUG, str(mm3_checkpoints), vram_gb=80)
