"""Sampler schedule: float32(linspace(1, 1/30, 30)) exactly, as the diffusers scheduler (trap 3)."""

from __future__ import annotations

import numpy as np
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from hotstep_ray.mm3.sampler import flow_sigmas, flow_times


def test_sigmas_are_float32_linspace_exactly():
    expected = torch.from_numpy(np.linspace(1.0, 1.0 / 30, 30).astype(np.float32))
    assert flow_sigmas(30).dtype == torch.float32
    assert torch.equal(flow_sigmas(30), expected)
    # The DiT's times 1 - sigma (in float32) are not float32(i / 30): 13 of 30 differ in the
    # 7th digit (mm3.md §1.6), so deriving the schedule from i / steps is wrong (trap 3).
    derived = torch.tensor([i / 30 for i in range(30)], dtype=torch.float32)
    differ = flow_times(30)[:-1] != derived
    assert int(differ.sum()) == 13


def test_times_match_the_diffusers_scheduler_bit_for_bit():
    scheduler = FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1, shift=1.0, invert_sigmas=True
    )
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1.0 / 30, 30))
    assert torch.equal(flow_times(30), scheduler.sigmas)
    assert torch.equal(flow_times(30)[:-1], scheduler.timesteps)
    assert flow_times(30)[0] == 0.0 and flow_times(30)[-1] == 1.0  # 0 = noise, 1 = data
