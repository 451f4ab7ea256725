"""A 2-block toy transformer named like the ACE-Step DiT (diffusers names), and helpers."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

DIM, HIDDEN, IN_CH, HEADS = 64, 128, 16, 2


class ToyAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.to_q = nn.Linear(DIM, DIM)
        self.to_k = nn.Linear(DIM, DIM)
        self.to_v = nn.Linear(DIM, DIM)
        self.to_out = nn.ModuleList([nn.Linear(DIM, DIM), nn.Dropout(0.0)])

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape

        def heads(y: torch.Tensor) -> torch.Tensor:  # [B, L, D] -> [B, H, L, D/H]
            return y.view(b, -1, HEADS, DIM // HEADS).transpose(1, 2)

        out = F.scaled_dot_product_attention(
            heads(self.to_q(x)), heads(self.to_k(context)), heads(self.to_v(context))
        )
        return self.to_out[1](self.to_out[0](out.transpose(1, 2).reshape(b, t, DIM)))


class ToyMlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(DIM, HIDDEN, bias=False)
        self.up_proj = nn.Linear(DIM, HIDDEN, bias=False)
        self.down_proj = nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class ToyBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn_norm = nn.LayerNorm(DIM)
        self.self_attn = ToyAttention()
        self.cross_attn_norm = nn.LayerNorm(DIM)
        self.cross_attn = ToyAttention()
        self.mlp_norm = nn.LayerNorm(DIM)
        self.mlp = ToyMlp()

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        h = self.self_attn_norm(x)
        x = x + self.self_attn(h, h)
        x = x + self.cross_attn(self.cross_attn_norm(x), context)
        return x + self.mlp(self.mlp_norm(x))


class ToyTransformer(nn.Module):
    """x `[B, T, 16]`, context `[B, S, 64]` -> `[B, T, 16]`."""

    def __init__(self) -> None:
        super().__init__()
        self.proj_in = nn.Linear(IN_CH, DIM)
        self.layers = nn.ModuleList([ToyBlock(), ToyBlock()])
        self.proj_out = nn.Linear(DIM, IN_CH)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        h = self.proj_in(x)
        for layer in self.layers:
            h = layer(h, context)
        return self.proj_out(h)


@pytest.fixture
def make_toy() -> Callable[[int], ToyTransformer]:
    """Deterministic toy model per seed (same seed = same base weights)."""

    def make(seed: int = 0) -> ToyTransformer:
        torch.manual_seed(seed)
        return ToyTransformer().eval()

    return make


@pytest.fixture
def toy_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1234)
    x = torch.randn(2, 6, IN_CH, generator=generator)
    context = torch.randn(2, 5, DIM, generator=generator)
    return x, context


@pytest.fixture
def randomize() -> Callable[..., None]:
    """Fill every adapter tensor with N(0, std²) so ΔW ≠ 0 (LoRA B and LoKR w2 start at zero)."""
    from hotstep_ray.training import adapters

    def fill(model: nn.Module, seed: int = 7, std: float = 0.05) -> None:
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for param in adapters.adapter_parameters(model).values():
                param.copy_(torch.randn(param.shape, generator=generator) * std)

    return fill


@contextlib.contextmanager
def recording_merged_calls() -> Iterator[list[torch.Tensor]]:
    """Inside: the input x of every LoKR `MergedKron` call (recorded, then the real Function
    runs). Eager only: a compiled region would trace the recording."""
    from hotstep_ray.training import adapters

    seen: list[torch.Tensor] = []
    apply = adapters.MergedKron.apply

    def recording(x, *rest):
        seen.append(x.detach())
        return apply(x, *rest)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(adapters.MergedKron, "apply", staticmethod(recording))
        yield seen


@pytest.fixture
def merged_calls() -> Iterator[list[torch.Tensor]]:
    """`recording_merged_calls` for a whole test."""
    with recording_merged_calls() as seen:
        yield seen


@pytest.fixture
def record_merged() -> Callable[[], contextlib.AbstractContextManager]:
    """`recording_merged_calls` for part of a test (e.g. an eager call before dynamo traces)."""
    return recording_merged_calls
