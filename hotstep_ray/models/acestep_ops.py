"""The ACE-Step 1.5 operations the stages call, as plain functions over `AceStepModels`.

Conventions (official code): latents are [B, T, 64] VAE latents at 25 Hz; t in [0, 1] with
t = 1 pure noise; x_t = t * noise + (1 - t) * x0; the DiT predicts v = noise - x0; an Euler step
is x <- x - v * (t_i - t_{i+1}). Codes are 5 Hz FSQ indices in [0, 64000).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from diffusers.guiders.adaptive_projected_guidance import MomentumBuffer, normalized_guidance

from hotstep_ray.models.acestep_dit import AceStepModels
from hotstep_ray.models.acestep_wrappers import TokenizeOutput, patch_key_mask, tokenize_latents

# APG constants of the official base/sft sampler (acestep/models/common/apg_guidance.py).
APG_MOMENTUM = -0.75
APG_NORM_THRESHOLD = 2.5
TURBO_STEPS = 8
TURBO_SHIFTS = (1.0, 2.0, 3.0)


# --------------------------------------------------------------------------- conditioning


def encode_condition(
    models: AceStepModels,
    text_hidden_states: torch.Tensor,  # [B, Lt, 1024] Qwen3-Embedding last_hidden_state
    text_attention_mask: torch.Tensor,  # [B, Lt] bool/float/long
    lyric_hidden_states: torch.Tensor,  # [B, Ll, 1024] Qwen3 token embeddings only
    lyric_attention_mask: torch.Tensor,  # [B, Ll]
    refer_audio_acoustic_hidden_states_packed: torch.Tensor,  # [N_ref, Tr, 64] timbre latents
    refer_audio_order_mask: torch.Tensor,  # [N_ref] batch row of each reference clip
) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed condition [B, L, H_enc] ([valid lyric | valid timbre | valid text | padding]) and
    its bool mask [B, L]. The XL timbre token is already installed by the loader."""
    return models.condition_encoder(
        text_hidden_states=text_hidden_states,
        text_attention_mask=text_attention_mask,
        lyric_hidden_states=lyric_hidden_states,
        lyric_attention_mask=lyric_attention_mask,
        refer_audio_acoustic_hidden_states_packed=refer_audio_acoustic_hidden_states_packed,
        refer_audio_order_mask=refer_audio_order_mask,
    )


def tokenize(
    models: AceStepModels, latents: torch.Tensor, attention_mask: torch.Tensor | None = None
) -> TokenizeOutput:
    """25 Hz latents [B, T, 64] -> 5 Hz codes (silence-padded to a multiple of 5)."""
    return tokenize_latents(models.audio_tokenizer, latents, models.silence_latent, attention_mask)


def detokenize(models: AceStepModels, quantized: torch.Tensor) -> torch.Tensor:
    """FSQ output [B, T5, H_enc] -> 25 Hz hint latents [B, 5 * T5, 64]."""
    return models.detokenizer(quantized)


def build_context_latents(
    models: AceStepModels,
    src_latents: torch.Tensor,  # [B, T, 64]
    chunk_masks: torch.Tensor,  # [B, T, 64] 1 = generate here
    is_covers: torch.Tensor | None = None,  # [B] > 0: replace src with its FSQ round trip
    attention_mask: torch.Tensor | None = None,  # [B, T] frame mask for the tokenizer
) -> torch.Tensor:
    """[B, T, 128] = cat([src, chunk_mask]) as the official `prepare_condition` builds it.

    The cover path (diffusers has it only inside its pipeline): rows with is_covers > 0 get
    src := detokenize(tokenize(src)) cropped to T. The official code always computes the round
    trip; it is skipped here when no row is a cover, which changes no value.
    """
    if is_covers is not None and bool((is_covers > 0).any()):
        hints = detokenize(models, tokenize(models, src_latents, attention_mask).quantized)
        hints = hints[:, : src_latents.shape[1]]
        src_latents = torch.where(is_covers.view(-1, 1, 1) > 0, hints, src_latents)
    return torch.cat([src_latents, chunk_masks.to(src_latents.dtype)], dim=-1)


def text2music_context(models: AceStepModels, batch: int, frames: int) -> torch.Tensor:
    """[B, T, 128] context with no source audio: silence latents and chunk mask 1 everywhere."""
    silence = models.silence_latent
    if silence.shape[1] < frames:
        raise ValueError(f"silence_latent has {silence.shape[1]} frames, {frames} requested")
    src = silence[:, :frames].expand(batch, -1, -1)
    return torch.cat([src, torch.ones_like(src)], dim=-1)


