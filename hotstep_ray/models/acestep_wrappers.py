"""Thin layers where diffusers 0.42.1 differs from the official ACE-Step 1.5 code.

Everything else is the stock diffusers classes. Each item here exists because a reference
fixture (the official code's outputs) disagrees with plain diffusers, or because diffusers lacks
an option we need; the comment on each says which.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from diffusers.models import attention_dispatch
from diffusers.models.transformers import ace_step_transformer
from diffusers.models.transformers.ace_step_transformer import (
    AceStepAttention,
    AceStepAttnProcessor2_0,
)
from diffusers.pipelines.ace_step import AceStepAudioTokenizer, AceStepConditionEncoder

WindowRule = Literal["sdpa", "flash"]
WINDOW_RULES: tuple[str, ...] = ("sdpa", "flash")


# --------------------------------------------------------------------------- sliding window


def sliding_window_for_rule(window: int, rule: str) -> int:
    """The window value to build the diffusers models with.

    The official code keeps keys with |i - j| <= w under its default (sdpa/eager) attention, but
    under flash-attention-2 transformers turns `sliding_window=w` into `window_size=(w-1, w-1)`,
    i.e. |i - j| <= w - 1. Upstream picks flash whenever flash-attn is installed, so which rule
    the checkpoints were trained under is unknown. diffusers always keeps |i - j| <= w (matching
    "sdpa", which is what every fixture uses). Building with w - 1 reproduces official flash
    runs on every diffusers backend. Applies to every component (the encoders share the code).
    """
    if rule not in WINDOW_RULES:
        raise ValueError(f"window_rule must be one of {WINDOW_RULES}, got {rule!r}")
    return window if rule == "sdpa" else window - 1


# --------------------------------------------------------------------------- XL timbre token


class _PrependTimbreToken:
    """Forward hook on `timbre_encoder.embed_tokens`: [N, Tr, H] -> [N, Tr + 1, H] with the
    learned `special_token` first. A callable class (not a closure) so the model still pickles
    (Ray ships models between processes)."""

    def __init__(self, timbre_encoder: torch.nn.Module) -> None:
        self.timbre_encoder = timbre_encoder

    def __call__(
        self, module: torch.nn.Module, inputs: tuple, output: torch.Tensor
    ) -> torch.Tensor:
        token = self.timbre_encoder.special_token.to(dtype=output.dtype, device=output.device)
        return torch.cat([token.expand(output.shape[0], 1, -1), output], dim=1)


def install_timbre_token(condition_encoder: AceStepConditionEncoder) -> None:
    """Make the diffusers timbre encoder behave like the official XL one.

    The official XL timbre encoder prepends its learned `special_token` after `embed_tokens` and
    reads the embedding at that position (fixture `enc_timbre_token_n3`: 4.25 max abs error
    without it). The 2B code has that line commented out, and diffusers defines the parameter
    but never uses it. The rest of the diffusers forward (RoPE, window mask, norm, position-0
    pooling) already works on whatever length `embed_tokens` returns, so a hook is the whole fix
    and the state-dict keys stay unchanged. Idempotent.
    """
    timbre = condition_encoder.timbre_encoder
    if getattr(timbre, "prepends_special_token", False):
        return
    timbre.embed_tokens.register_forward_hook(_PrependTimbreToken(timbre))
    timbre.prepends_special_token = True


# --------------------------------------------------------------------------- tokenize


@dataclass
class TokenizeOutput:
    quantized: torch.Tensor  # [B, T5, H_enc] FSQ output after project_out, 5 Hz
    indices: torch.Tensor  # [B, T5, 1] int32 codes in [0, 64000)
    pooled_mask: torch.Tensor  # [B, T5] max of the frame mask over each 5-frame window


def pad_to_window(latents: torch.Tensor, silence_latent: torch.Tensor, window: int) -> torch.Tensor:
    """[B, T, C] -> [B, ceil(T / window) * window, C]: right-padded with the first frames of
    `silence_latent` [1, N, C] (the official tokenizer's padding; see `tokenize_latents`)."""
    batch, frames, channels = latents.shape
    pad = (-frames) % window
    if not pad:
        return latents
    if silence_latent.shape[1] < pad or silence_latent.shape[-1] != channels:
        raise ValueError(
            f"silence_latent {tuple(silence_latent.shape)} cannot pad {pad} frames of "
            f"{channels}-dim latents"
        )
    filler = silence_latent[:1, :pad].to(device=latents.device, dtype=latents.dtype)
    return torch.cat([latents, filler.expand(batch, -1, -1)], dim=1)


def tokenize_latents(
    tokenizer: AceStepAudioTokenizer,
    latents: torch.Tensor,
    silence_latent: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
) -> TokenizeOutput:
    """25 Hz latents [B, T, 64] -> 5 Hz FSQ codes, as the official `model.tokenize` returns them.

    Differences from `AceStepAudioTokenizer.tokenize`, each pinned by the tok_* fixtures:
    - T is right-padded to a multiple of 5 with the first frames of `silence_latent`
      (diffusers silently pads with zeros when the silence tensor is missing: 1.23 error);
    - the frame mask is padded with 0 and max-pooled per 5 frames (diffusers returns no mask);
    - indices are int32 (diffusers returns int64; same values).
    The FSQ itself runs in float32 inside diffusers regardless of the model dtype.
    """
    batch, frames, _ = latents.shape
    window = tokenizer.pool_window_size
    if attention_mask is None:
        attention_mask = torch.ones(batch, frames, device=latents.device, dtype=latents.dtype)
    latents = pad_to_window(latents, silence_latent, window)
    pad = latents.shape[1] - frames
    if pad:
        attention_mask = torch.nn.functional.pad(attention_mask, (0, pad), value=0)
    quantized, indices = tokenizer.tokenize(latents)
    pooled = attention_mask.to(latents.dtype).reshape(batch, -1, window).amax(dim=-1)
    return TokenizeOutput(quantized=quantized, indices=indices.to(torch.int32), pooled_mask=pooled)


# --------------------------------------------------------------------------- padded keys


class KeyPaddingMasks:
    """Key-padding masks for one micro-batch, read by `PaddedKeyAttnProcessor`.

    diffusers' DiT forward takes no masks (upstream overwrites its masks with None too), so a
    right-padded micro-batch attends to padding, and on a padded batch both the output and the
    LoRA gradients are wrong by order one. The processor reads these masks instead.

    The masks stay in force until `set` or `clear` is called again. That is deliberate: with
    gradient checkpointing the blocks are re-run during `backward()`, so clearing the masks when
    the forward returns would recompute different activations than the forward used.
    """

    def __init__(self) -> None:
        self.self_keys: torch.Tensor | None = None  # [B, L_patch] bool, True = real patch token
        self.cross_keys: torch.Tensor | None = None  # [B, L_enc] bool, True = real condition token

    def set(self, self_keys: torch.Tensor | None, cross_keys: torch.Tensor | None) -> None:
        self.self_keys = None if self_keys is None else self_keys.to(torch.bool)
        self.cross_keys = None if cross_keys is None else cross_keys.to(torch.bool)

    def clear(self) -> None:
        self.set(None, None)

    @property
    def active(self) -> bool:
        return self.self_keys is not None or self.cross_keys is not None


def _merge_key_mask(
    attention_mask: torch.Tensor | None, keys: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """Additive [B, 1, Lq, Lk] mask keeping a key only where the incoming mask (the sliding band,
    or None on full layers) AND the key-padding mask keep it. Masked entries get finfo.min, not
    -inf: a padded query whose whole window is padding then attends uniformly (finite garbage that
    is cropped or masked from the loss) instead of producing NaN that would leak through V."""
    keep = keys[:, None, None, :]
    if attention_mask is not None:
        band = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
        keep = keep & band
    zero = torch.zeros((), dtype=dtype, device=keys.device)
    return torch.where(keep, zero, torch.finfo(dtype).min)


class PaddedKeyAttnProcessor(AceStepAttnProcessor2_0):
    """The stock ACE-Step processor plus key-padding masks from a shared `KeyPaddingMasks`.

    It only edits the mask and then defers to the stock processor, so attention backends, LoRA
    layers on to_q/to_k/to_v/to_out and the flash-varlen path (which turns a 4-D mask into a 2-D
    key mask) all keep working.
    """

    def __init__(self, masks: KeyPaddingMasks) -> None:
        super().__init__()
        self.masks = masks

    def __call__(
        self,
        attn: AceStepAttention,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        is_cross = attn.is_cross_attention and encoder_hidden_states is not None
        keys = self.masks.cross_keys if is_cross else self.masks.self_keys
        if keys is not None:
            key_states = encoder_hidden_states if is_cross else hidden_states
            if tuple(keys.shape) != tuple(key_states.shape[:2]):
                kind = "cross" if is_cross else "self"
                raise ValueError(
                    f"{kind}-attention key mask {tuple(keys.shape)} does not match keys "
                    f"{tuple(key_states.shape[:2])} ([batch, length])"
                )
            attention_mask = _merge_key_mask(attention_mask, keys, hidden_states.dtype)
        return super().__call__(
            attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb
        )


def _attention_backend(processor: AceStepAttnProcessor2_0 | None = None) -> Any:
    """diffusers' `_get_current_attention_backend`, same result, without rebuilding the enum
    member it already holds: `AttentionBackendName(member)` is a graph break in torch 2.11's
    dynamo (the device machine's torch; 2.13 traces it). Every attention of a compiled block
    asks, so each 2B block ran as ~7 graphs, and a batch-1 step's host time (dynamo guards,
    graph launches) exceeded its GPU time."""
    backend = getattr(processor, "_attention_backend", None)
    if backend is None:
        backend = attention_dispatch._AttentionBackendRegistry.get_active_backend()[0]
    if isinstance(backend, attention_dispatch.AttentionBackendName):
        return backend
    return attention_dispatch.AttentionBackendName(backend)


def install_backend_lookup() -> None:
    """Route the ACE-Step processors' backend lookup through `_attention_backend` (their
    module looks the function up by name at every call; idempotent). A workaround for torch
    2.11's dynamo: once the GPU machines run a torch that traces the stock lookup (2.13 does),
    this and `_attention_backend` can go."""
    ace_step_transformer._get_current_attention_backend = _attention_backend


def install_padded_key_processor(transformer: torch.nn.Module) -> KeyPaddingMasks:
    """Give every attention of the DiT the mask-aware processor; returns the shared masks
    (empty masks = exactly the stock behaviour)."""
    install_backend_lookup()
    masks = KeyPaddingMasks()
    transformer.set_attn_processor(PaddedKeyAttnProcessor(masks))
    return masks


def patch_key_mask(frame_mask: torch.Tensor, patch_size: int) -> torch.Tensor:
    """[B, T] frame mask (1 = real frame, right padding) -> [B, ceil(T/p)] patch-token mask.

    Patch j is real iff j < ceil(T_i / p): for odd T_i the last patch mixes one real frame with
    a zero pad, exactly what the official B=1 run sees after its own zero padding.
    """
    lengths = frame_mask.to(torch.long).sum(dim=1)
    valid_patches = (lengths + patch_size - 1) // patch_size
    tokens = (frame_mask.shape[1] + patch_size - 1) // patch_size
    positions = torch.arange(tokens, device=frame_mask.device)
    return positions[None, :] < valid_patches[:, None]
