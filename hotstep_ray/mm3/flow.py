"""The MM3 flow-matching objective, in the diffusers reference's convention (seed trap 1).

Convention (diffusers `MiniMaxMusic3Transformer1DModel`, its inverted flow-match scheduler and
the modular pipeline's Euler loop): time t in [0, 1] runs from noise (t = 0) to data (t = 1),

    x_t = t * x0 + (1 - t) * noise        x0 [B, 128, L] DAV latents, noise ~ N(0, I)

the DiT gets `timestep = t` and predicts the data-ward velocity v = dx_t/dt = x0 - noise, which
`sampler.py` integrates from t = 0 to 1. So the training target is x0 - noise and the output is
NOT negated. ComfyUI's wrapper returns -DiT(...) for its sigma-space sampler; that is the
wrapper's convention, not the weights' (a LoRA is a weight delta and works in both stacks).
In sigma form (HOT-Step, SimpleTuner): sigma = 1 - t, x = sigma * noise + (1 - sigma) * x0.

Time sampling: logit-normal data time t = sigmoid(mean + std * z); mean > 0 biases toward clean
crops (HOT-Step's --logit-mean). Loss: mean squared error over every element (HOT-Step did not
port ACE's channel balancing, and neither do we).

Randomness (seed trap 8): every draw comes from its own CPU `torch.Generator` seeded with
`draw_seed(seed, step, micro, stream)`, a splitmix64 mix of the four integers. A draw therefore
depends only on (seed, optimizer step, micro-batch, stream): no generator state to checkpoint,
identical after a resume, on any device (drawn on the CPU, then moved), and independent of the
C++ standard library (the failure of std::normal_distribution). The normals are torch's CPU
sampler (mt19937 + Box-Muller), fixed for a given torch version.
"""

from __future__ import annotations

import torch
from torch import nn

from hotstep_ray.training.accumulate import masked_mse

MASK64 = (1 << 64) - 1
# Independent random streams of one micro-batch.
STREAM_SONG, STREAM_CROP, STREAM_TIME, STREAM_NOISE, STREAM_EVAL = range(5)


def splitmix64(value: int) -> int:
    """One splitmix64 output for state `value` (Steele, Lea & Flood 2014), in 64-bit arithmetic."""
    z = (value + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def draw_seed(seed: int, step: int, micro: int = 0, stream: int = 0) -> int:
    """A 63-bit generator seed for one (seed, step, micro-batch, stream) draw."""
    state = splitmix64(int(seed) & MASK64)
    for part in (step, micro, stream):
        state = splitmix64(state ^ (int(part) & MASK64))
    return state >> 1  # torch.Generator.manual_seed takes a signed 64-bit value


def generator(seed: int, step: int, micro: int = 0, stream: int = 0) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(draw_seed(seed, step, micro, stream))


def sample_data_time(
    count: int, gen: torch.Generator, mean: float = 0.0, std: float = 1.0
) -> torch.Tensor:
    """[count] float32 data times t = sigmoid(mean + std * z) in (0, 1); sigma = 1 - t."""
    z = torch.randn(count, generator=gen, dtype=torch.float32)
    return torch.sigmoid(mean + std * z)


def noisy_latents(x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """x_t = t * x0 + (1 - t) * noise; x0/noise [B, C, L], t [B]."""
    t_ = t.view(-1, *([1] * (x0.ndim - 1))).to(x0.dtype)
    return t_ * x0 + (1.0 - t_) * noise


def velocity_target(x0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """The data-ward velocity the diffusers MM3 DiT predicts: x0 - noise (never negated)."""
    return x0 - noise


def predict_velocity(
    transformer: nn.Module, x_t: torch.Tensor, t: torch.Tensor, condition: torch.Tensor
) -> torch.Tensor:
    """DiT output [B, 128, L] for x_t [B, 128, L], t [B] and condition [B, L, C] (inputs are cast
    to the transformer's dtype; the output keeps it)."""
    dtype = next(transformer.parameters()).dtype
    return transformer(
        hidden_states=x_t.to(dtype),
        timestep=t.to(dtype),
        encoder_hidden_states=condition.to(dtype),
        return_dict=False,
    )[0]


def flow_loss(
    transformer: nn.Module,
    x0: torch.Tensor,
    noise: torch.Tensor,
    t: torch.Tensor,
    condition: torch.Tensor,
    negate_target: bool = False,
) -> torch.Tensor:
    """Scalar float32 MSE between the DiT output and x0 - noise (or its negation, for the sign
    check only)."""
    x0, noise = x0.float(), noise.float()
    pred = predict_velocity(transformer, noisy_latents(x0, noise, t.float()), t, condition)
    target = velocity_target(x0, noise)
    return masked_mse(pred, -target if negate_target else target)


@torch.no_grad()
def sign_check(
    transformer: nn.Module,
    x0: torch.Tensor,
    condition: torch.Tensor,
    seed: int = 0,
    data_time: float = 0.1,
) -> dict[str, float]:
    """Loss against x0 - noise and against its negation at one data time (0.1 = sigma 0.9, where
    a model trained in this convention is far closer to the right target: HOT-Step measured 3.59
    vs 11.17 on the released DiT). x0 [B, 128, L], condition [B, L, C]."""
    device = x0.device
    noise = torch.randn(x0.shape, generator=generator(seed, 0, 0, STREAM_NOISE)).to(device)
    t = torch.full((x0.shape[0],), data_time, dtype=torch.float32, device=device)
    right = flow_loss(transformer, x0, noise, t, condition).item()
    negated = flow_loss(transformer, x0, noise, t, condition, negate_target=True).item()
    return {"loss_target": right, "loss_negated": negated, "ratio": right / max(negated, 1e-12)}
