"""The DAV audio ENCODER (audio -> 128-channel latents at 86.13 Hz): training only.

diffusers 0.42.1 ships only the decoder half of the MM3 Flow-VAE (`MiniMaxMusic3Vocoder`); this is
the missing encoder half, written from the architecture in shared/reference/mm3.md §1.3 (a DAC
encoder whose weights live in the release's `dav.pth`, keys `encoder.block.*` + `mean_proj.*`).

Per audio channel (mono waveform [1, T] at 44.1 kHz):
    conv 1->64 k7 -> 4 x EncoderBlock(stride s in (2, 4, 8, 8), width 128/256/512/1024)
    -> Snake -> conv 1024->1024 k3 -> mean_proj 1024->64 k1          => [64, T / 512]
EncoderBlock(width C, stride s) = 3 residual units at C/2 (dilation 1, 3, 9) -> Snake ->
conv C/2->C, kernel 2s, stride s, padding ceil(s/2). Residual unit = x + conv1x1(snake(conv7_dil(
snake(x)))). Snake(x) = x + sin^2(alpha x) / (alpha + 1e-9).

Only the posterior MEAN is used (`logs_proj` and the VITS-style `flow.*` are ignored); no tanh,
no scaling factor. Stereo is PLANAR: the two rows of [2, T] run through the shared weights as a
batch of two mono signals and the outputs stack as channels 0-63 = left, 64-127 = right (the
layout `MiniMaxMusic3Vocoder` unfolds). Feeding an interleaved buffer instead turns every song into
a 2x slow-motion copy an octave down (seed trap 13).

Weights: `<mm3>/dav_encoder/{config.json, diffusion_pytorch_model.safetensors}` (our converted
form, `save_dav_encoder`) or the release's `<mm3>/dav.pth` (read with `weights_only=True`; the
architecture is inferred from tensor shapes). Weight-normalised convs (`weight_g`, `weight_v`) are
folded into plain weights on load.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from hotstep_ray.core.errors import InputError
from hotstep_ray.mm3 import HOP_SAMPLES, LATENT_CHANNELS

DAV_FOLDER = "dav_encoder"
DAV_CONFIG = "config.json"
DAV_WEIGHTS = "diffusion_pytorch_model.safetensors"
DAV_RELEASE_FILE = "dav.pth"
_FIRST_WEIGHT = "encoder.block.0.weight"


@dataclass(frozen=True)
class DavConfig:
    base_channels: int = 64
    strides: tuple[int, ...] = (2, 4, 8, 8)
    hidden_channels: int = 1024  # the last conv's width (d_latent in DAC)
    latent_channels: int = 64  # per audio channel; stereo gives 2x
    sample_rate_hz: int = 44_100

    @property
    def hop(self) -> int:
        return math.prod(self.strides)


class Snake(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + (self.alpha + 1e-9).reciprocal() * torch.sin(self.alpha * x).pow(2)


class ResidualUnit(nn.Module):
    def __init__(self, channels: int, dilation: int) -> None:
        super().__init__()
        self.block = nn.Sequential(
            Snake(channels),
            nn.Conv1d(channels, channels, 7, dilation=dilation, padding=3 * dilation),
            Snake(channels),
            nn.Conv1d(channels, channels, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)  # 'same' padding: lengths match, no DAC-style trim needed


class EncoderBlock(nn.Module):
    def __init__(self, channels: int, stride: int) -> None:
        super().__init__()
        half = channels // 2
        self.block = nn.Sequential(
            ResidualUnit(half, 1),
            ResidualUnit(half, 3),
            ResidualUnit(half, 9),
            Snake(half),
            # k = 2s, p = ceil(s/2): exactly n / s outputs for n divisible by s.
            nn.Conv1d(half, channels, 2 * stride, stride=stride, padding=math.ceil(stride / 2)),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class _Encoder(nn.Module):
    def __init__(self, config: DavConfig) -> None:
        super().__init__()
        width = config.base_channels
        layers: list[nn.Module] = [nn.Conv1d(1, width, 7, padding=3)]
        for stride in config.strides:
            width *= 2
            layers.append(EncoderBlock(width, stride))
        layers += [Snake(width), nn.Conv1d(width, config.hidden_channels, 3, padding=1)]
        self.block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class DavEncoder(nn.Module):
    """Mono waveforms [B, 1, T] (T divisible by the hop) -> posterior means [B, 64, T / hop]."""

    def __init__(self, config: DavConfig | None = None) -> None:
        super().__init__()
        self.config = config or DavConfig()
        self.encoder = _Encoder(self.config)
        self.mean_proj = nn.Conv1d(self.config.hidden_channels, self.config.latent_channels, 1)

    @property
    def hop(self) -> int:
        return self.config.hop

    def forward(self, waveform: torch.Tensor) -> torch.Tensor:
        return self.mean_proj(self.encoder(waveform))

    @torch.no_grad()
    def encode(
        self, audio: torch.Tensor, window_latents: int = 1024, context_latents: int = 96
    ) -> torch.Tensor:
        """PLANAR stereo [2, T] float at 44.1 kHz -> latents [128, ceil(T / 512)] float32.

        The song is right-padded with zeros to a whole hop and encoded in windows of
        `window_latents` with `context_latents` of real signal each side (HOT-Step's 1024 / 96),
        so memory stays flat for a 6-minute song; the context covers the receptive field, so the
        result matches a single pass to float rounding."""
        if audio.ndim != 2 or audio.shape[0] != 2:
            raise InputError(f"DAV encode wants planar stereo [2, T], got {tuple(audio.shape)}")
        param = next(self.parameters())
        hop = self.hop
        length = math.ceil(audio.shape[1] / hop)
        x = torch.nn.functional.pad(audio.float(), (0, length * hop - audio.shape[1]))
        x = x.to(device=param.device, dtype=param.dtype).unsqueeze(1)  # [2, 1, L*hop]: L, R
        pieces = []
        for start in range(0, length, window_latents):
            end = min(length, start + window_latents)
            lo, hi = max(0, start - context_latents), min(length, end + context_latents)
            out = self(x[..., lo * hop : hi * hop])  # [2, 64, hi - lo]
            pieces.append(out[..., start - lo : end - lo].float())
        latents = torch.cat(pieces, dim=-1)  # [2, 64, L]
        # [2, 64, L] -> [128, L]: rows 0-63 from the left channel, 64-127 from the right.
        return latents.reshape(2 * self.config.latent_channels, length).cpu()


# -- weights ------------------------------------------------------------------------------------
def fold_weight_norm(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`x.weight_g` [out, 1, 1] + `x.weight_v` [out, in, k] -> `x.weight` = g * v / ||v||, the
    norm over every axis but the output channel (torch weight_norm, dim 0)."""
    out = {}
    for key, tensor in state.items():
        if key.endswith(".weight_v"):
            stem = key[: -len(".weight_v")]
            v = tensor.float()
            g = state[f"{stem}.weight_g"].float()
            norm = v.reshape(v.shape[0], -1).norm(dim=1).reshape(-1, *([1] * (v.ndim - 1)))
            out[f"{stem}.weight"] = v * (g / norm)
        elif not key.endswith(".weight_g"):
            out[key] = tensor.float()
    return out


def config_from_state(state: dict[str, torch.Tensor]) -> DavConfig:
    """Architecture from tensor shapes: widths from the first/last convs, strides from each
    block's down-sampling kernel (2s)."""
    strides = []
    index = 1
    while f"encoder.block.{index}.block.4.weight" in state:
        strides.append(state[f"encoder.block.{index}.block.4.weight"].shape[-1] // 2)
        index += 1
    last = state[f"encoder.block.{index + 1}.weight"]
    return DavConfig(
        base_channels=int(state[_FIRST_WEIGHT].shape[0]),
        strides=tuple(strides),
        hidden_channels=int(last.shape[0]),
        latent_channels=int(state["mean_proj.weight"].shape[0]),
    )


def _unwrap(obj: object) -> dict[str, torch.Tensor]:
    """The encoder tensors of a release checkpoint: the dict itself or one nested level
    (`generator`, `state_dict`, `model`, ...), `module.` prefixes stripped."""
    candidates = [obj] + (list(obj.values()) if isinstance(obj, dict) else [])
    for candidate in candidates:
        if not isinstance(candidate, dict):
            continue
        state = {str(k).removeprefix("module."): v for k, v in candidate.items()}
        if any(k.startswith(_FIRST_WEIGHT) for k in state):
            return {
                k: v
                for k, v in state.items()
                if isinstance(v, torch.Tensor) and k.startswith(("encoder.", "mean_proj."))
            }
    raise InputError("no DAV encoder tensors (encoder.block.*, mean_proj.*) in the checkpoint")


def read_dav_state(mm3_root: str | Path) -> dict[str, torch.Tensor]:
    root = Path(mm3_root)
    converted = root / DAV_FOLDER / DAV_WEIGHTS
    if converted.is_file():
        return load_file(str(converted))
    release = root / DAV_RELEASE_FILE
    if release.is_file():
        return _unwrap(torch.load(release, map_location="cpu", weights_only=True))
    raise InputError(
        f"{root}: no DAV encoder ({DAV_FOLDER}/{DAV_WEIGHTS} or {DAV_RELEASE_FILE}). diffusers "
        "ships only the MM3 decoder; copy dav.pth from the MiniMaxAI/MiniMax-Music3 release"
    )


def load_dav_encoder(mm3_root: str | Path, device: str | torch.device = "cpu") -> DavEncoder:
    """The float32 encoder from an MM3 folder, in eval mode (the reference runs DAV in f32)."""
    state = fold_weight_norm(read_dav_state(mm3_root))
    config = config_from_state(state)
    if config.hop != HOP_SAMPLES or 2 * config.latent_channels != LATENT_CHANNELS:
        raise InputError(
            f"DAV encoder has hop {config.hop} and {2 * config.latent_channels} stereo channels; "
            f"MM3 needs hop {HOP_SAMPLES} and {LATENT_CHANNELS}"
        )
    model = DavEncoder(config)
    model.load_state_dict(state, strict=True)
    return model.to(device).eval()


def save_dav_encoder(model: DavEncoder, mm3_root: str | Path) -> Path:
    """Write `<mm3_root>/dav_encoder/` (plain weights + config), e.g. converted from dav.pth."""
    folder = Path(mm3_root) / DAV_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    (folder / DAV_CONFIG).write_text(json.dumps(asdict(model.config), indent=2) + "\n")
    state = {k: v.detach().float().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(folder / DAV_WEIGHTS))
    return folder
