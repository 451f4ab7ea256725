"""Calibration fixtures: a tiny checkpoint tree (LM only), PEFT LoRA folders, one planner.

Torch runs one thread here (two OpenMP threads on the 2-core box are far slower).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch


@pytest.fixture(scope="session")
def lm_tree(tmp_path_factory) -> Path:
    """A checkpoints folder holding only the tiny 0.6B LM (all the LM calibration loads)."""
    from hotstep_ray.models.tiny_tree import LM_DIR, write_tiny_lm

    root = tmp_path_factory.mktemp("calib-checkpoints")
    write_tiny_lm(root / LM_DIR, seed=3)
    return root


def write_lm_lora(tree: Path, folder: Path, seed: int) -> Path:
    """A PEFT LoRA folder on the tiny LM (r4/α8 on q, v, o, up) with nonzero weights, written
    by peft itself."""
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


@pytest.fixture(scope="session", name="write_lm_lora")
def _write_lm_lora():
    return write_lm_lora


@pytest.fixture(scope="session")
def planner(lm_tree):
    from hotstep_ray.audition.planner import PlannerLM

    return PlannerLM.from_checkpoints(lm_tree, device="cpu")
