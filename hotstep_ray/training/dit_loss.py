"""The DiT training objective: flow matching as the official forward defines it, plus the recipe's
timestep sampling, CFG dropout and loss weights.

Flow matching (official `AceStepConditionGenerationModel.forward`, fixture `train_fwd_*`):
x1 = noise ~ N(0, I), x0 = data latents, x_t = t·x1 + (1 − t)·x0, the DiT predicts v and the
target is x1 − x0 (t = 1 is pure noise; timestep_r = t).

Timesteps, per variant:
- turbo: uniform over the 8 values of the shift-3 turbo schedule the model was distilled on
  (1, 0.9545…, 0.9, 0.8333…, 0.75, 0.6428…, 0.5, 0.3), restricted to [t_min, t_max];
- base/sft: logit-normal, t = max(σ(μ + σ·z₁), σ(μ + σ·z₂)) as upstream's `sample_t_r`
  (mean ≈ 0.53 at μ −0.4, σ 1), rejection-resampled (64 tries, then clamped) into
  [t_min, t_max].

CFG dropout (base/sft only; turbo is guidance-distilled and never sees the null condition): per
sample with probability `cfg_ratio` the whole condition is replaced by `null_condition_emb`.

Loss = masked MSE over valid frames (`accumulate.masked_mse`): per sample the mean over its real
frames × 64 channels, each channel weighted by channel balance cw_c = (1/std_c) / mean(1/std);
per-sample weights w_i:
- none: 1;
- flow_snr: w(t) = (1 − t)^t_bias / (t(1 − t)) (t clamped to [1e-4, 1 − 1e-4]), capped at
  snr_gamma, then divided by its mean over the whole OPTIMIZER WINDOW (all micro-batches of one
  step: normalising per micro-batch would make it a no-op at batch 1);
- min_snr (Side-Step): snr = ((1 − t)/t)², w = min(snr, γ)/snr, not normalised.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hotstep_ray.core.contracts import TrainDitOptions
from hotstep_ray.core.errors import InputError
from hotstep_ray.models.acestep_dit import AceStepModels
from hotstep_ray.models.acestep_ops import TrainBatch, turbo_schedule
from hotstep_ray.models.acestep_wrappers import patch_key_mask
from hotstep_ray.training.accumulate import masked_mse

TURBO_TIMESTEPS: tuple[float, ...] = tuple(turbo_schedule(3.0))  # 8 values, 1.0 … 0.3
REJECTION_TRIES = 64
T_CLAMP = 1e-5  # logit-normal draws stay inside (T_CLAMP, 1 − T_CLAMP)
SNR_T_CLAMP = 1e-4


@dataclass(frozen=True)
class LossConfig:
    kind: str  # turbo | base | sft
    cfg_ratio: float
    timestep_mu: float
    timestep_sigma: float
    t_min: float
    t_max: float
    weighting: str  # none | flow_snr | min_snr
    snr_gamma: float
    t_bias: float
    channel_weights: torch.Tensor | None  # [64], mean 1; None = channel balance off

    @classmethod
    def from_options(
        cls, options: TrainDitOptions, kind: str, channel_std: torch.Tensor | None
    ) -> LossConfig:
        weights = None
        if options.channel_balance and channel_std is not None:
            weights = channel_balance_weights(channel_std)
        return cls(
            kind=kind,
            cfg_ratio=0.0 if kind == "turbo" else options.cfg_ratio,
            timestep_mu=options.timestep_mu,
            timestep_sigma=options.timestep_sigma,
            t_min=options.t_min,
            t_max=options.t_max,
            weighting=options.effective_loss_weighting,
            snr_gamma=options.snr_gamma,
            t_bias=options.t_bias,
            channel_weights=weights,
        )

    def describe(self) -> dict:
        return {
            "timesteps": "turbo-discrete-shift3" if self.kind == "turbo" else "logit-normal-max2",
            "cfg_ratio": self.cfg_ratio,
            "weighting": self.weighting,
            "channel_balance": self.channel_weights is not None,
        }


def channel_balance_weights(channel_std: torch.Tensor) -> torch.Tensor:
    """cw_c = (1/std_c) / mean(1/std): quiet channels count as much as loud ones; mean 1."""
    inverse = 1.0 / channel_std.float().clamp_min(1e-6)
    return inverse / inverse.mean()


# -- random draws --------------------------------------------------------------------------------
def sample_timesteps(size: int, config: LossConfig, rng: torch.Generator) -> torch.Tensor:
    """[size] float32 timesteps on the CPU (see the module docstring)."""
    if config.kind == "turbo":
        allowed = torch.tensor(
            [t for t in TURBO_TIMESTEPS if config.t_min <= t <= config.t_max], dtype=torch.float32
        )
        if not allowed.numel():
            raise InputError(
                f"no turbo timestep lies in [{config.t_min}, {config.t_max}]; turbo trains on "
                f"{[round(t, 4) for t in TURBO_TIMESTEPS]}"
            )
        return allowed[torch.randint(allowed.numel(), (size,), generator=rng)]

    def draw(count: int) -> torch.Tensor:
        first = torch.randn(count, generator=rng)
        second = torch.randn(count, generator=rng)
        mu, sigma = config.timestep_mu, config.timestep_sigma
        t = torch.maximum(torch.sigmoid(first * sigma + mu), torch.sigmoid(second * sigma + mu))
        return t.clamp(T_CLAMP, 1.0 - T_CLAMP)

    t = draw(size)
    if config.t_min > 0.0 or config.t_max < 1.0:
        for _ in range(REJECTION_TRIES):
            outside = (t < config.t_min) | (t > config.t_max)
            if not bool(outside.any()):
                break
            t[outside] = draw(int(outside.sum()))
        t = t.clamp(config.t_min, config.t_max)
    return t


def sample_cfg_drop(size: int, ratio: float, rng: torch.Generator) -> torch.Tensor:
    """[size] bool: True = the sample trains on the null condition (always draws: stable stream)."""
    return torch.rand(size, generator=rng) < ratio


def timestep_weights(t: torch.Tensor, config: LossConfig) -> torch.Tensor:
    """Per-sample loss weight before window normalisation ([n] float32)."""
    if config.weighting == "none":
        return torch.ones_like(t, dtype=torch.float32)
    if config.weighting == "flow_snr":
        tc = t.float().clamp(SNR_T_CLAMP, 1.0 - SNR_T_CLAMP)
        weight = (1.0 - tc).pow(config.t_bias) / (tc * (1.0 - tc))
        return weight.clamp(max=config.snr_gamma)
    if config.weighting == "min_snr":
        tc = t.float().clamp(SNR_T_CLAMP, 1.0 - SNR_T_CLAMP)
        snr = ((1.0 - tc) / tc).square().clamp(max=1e6)
        return snr.clamp(max=config.snr_gamma) / snr
    raise InputError(f"unknown loss weighting {config.weighting!r}")


def normalize_window(weights: list[torch.Tensor], config: LossConfig) -> list[torch.Tensor]:
    """flow_snr weights divided by their mean over the whole optimizer window (mean → 1)."""
    if config.weighting != "flow_snr":
        return weights
    mean = torch.cat(weights).mean().clamp_min(1e-12)
    return [w / mean for w in weights]


# -- the forward ---------------------------------------------------------------------------------
@dataclass
class LossOutput:
    loss: torch.Tensor  # scalar float32: weighted masked MSE (what is back-propagated)
    raw_loss: torch.Tensor  # scalar float32: plain masked MSE, detached (what users compare)
    pred_v: torch.Tensor  # [B, T, 64]
    target_v: torch.Tensor  # [B, T, 64] noise - x0


def flow_matching_loss(
    models: AceStepModels,
    batch: TrainBatch,
    t: torch.Tensor,  # [B] in (0, 1]
    noise: torch.Tensor,  # [B, T, 64]
    cfg_drop: torch.Tensor,  # [B] bool
    sample_weights: torch.Tensor | None = None,  # [B]; None = 1
    channel_weights: torch.Tensor | None = None,  # [64]; None = 1
    null_condition: torch.Tensor | None = None,  # [1, 1, H_enc]; default the model's own
) -> LossOutput:
    """One micro-batch of the objective. Padded frames (latent_mask False) are zeroed in both DiT
    inputs and excluded from the loss; padded frames and condition tokens are masked as attention
    KEYS, so padding changes no real token's output, loss or gradient. The key masks stay set until
    the next call: run `backward()` first (checkpointed layers re-read them)."""
    device, dtype = models.device, models.dtype
    x0 = batch.target_latents.float()
    t = t.to(device=device, dtype=torch.float32)
    noise = noise.to(device=device, dtype=torch.float32)
    conditions = batch.encoder_hidden_states
    if batch.encoder_attention_mask is not None:  # padded tokens: zero, then masked as keys
        keep = batch.encoder_attention_mask.to(device).unsqueeze(-1)
        conditions = torch.where(
            keep, conditions, torch.zeros((), dtype=conditions.dtype, device=device)
        )
    if null_condition is None:
        null_condition = models.condition_encoder.null_condition_emb
    null = null_condition.to(device=device, dtype=conditions.dtype)
    drop = cfg_drop.to(device).view(-1, 1, 1)
    conditions = torch.where(drop, null.expand_as(conditions), conditions)

    t_ = t.view(-1, 1, 1)
    x_t = t_ * noise + (1.0 - t_) * x0
    context = batch.context_latents
    self_keys = None
    if batch.latent_mask is not None:
        frames = batch.latent_mask.to(device=device).unsqueeze(-1)  # [B, T, 1] bool
        # Zeroing (not multiplying) keeps a dirty pad — even inf/NaN — out of the inputs.
        x_t = torch.where(frames, x_t, torch.zeros((), device=device))
        context = torch.where(frames, context, torch.zeros((), device=device, dtype=context.dtype))
        self_keys = patch_key_mask(batch.latent_mask, models.transformer.config.patch_size)
    models.key_masks.set(self_keys, batch.encoder_attention_mask)
    pred_v = models.transformer(
        hidden_states=x_t.to(dtype),
        timestep=t.to(dtype),
        timestep_r=t.to(dtype),
        encoder_hidden_states=conditions.to(dtype),
        context_latents=context.to(dtype),
        return_dict=False,
    )[0]
    target_v = noise - x0
    if batch.latent_mask is not None:
        target_v = torch.where(frames, target_v, torch.zeros((), device=device))
        pred_v = torch.where(frames, pred_v, torch.zeros((), device=device, dtype=pred_v.dtype))
    loss = masked_mse(pred_v, target_v, batch.latent_mask, sample_weights, channel_weights)
    with torch.no_grad():
        raw = masked_mse(pred_v, target_v, batch.latent_mask)
    return LossOutput(loss=loss, raw_loss=raw, pred_v=pred_v, target_v=target_v)
