"""GPU bench of MM3 DiT LoRA training: full-size random weights, bf16, our training step.

What one step is (`hotstep_ray.mm3.train.train_step` without the data loader): LoRA r32/alpha 32
on all 8 sites of the 36 blocks (fp32 adapter, bf16 frozen base, bf16 autocast), one crop of
`crop` latents, logit-normal t, x_t = t x0 + (1 - t) noise, target x0 - noise, MSE, backward,
clip 1.0, AdamW. Reported per crop length (689 = one 8 s window, 1378 = two): ms/step (median of
the timed steps, CUDA-synchronised, after warm-up), peak allocated/reserved memory (weights
included), parameter counts. The C++ seed measured 92 ms/step and 20.4 / 31.8 GB at 689 / 1378 on
an RTX 5090 (f32, manual attention); diffusers' MM3 attention goes through SDPA (flash).

Each row runs in its own try/except and the JSON is rewritten after every row.

  device:    pip install --no-deps .device_wheels/diffusers-0.42.1-py3-none-any.whl \
                 .device_wheels/importlib_metadata-*.whl
             python bench/mm3_bench.py --out $OUT/mm3_bench.json
  local dry: python bench/mm3_bench.py --tiny --device cpu --out /tmp/mm3_bench.json
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import platform
import statistics
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, no install

from hotstep_ray.mm3 import LATENT_HZ, flow  # noqa: E402  (torch only)

GIB = 1024**3
TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "ff_in", "ff_out", "proj_in", "proj_out")
TINY = {
    "num_layers": 2,
    "num_attention_heads": 2,
    "attention_head_dim": 16,
    "ff_inner_dim": 64,
    "condition_dim": 32,
    "rotary_dim": 8,
    "fourier_embedding_dim": 16,
}


def build_dit(tiny: bool, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """The released config (36 x 2048, 2.43 B params) on `meta`, materialised on the device with
    random weights (std 0.02 matrices, unit LayerNorms): no 9.7 GB checkpoint needed."""
    from diffusers import MiniMaxMusic3Transformer1DModel

    with torch.device("meta"):
        model = MiniMaxMusic3Transformer1DModel(**(TINY if tiny else {}))
    model = model.to_empty(device=device).to(dtype)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.fill_(1.0 if name.endswith("weight") else 0.0)
            elif name.endswith("bias"):
                param.zero_()
            else:
                param.normal_(0.0, 1.0 if "time_proj" in name else 0.02, generator=gen)
    return model


def inject_lora(model: torch.nn.Module, rank: int) -> tuple[list[torch.nn.Parameter], str]:
    """Our `training.adapters.inject` when its dependencies are installed, else the same peft
    config directly (identical layers: B = 0, fp32 adapter weights)."""
    try:
        from hotstep_ray.training import adapters

        spec = adapters.AdapterSpec(kind="lora", rank=rank, alpha=rank, targets=TARGETS)
        adapters.inject(model, spec)
        return [p for _, p in adapters.trainable_parameters(model)], "hotstep_ray.adapters"
    except ImportError:
        from peft import LoraConfig, inject_adapter_in_model

        config = LoraConfig(r=rank, lora_alpha=rank, target_modules=list(TARGETS))
        model.requires_grad_(False)
        inject_adapter_in_model(config, model)
        params = [p for n, p in model.named_parameters() if "lora_" in n]
        for param in params:
            param.data = param.data.float()
            param.requires_grad_(True)
        return params, "peft"


def train_step(
    model: torch.nn.Module,
    params: list[torch.nn.Parameter],
    optimizer: torch.optim.Optimizer,
    crop: int,
    index: int,
    device: torch.device,
    dtype: torch.dtype,
) -> float:
    """One LoRA step on a random crop; returns the loss (its .item() synchronises)."""
    gen = flow.generator(0, index)
    cond_dim = model.config.condition_dim
    x0 = torch.randn(1, 128, crop, generator=gen).to(device)
    cond = torch.randn(1, crop, cond_dim, generator=gen).to(device)
    noise = torch.randn(1, 128, crop, generator=gen).to(device)
    t = flow.sample_data_time(1, gen).to(device)
    optimizer.zero_grad(set_to_none=True)
    autocast = device.type == "cuda" and dtype == torch.bfloat16
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        loss = flow.flow_loss(model, x0, noise, t, cond)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    optimizer.step()
    return loss.item()


def run_row(args, crop: int, checkpointing: bool) -> dict[str, Any]:
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    model = build_dit(args.tiny, device, dtype)
    base_params = sum(p.numel() for p in model.parameters())
    if checkpointing:
        model.enable_gradient_checkpointing()
    params, injector = inject_lora(model, args.rank)
    model.train()
    optimizer = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)
    on_gpu = device.type == "cuda"

    for i in range(args.warmup):
        train_step(model, params, optimizer, crop, i, device, dtype)
    if on_gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    for i in range(args.steps):
        began = time.perf_counter()
        losses.append(train_step(model, params, optimizer, crop, args.warmup + i, device, dtype))
        if on_gpu:
            torch.cuda.synchronize()
        times.append(1000 * (time.perf_counter() - began))
    row = {
        "crop_latents": crop,
        "crop_seconds": round(crop / LATENT_HZ, 3),
        "gradient_checkpointing": checkpointing,
        "rank": args.rank,
        "injector": injector,
        "base_params": base_params,
        "lora_params": sum(p.numel() for p in params),
        "ms_per_step_median": statistics.median(times),
        "ms_per_step_min": min(times),
        "ms_per_step_all": [round(t, 2) for t in times],
        "loss_finite": all(math.isfinite(v) for v in losses),
    }
    if on_gpu:
        row["peak_allocated_gib"] = torch.cuda.max_memory_allocated() / GIB
        row["peak_reserved_gib"] = torch.cuda.max_memory_reserved() / GIB
    del model, optimizer, params
    gc.collect()
    if on_gpu:
        torch.cuda.empty_cache()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--crops", default="689,1378", help="Comma list of crop lengths.")
    parser.add_argument("--rank", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--tiny", action="store_true", help="Toy widths (CPU dry run).")
    parser.add_argument(
        "--checkpointing", default="off", help="off, on or both (gradient checkpointing rows)."
    )
    args = parser.parse_args()
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.checkpointing]
    result: dict[str, Any] = {
        "bench": "mm3_dit_lora_train_step",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device,
        "dtype": args.dtype,
        "tiny": args.tiny,
        "seed_reference": {"ms_per_step": 92, "peak_gb": {"689": 20.4, "1378": 31.8}},
        "rows": [],
    }
    try:
        import diffusers

        result["diffusers"] = diffusers.__version__
    except ImportError as exc:
        result["error"] = f"diffusers missing: {exc}"
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for crop in (int(c) for c in args.crops.split(",")):
        for checkpointing in modes:
            try:
                row = run_row(args, crop, checkpointing)
            except Exception as exc:  # one failing row must not lose the others
                row = {"crop_latents": crop, "gradient_checkpointing": checkpointing,
                       "error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}  # fmt: skip
            result["rows"].append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "ms_per_step_all"}), flush=True)
            out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
