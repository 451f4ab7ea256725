"""Audition fixtures: one tiny checkpoint tree, a storage root with adapters, loaded classes.

Everything heavy is session-scoped (the tree takes ~4 s, each loader ~1-2 s). Torch runs one
thread here: on the 2-core box two OpenMP threads against other processes are 20x slower.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

LM_RUN = "adapters/lm-06b/band/2026-01-02_03-04-05"
DIT_RUN = "adapters/dit-turbo/crew/2026-02-03_04-05-06"


@pytest.fixture(scope="session")
def runs() -> dict:
    return {"lm": LM_RUN, "dit": DIT_RUN}


@pytest.fixture(scope="session")
def tiny_tree(tmp_path_factory) -> Path:
    from hotstep_ray.models.tiny_tree import make_tiny_tree

    return make_tiny_tree(tmp_path_factory.mktemp("checkpoints"))


def write_lm_lora(tree: Path, folder: Path, seed: int = 1) -> Path:
    """A PEFT LoRA folder (adapter_config.json + adapter_model.safetensors) on the tiny LM with
    clearly nonzero weights, written by peft itself."""
    from peft import LoraConfig, get_peft_model

    from hotstep_ray.models.text_models import load_lm

    lm = load_lm(tree / "acestep-5Hz-lm-0.6B", device="cpu")
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj", "up_proj"])
    model = get_peft_model(lm, config)
    generator = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if "lora_" in name:
            param.data = 0.5 * torch.randn(param.shape, generator=generator)
    model.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="session")
def data_root(tiny_tree, tmp_path_factory) -> Path:
    """Storage root with one LM LoRA run (no embedded trigger) and one DiT LoRA run (trigger
    "crewx" embedded by the exporter)."""
    from hotstep_ray.audition.planner import shared_copy
    from hotstep_ray.core.storage import Storage
    from hotstep_ray.models.acestep_dit import load_acestep_dit
    from hotstep_ray.training import adapters
    from hotstep_ray.training.export import ACESTEP_OFFICIAL_NAMES, export_lora

    root = tmp_path_factory.mktemp("data")
    write_lm_lora(tiny_tree, root / LM_RUN)
    models = load_acestep_dit(tiny_tree / "acestep-v15-turbo", device="cpu")
    transformer = shared_copy(models.transformer)
    adapters.inject(
        transformer, adapters.AdapterSpec(rank=4, targets=adapters.DIT_ATTENTION_TARGETS)
    )
    generator = torch.Generator().manual_seed(0)
    for param in adapters.adapter_parameters(transformer).values():
        param.data = 0.3 * torch.randn(param.shape, generator=generator)
    export_lora(transformer, Storage(root), DIT_RUN, rename=ACESTEP_OFFICIAL_NAMES, trigger="crewx")
    return root


@pytest.fixture(scope="session")
def planner(tiny_tree, data_root):
    from hotstep_ray.audition.planner import PlannerLM

    return PlannerLM.from_checkpoints(tiny_tree, data=str(data_root), device="cpu")


@pytest.fixture(scope="session")
def decoder(tiny_tree):
    from hotstep_ray.audition.decode import CodesDecoder

    return CodesDecoder.from_checkpoints(tiny_tree, device="cpu")