# --------------------------------------------------------------------------- FSQ codes


def fsq_indices_to_levels(quantizer: torch.nn.Module, indices: torch.Tensor) -> torch.Tensor:
    """[...] code index -> [..., 6] level per dimension: level_d = (index // basis_d) % L_d."""
    levels = quantizer._levels.to(indices.device)
    basis = quantizer._basis.to(indices.device)
    return (indices.long().unsqueeze(-1) // basis) % levels


def fsq_levels_to_codes(quantizer: torch.nn.Module, levels: torch.Tensor) -> torch.Tensor:
    """[..., 6] levels -> [..., 6] float32 codes in [-1, 1]: code = level * 2 / (L - 1) - 1."""
    sizes = quantizer._levels.to(device=levels.device, dtype=torch.float32)
    return levels.float() * (2.0 / (sizes - 1.0)) - 1.0


def fsq_indices_to_codes(quantizer: torch.nn.Module, indices: torch.Tensor) -> torch.Tensor:
    return quantizer._indices_to_codes(indices)


def fsq_codes_to_indices(quantizer: torch.nn.Module, codes: torch.Tensor) -> torch.Tensor:
    """[..., 6] codes -> [...] int64 index (the inverse of `fsq_indices_to_codes`)."""
    return quantizer._codes_to_indices(codes.float())


def codes_to_latents(
    models: AceStepModels, indices: torch.Tensor, num_frames: int | None = None
) -> torch.Tensor:
    """5 Hz codes [B, T5] or [B, T5, 1] -> 25 Hz hint latents [B, 5*T5, 64] (FSQ project_out,
    then the detokenizer). With `num_frames`, crop or pad with silence frames to that length, as
    upstream does before using the hints as DiT context."""
    quantizer = models.audio_tokenizer.quantizer
    if indices.ndim == 2:
        indices = indices.unsqueeze(-1)
    size = quantizer.codebook_size
    if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= size):
        raise ValueError(
            f"audio codes must lie in [0, {size}); got [{int(indices.min())}, {int(indices.max())}]"
        )
    quantized = quantizer.get_output_from_indices(indices.to(models.device))  # float32 math
    latents = detokenize(models, quantized.to(models.dtype))
    if num_frames is None or num_frames == latents.shape[1]:
        return latents
    if num_frames < latents.shape[1]:
        return latents[:, :num_frames]
    # Frames past the hints take the silence frames at the same positions: what a text2music
    # context holds there. (Which silence frames upstream pads with is not pinned by a fixture.)
    extra = num_frames - latents.shape[1]
    filler = models.silence_latent[:, latents.shape[1] : num_frames].to(latents.dtype)
    if filler.shape[1] != extra:
        raise ValueError(f"silence_latent too short to pad to {num_frames} frames")
    return torch.cat([latents, filler.expand(latents.shape[0], -1, -1)], dim=1)


# --------------------------------------------------------------------------- training


@dataclass
class TrainBatch:
    target_latents: torch.Tensor  # x0 [B, T, 64]
    encoder_hidden_states: torch.Tensor  # [B, L, H_enc] packed condition (encode_condition)
    context_latents: torch.Tensor  # [B, T, 128] (build_context_latents)
    # Micro-batch padding. None = no padding (the official forward, which ignores masks).
    latent_mask: torch.Tensor | None = None  # [B, T] 1 = real frame, right-padded
    encoder_attention_mask: torch.Tensor | None = None  # [B, L] 1 = real condition token


@dataclass
class TrainStep:
    loss: torch.Tensor  # scalar float32
    pred_v: torch.Tensor  # [B, T, 64]
    target_v: torch.Tensor  # noise - x0
    x_t: torch.Tensor
    noise: torch.Tensor
    t: torch.Tensor  # [B] = max(t_draw_a, t_draw_b); r = t
    t_draw_a: torch.Tensor
    t_draw_b: torch.Tensor
    cfg_uniform: torch.Tensor  # [B] u ~ U(0, 1); a row is dropped when u < cfg_ratio
    cfg_dropped: torch.Tensor  # [B] bool
    encoder_hidden_states: torch.Tensor  # after null-condition replacement


