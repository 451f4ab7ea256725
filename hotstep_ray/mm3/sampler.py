"""The MM3 flow sampler for one DiT window: the reference's 30-step Euler schedule, exactly.

Schedule (diffusers `FlowMatchEulerDiscreteScheduler(num_train_timesteps=1, shift=1,
invert_sigmas=True)` fed `sigmas = np.linspace(1, 1/N, N)`): the float64 linspace is rounded to
float32 FIRST, then inverted in float32 (t = 1 - sigma), then 1.0 is appended. The DiT receives
t = 0, 0.0333..., ..., 0.9667. Deriving t as i/N instead differs in the 7th digit on 13 of the 30
steps (seed trap 3), so `flow_sigmas` reproduces the float32(linspace) rounding and the test
compares against the diffusers scheduler bit for bit.

Guidance: v = v_uncond + g * (v_cond - v_uncond) with g = 1.7 and the unconditional branch
conditioned on ZEROS (not an empty-caption rollout); Euler x <- x + (t_next - t) * v in float32.
Whole songs (overlapping windows, latent carry, stitching) are the diffusers modular pipeline's
job; this module renders one window for sign checks and A/B previews.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from hotstep_ray.mm3.flow import predict_velocity

DEFAULT_STEPS = 30
DEFAULT_GUIDANCE = 1.7


def flow_sigmas(steps: int = DEFAULT_STEPS) -> torch.Tensor:
    """[steps] float32 sigmas = float32(np.linspace(1, 1/steps, steps)), descending."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    return torch.from_numpy(np.linspace(1.0, 1.0 / steps, steps).astype(np.float32))


def flow_times(steps: int = DEFAULT_STEPS) -> torch.Tensor:
    """[steps + 1] float32 data times: 1 - sigma (in float32), then 1.0. The DiT sees the first
    `steps`; Euler steps between neighbours."""
    times = 1.0 - flow_sigmas(steps)
    return torch.cat([times, torch.ones(1, dtype=torch.float32)])


@torch.no_grad()
def sample_window(
    transformer: nn.Module,
    condition: torch.Tensor,
    noise: torch.Tensor,
    steps: int = DEFAULT_STEPS,
    guidance: float = DEFAULT_GUIDANCE,
) -> torch.Tensor:
    """Denoise `noise` [B, 128, L] (float, at t = 0) under `condition` [B, L, C]; returns float32
    latents [B, 128, L] at t = 1. `guidance` 1 skips the unconditional pass."""
    times = flow_times(steps).to(noise.device)
    x = noise.float()
    zeros = torch.zeros_like(condition)
    batch = x.shape[0]
    for i in range(steps):
        t = times[i].expand(batch)
        v = predict_velocity(transformer, x, t, condition).float()
        if guidance != 1.0:
            v_uncond = predict_velocity(transformer, x, t, zeros).float()
            v = v_uncond + guidance * (v - v_uncond)
        x = x + (times[i + 1] - times[i]) * v
    return x