def training_forward(
    models: AceStepModels,
    batch: TrainBatch,
    *,
    cfg_ratio: float = 0.15,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    timestep_mu: float | None = None,
    timestep_sigma: float | None = None,
) -> TrainStep:
    """The official flow-matching training loss (`AceStepConditionGenerationModel.forward`).

    Random draws, in this order (the order is part of the contract: the train_fwd fixtures replay
    it bit for bit after `torch.manual_seed`): rand(B) for CFG dropout, randn_like(x0) for the
    noise, then randn(B) twice for t. t = max of the two logit-normal draws
    sigmoid(z * sigma + mu), so its mean is about 0.53, not 0.40; r = t. Draws use `generator`
    (or a new one from `seed`), else the global RNG; they are made in x0's dtype, as upstream.

    Without masks the loss is upstream's plain MSE over every element. With `latent_mask` or
    `encoder_attention_mask` the DiT's attention ignores padded keys and the loss averages over
    real frames only, so padding never changes a real element's loss or gradient. The masks stay
    set on `models.key_masks` until the next call: run `backward()` before the next forward.
    """
    x0, conditions = batch.target_latents, batch.encoder_hidden_states
    size, device, dtype = x0.shape[0], x0.device, x0.dtype
    mu = models.config.get("timestep_mu", -0.4) if timestep_mu is None else timestep_mu
    sigma = models.config.get("timestep_sigma", 1.0) if timestep_sigma is None else timestep_sigma
    if generator is None and seed is not None:
        generator = torch.Generator(device=device).manual_seed(seed)

    cfg_uniform = torch.rand(size, generator=generator, device=device, dtype=dtype)
    dropped = cfg_uniform < cfg_ratio
    null = models.condition_encoder.null_condition_emb.to(conditions.dtype).expand_as(conditions)
    conditions = torch.where(dropped.view(-1, 1, 1), null, conditions)
    noise = torch.randn(x0.shape, generator=generator, device=device, dtype=dtype)
    draw_a = torch.randn(size, generator=generator, device=device, dtype=dtype)
    draw_b = torch.randn(size, generator=generator, device=device, dtype=dtype)
    t_draw_a = torch.sigmoid(draw_a * sigma + mu)
    t_draw_b = torch.sigmoid(draw_b * sigma + mu)
    t = torch.maximum(t_draw_a, t_draw_b)
    t_ = t.view(-1, 1, 1)
    x_t = t_ * noise + (1.0 - t_) * x0

    model_input, context = x_t, batch.context_latents
    self_keys = None
    if batch.latent_mask is not None:
        # Zero the padded frames of both DiT inputs: for an odd length the last patch then holds
        # one real frame and a zero, exactly the zero pad the unpadded B=1 forward adds.
        frames = batch.latent_mask.to(dtype).unsqueeze(-1)  # [B, T, 1]
        model_input, context = x_t * frames, context * frames.to(context.dtype)
        self_keys = patch_key_mask(batch.latent_mask, models.transformer.config.patch_size)
    models.key_masks.set(self_keys, batch.encoder_attention_mask)
    pred_v = models.transformer(
        hidden_states=model_input.to(models.dtype),
        timestep=t.to(models.dtype),
        timestep_r=t.to(models.dtype),
        encoder_hidden_states=conditions.to(models.dtype),
        context_latents=context.to(models.dtype),
        return_dict=False,
    )[0]
    target_v = noise - x0
    squared = (pred_v.float() - target_v.float()) ** 2  # [B, T, 64]
    if batch.latent_mask is None:
        loss = squared.mean()
    else:
        frames = batch.latent_mask.to(squared.dtype).unsqueeze(-1)  # [B, T, 1]
        loss = (squared * frames).sum() / (frames.sum() * squared.shape[-1]).clamp_min(1.0)
    return TrainStep(
        loss=loss,
        pred_v=pred_v,
        target_v=target_v,
        x_t=x_t,
        noise=noise,
        t=t,
        t_draw_a=t_draw_a,
        t_draw_b=t_draw_b,
        cfg_uniform=cfg_uniform,
        cfg_dropped=dropped,
        encoder_hidden_states=conditions,
    )


# --------------------------------------------------------------------------- sampling


@dataclass
class GenerateOutput:
    latents: torch.Tensor  # [B, T, 64] generated x0
    initial_noise: torch.Tensor  # [B, T, 64]
    schedule: torch.Tensor  # the timesteps visited (model dtype, as upstream), ending at 0


def make_noise(
    shape: tuple[int, int, int],
    seed: int | Sequence[int | None] | None,
    device: torch.device,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Initial noise as the official `prepare_noise` draws it: one generator for an int seed;
    one generator per row (each drawing [1, T, C]) for a list; the global RNG for None or for a
    negative/None entry of a list."""
    if seed is None:
        return torch.randn(shape, device=device, dtype=dtype)
    if isinstance(seed, int):
        generator = torch.Generator(device=device).manual_seed(seed)
        return torch.randn(shape, generator=generator, device=device, dtype=dtype)
    if len(seed) != shape[0]:
        raise ValueError(f"{len(seed)} seeds for a batch of {shape[0]}")
    rows = []
    for row_seed in seed:
        row_shape = (1, *shape[1:])
        if row_seed is None or row_seed < 0:
            rows.append(torch.randn(row_shape, device=device, dtype=dtype))
        else:
            generator = torch.Generator(device=device).manual_seed(int(row_seed))
            rows.append(torch.randn(row_shape, generator=generator, device=device, dtype=dtype))
    return torch.cat(rows, dim=0)


def shifted(t: float, shift: float) -> float:
    """Flow-matching timestep shift t' = s t / (1 + (s - 1) t)."""
    return shift * t / (1 + (shift - 1) * t)


def _turbo_table(shift: float) -> list[float]:
    # The official 8-step tables (exact as Python floats: k/8 is dyadic, so one rounding).
    return [shifted(1 - k / TURBO_STEPS, shift) for k in range(TURBO_STEPS)]


# The 20 distinct values of the three tables: the only timesteps the turbo model was distilled on.
TURBO_VALID_TIMESTEPS = sorted({t for s in TURBO_SHIFTS for t in _turbo_table(s)}, reverse=True)


def turbo_schedule(shift: float = 3.0, timesteps: Sequence[float] | None = None) -> list[float]:
    """The timesteps the official turbo sampler visits (no final 0).

    Unlike `AceStepPipeline._get_timestep_schedule` (continuous shift, any step count, custom
    timesteps passed through), the official sampler: rounds `shift` to 1, 2 or 3 and uses its
    8-step table; or snaps each custom timestep (trailing zeros dropped, at most 20) to the
    nearest of the 20 valid values. We follow the official rules.
    """
    if timesteps is not None:
        values = [float(t) for t in timesteps]
        while values and values[-1] == 0:
            values.pop()
        values = values[:20]
        if values:
            return [min(TURBO_VALID_TIMESTEPS, key=lambda v, t=t: abs(v - t)) for t in values]
    nearest = min(TURBO_SHIFTS, key=lambda s: abs(s - shift))
    return _turbo_table(nearest)


def _prepare_noise(
    context_latents: torch.Tensor,
    seed: int | Sequence[int | None] | None,
    noise: torch.Tensor | None,
) -> torch.Tensor:
    batch, frames, channels = context_latents.shape
    shape = (batch, frames, channels // 2)  # context = [src | chunk mask]
    if noise is not None:
        if tuple(noise.shape) != shape:
            raise ValueError(f"noise {tuple(noise.shape)} does not match {shape}")
        return noise.to(device=context_latents.device, dtype=context_latents.dtype)
    return make_noise(shape, seed, context_latents.device, context_latents.dtype)


def _velocity(
    models: AceStepModels,
    x: torch.Tensor,
    t: torch.Tensor,
    conditions: torch.Tensor,
    context_latents: torch.Tensor,
) -> torch.Tensor:
    return models.transformer(
        hidden_states=x,
        timestep=t,
        timestep_r=t,
        encoder_hidden_states=conditions,
        context_latents=context_latents,
        return_dict=False,
    )[0]


@torch.no_grad()
def turbo_generate(
    models: AceStepModels,
    encoder_hidden_states: torch.Tensor,  # [B, L, H_enc]
    context_latents: torch.Tensor,  # [B, T, 128]
    *,
    seed: int | Sequence[int | None] | None = None,
    noise: torch.Tensor | None = None,
    shift: float = 3.0,
    timesteps: Sequence[float] | None = None,
) -> GenerateOutput:
    """The official turbo sampler: Euler over `turbo_schedule`, no CFG; the last step jumps
    straight to x0 = x - v * t."""
    models.key_masks.clear()
    dtype = models.dtype
    context_latents = context_latents.to(dtype)
    conditions = encoder_hidden_states.to(dtype)
    initial = _prepare_noise(context_latents, seed, noise)
    schedule = torch.tensor(turbo_schedule(shift, timesteps), dtype=dtype)
    size, x = initial.shape[0], initial
    for step in range(len(schedule)):
        t_now = schedule[step].item()
        t_batch = torch.full((size,), t_now, device=x.device, dtype=dtype)
        v = _velocity(models, x, t_batch, conditions, context_latents)
        if step == len(schedule) - 1:
            x = x - v * t_batch.view(-1, 1, 1)
        else:
            step_size = t_now - schedule[step + 1].item()
            x = x - v * torch.full((size, 1, 1), step_size, device=x.device, dtype=dtype)
    visited = torch.cat([schedule, schedule.new_zeros(1)])
    return GenerateOutput(latents=x, initial_noise=initial, schedule=visited)


def base_schedule(
    steps: int,
    shift: float = 1.0,
    timesteps: Sequence[float] | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """[steps + 1] from 1 to 0: linspace, shifted when shift != 1, computed in `dtype` (the
    model dtype, as upstream). Custom `timesteps` (the sft class's option) are the whole
    schedule and must end at 0."""
    if timesteps is not None:
        values = torch.tensor([float(t) for t in timesteps], dtype=dtype)
        if values.numel() < 2 or values[-1] != 0 or bool((values[1:] >= values[:-1]).any()):
            raise ValueError(
                f"timesteps must decrease strictly and end at 0, got {list(timesteps)}"
            )
        return values
    t = torch.linspace(1.0, 0.0, steps + 1, dtype=dtype)
    return shift * t / (1 + (shift - 1) * t) if shift != 1.0 else t


@torch.no_grad()
def base_generate(
    models: AceStepModels,
    encoder_hidden_states: torch.Tensor,  # [B, L, H_enc]
    context_latents: torch.Tensor,  # [B, T, 128]
    *,
    seed: int | Sequence[int | None] | None = None,
    noise: torch.Tensor | None = None,
    steps: int = 30,
    guidance_scale: float = 7.0,
    shift: float = 1.0,
    cfg_interval_start: float = 0.0,
    cfg_interval_end: float = 1.0,
    timesteps: Sequence[float] | None = None,
) -> GenerateOutput:
    """The official base/sft sampler: Euler with CFG combined by APG.

    Each step runs the DiT once on [cond | null] rows (null = `null_condition_emb`). On steps
    with cfg_interval_start <= t <= cfg_interval_end the velocity is APG: momentum -0.75 on
    (v_cond - v_uncond), updated only on those steps; the norm clipped to 2.5 over the TIME axis
    (dim 1) without writing back; the part orthogonal to v_cond (float64) added with weight
    (guidance - 1). Other steps use v_cond. diffusers' pipeline tests the interval on 1 - t
    instead of t, so only its APG function is reused here. `timesteps` gives the sft class's
    custom schedule (the base class silently ignores it upstream).
    """
    models.key_masks.clear()
    dtype = models.dtype
    context_latents = context_latents.to(dtype)
    conditions = encoder_hidden_states.to(dtype)
    initial = _prepare_noise(context_latents, seed, noise)
    schedule = base_schedule(steps, shift, timesteps, dtype).to(initial.device)
    size = initial.shape[0]
    guided = guidance_scale > 1.0
    if guided:
        null = models.condition_encoder.null_condition_emb.to(dtype).expand_as(conditions)
        conditions = torch.cat([conditions, null], dim=0)
        context_latents = torch.cat([context_latents, context_latents], dim=0)
    momentum = MomentumBuffer(momentum=APG_MOMENTUM)
    x = initial
    for t_now, t_next in zip(schedule[:-1], schedule[1:], strict=True):
        rows = torch.cat([x, x], dim=0) if guided else x
        v = _velocity(
            models,
            rows,
            t_now * torch.ones(rows.shape[0], dtype=dtype, device=x.device),
            conditions,
            context_latents,
        )
        if guided:
            v_cond, v_uncond = v.chunk(2)
            if cfg_interval_start <= t_now <= cfg_interval_end:
                v = normalized_guidance(
                    v_cond,
                    v_uncond,
                    guidance_scale=guidance_scale - 1.0,
                    momentum_buffer=momentum,
                    eta=0.0,
                    norm_threshold=APG_NORM_THRESHOLD,
                    use_original_formulation=True,
                    norm_dim=(1,),
                )
            else:
                v = v_cond
        step_size = (t_now - t_next) * torch.ones(size, dtype=dtype, device=x.device)
        x = x - v * step_size.view(-1, 1, 1)
    return GenerateOutput(latents=x, initial_noise=initial, schedule=schedule)
