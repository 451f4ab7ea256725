"""Smoke run: every ACE-Step 1.5 component at full size, random weights, one bf16 forward each.

For the 2B and XL DiT checkpoints (transformer, condition encoder, audio tokenizer,
detokenizer), the Oobleck VAE, Qwen3-Embedding-0.6B and the 5 Hz LMs (0.6B, 1.7B, 4B): build
through `hotstep_ray.models.full_configs` (the loaders' config mapping and classes), run a
forward at realistic shapes and record parameters, weight memory, peak memory, forward time
(median of 3 after 1 warm-up, synchronised), output shape and a finite check.

Each group (one model or one DiT checkpoint) runs in its own try/except and the JSON is
rewritten after every row, so one failure loses nothing else.

  device:    python bench/smoke_models.py --out $OUT/smoke.json
  local dry: python bench/smoke_models.py --tiny --device cpu --dtype float32 --out /tmp/s.json
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, no install

from hotstep_ray.models import acestep_ops as ops  # noqa: E402
from hotstep_ray.models import full_configs as fc  # noqa: E402
from hotstep_ray.models.acestep_dit import resolve_device_dtype  # noqa: E402

GIB = 1024**3
GROUPS = ("dit-2b", "dit-xl", "vae", "text-encoder", "lm-0.6B", "lm-1.7B", "lm-4B")

# Shapes (batch 1). Latents are 25 Hz x 64; codes 5 Hz. The condition is what training
# preprocessing pads to: 512 lyric + 1 timbre + 256 caption tokens = 769 (dit-peer-baseline).
FULL_SHAPES = {
    "dit_frames": (1500, 6000),  # 60 s (the brief's shape) and 240 s (a whole song)
    "text_tokens": 256,
    "lyric_tokens": 512,
    "timbre_frames": 750,  # 30 s reference (timbre_fix_frame)
    "tokenizer_frames": 750,
    "detok_codes": 150,
    "vae_seconds": (10, 30),  # 30 s is lm-vae-baseline's size, for comparison
    "text_encoder_tokens": 256,
    "lm_tokens": 1024,
}
TINY_SHAPES = {
    "dit_frames": (40,),
    "text_tokens": 6,
    "lyric_tokens": 9,
    "timbre_frames": 20,
    "tokenizer_frames": 25,
    "detok_codes": 5,
    "vae_seconds": (0.2,),
    "text_encoder_tokens": 8,
    "lm_tokens": 16,
}


# --------------------------------------------------------------------------- configs


def _tiny_qwen(config: dict[str, Any]) -> dict[str, Any]:
    # Same keys and vocabulary, 2 narrow layers: exercises the code path in seconds on CPU.
    return {
        **config,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "max_window_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
    }


def configs(tiny: bool) -> dict[str, dict[str, Any]]:
    if not tiny:
        return {
            "dit-2b": fc.dit_config("2b"),
            "dit-xl": fc.dit_config("xl"),
            "vae": dict(fc.VAE_CONFIG),
            "text-encoder": dict(fc.TEXT_ENCODER_CONFIG),
            **{f"lm-{size}": dict(config) for size, config in fc.LM_CONFIGS.items()},
        }
    from hotstep_ray.models.tiny_dit import tiny_config
    from hotstep_ray.models.tiny_tree import TINY_VAE

    return {
        "dit-2b": tiny_config("turbo"),
        "dit-xl": tiny_config("xl-turbo"),
        "vae": {"_class_name": "AutoencoderOobleck", **TINY_VAE},
        "text-encoder": _tiny_qwen(fc.TEXT_ENCODER_CONFIG),
        **{f"lm-{size}": _tiny_qwen(config) for size, config in fc.LM_CONFIGS.items()},
    }


# --------------------------------------------------------------------------- measuring


class Recorder:
    """Collects rows and errors; rewrites the JSON file after each one."""

    def __init__(self, path: Path, env: dict[str, Any]) -> None:
        self.path = path
        self.data: dict[str, Any] = {"env": env, "results": [], "errors": []}
        path.parent.mkdir(parents=True, exist_ok=True)
        self.flush()

    def flush(self) -> None:
        self.path.write_text(json.dumps(self.data, indent=2) + "\n")

    def row(self, row: dict[str, Any]) -> None:
        self.data["results"].append(row)
        self.flush()
        print(json.dumps(row), flush=True)

    def error(self, group: str, what: str, exc: BaseException) -> None:
        entry = {"group": group, "what": what, "error": repr(exc), "trace": traceback.format_exc()}
        self.data["errors"].append(entry)
        self.flush()
        print(f"ERROR {group}/{what}: {exc!r}\n{entry['trace']}", flush=True)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _allocated(device: torch.device) -> int:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def _module_stats(module: torch.nn.Module) -> dict[str, Any]:
    params = list(module.parameters())  # shared (tied) tensors once
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    buffer_bytes = sum(b.numel() * b.element_size() for b in module.buffers())
    return {
        "params": sum(p.numel() for p in params),
        "weights_gib": param_bytes / GIB,
        "buffers_gib": buffer_bytes / GIB,
    }


def _main_tensor(out: Any) -> torch.Tensor:
    # The first tensor of a tuple/ModelOutput/dataclass is the component's output.
    if isinstance(out, torch.Tensor):
        return out
    for attr in ("sample", "logits", "last_hidden_state", "quantized"):
        value = getattr(out, attr, None)
        if isinstance(value, torch.Tensor):
            return value
    if isinstance(out, (tuple, list)):
        return _main_tensor(out[0])
    latent_dist = getattr(out, "latent_dist", None)
    if latent_dist is not None:
        return latent_dist.mean
    raise TypeError(f"no tensor in {type(out).__name__}")


def measure(
    fn: Callable[[], Any], device: torch.device, warmup: int = 1, repeats: int = 3
) -> tuple[Any, dict[str, Any]]:
    """Run `fn` warmup + repeats times under inference_mode. Peak memory is of the timed calls
    only (previous output freed first, so it is one forward's peak over the resident weights)."""
    with torch.inference_mode():
        for _ in range(warmup):
            out = fn()
            del out
        _sync(device)
        resident = _allocated(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        times = []
        out = None
        for _ in range(repeats):
            out = None
            _sync(device)
            start = time.perf_counter()
            out = fn()
            _sync(device)
            times.append((time.perf_counter() - start) * 1000.0)
        peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    tensor = _main_tensor(out)
    stats = {
        "forward_ms": statistics.median(times),
        "forward_ms_all": [round(value, 3) for value in times],
        "resident_gib": resident / GIB,
        "peak_gib": peak / GIB,
        "activation_gib": (peak - resident) / GIB,
        "out_shape": list(tensor.shape),
        "out_dtype": str(tensor.dtype).removeprefix("torch."),
        "finite": bool(torch.isfinite(tensor.float()).all()),
        "out_std": float(tensor.float().std()) if tensor.numel() > 1 else None,
    }
    return out, stats


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------- groups


def run_dit(group, config, shapes, device, dtype, rec: Recorder) -> None:
    """One DiT checkpoint: build all four components (they live together in one official file
    and a worker holds them together), then one forward of each."""
    _sync(device)
    before = _allocated(device)
    start = time.perf_counter()
    models = fc.build_dit(config, device, dtype, seed=1)
    _sync(device)
    build = {
        "build_s": time.perf_counter() - start,
        "group_weights_gib": (_allocated(device) - before) / GIB,
    }
    print(f"{group}: built {models.variant.name} in {build['build_s']:.1f} s", flush=True)
    gen = torch.Generator(device=device).manual_seed(0)
    text_dim = int(config["text_hidden_dim"])

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=device).to(dtype)

    def ones(length: int) -> torch.Tensor:
        return torch.ones(1, length, dtype=torch.long, device=device)

    def base(component: str, module: torch.nn.Module) -> dict[str, Any]:
        return {"group": group, "component": component, **_module_stats(module), **build}

    # Condition encoder: caption states, lyric token embeddings, a 30 s timbre reference (the
    # no-reference path feeds silence latents) -> packed [1, Ll + 1 + Lt, H_enc].
    cond = None
    try:
        text = randn(1, shapes["text_tokens"], text_dim)
        lyric = randn(1, shapes["lyric_tokens"], text_dim)
        refs = models.silence_latent[:, : shapes["timbre_frames"]].to(dtype)
        order = torch.zeros(1, dtype=torch.long, device=device)
        out, stats = measure(
            lambda: ops.encode_condition(
                models, text, ones(text.shape[1]), lyric, ones(lyric.shape[1]), refs, order
            ),
            device,
        )
        cond = out[0]
        rec.row(
            {
                **base("condition_encoder", models.condition_encoder),
                "inputs": f"text {list(text.shape)}, lyric {list(lyric.shape)}, "
                f"timbre {list(refs.shape)}",
                **stats,
            }
        )
    except Exception as exc:  # noqa: BLE001 - record and go on with the other components
        rec.error(group, "condition_encoder", exc)

    try:
        latents = randn(1, shapes["tokenizer_frames"], 64)
        _, stats = measure(lambda: ops.tokenize(models, latents), device)
        rec.row(
            {
                **base("audio_tokenizer", models.audio_tokenizer),
                "inputs": f"latents {list(latents.shape)}",
                **stats,
            }
        )
    except Exception as exc:  # noqa: BLE001
        rec.error(group, "audio_tokenizer", exc)

    try:
        # Random 5 Hz codes -> FSQ project_out -> detokenizer -> 25 Hz latents.
        codes = torch.randint(0, 64000, (1, shapes["detok_codes"]), generator=gen, device=device)
        _, stats = measure(lambda: ops.codes_to_latents(models, codes), device)
        rec.row(
            {
                **base("detokenizer", models.detokenizer),
                "inputs": f"codes {list(codes.shape)}",
                **stats,
            }
        )
    except Exception as exc:  # noqa: BLE001
        rec.error(group, "detokenizer", exc)

    enc_width = int(config.get("encoder_hidden_size", config["hidden_size"]))
    if cond is None:  # keep the DiT measurable if the encoder failed
        length = shapes["lyric_tokens"] + 1 + shapes["text_tokens"]
        cond = randn(1, length, enc_width)
    for frames in shapes["dit_frames"]:
        try:
            x_t = randn(1, frames, 64)
            t = torch.full((1,), 0.5, device=device, dtype=dtype)
            context = ops.text2music_context(models, 1, frames).to(dtype)
            _, stats = measure(
                lambda x_t=x_t, t=t, context=context: models.transformer(
                    hidden_states=x_t,
                    timestep=t,
                    timestep_r=t,
                    encoder_hidden_states=cond,
                    context_latents=context,
                    return_dict=False,
                )[0],
                device,
            )
            rec.row(
                {
                    **base("transformer", models.transformer),
                    "inputs": f"x_t {list(x_t.shape)}, context {list(context.shape)}, "
                    f"encoder {list(cond.shape)}",
                    **stats,
                }
            )
        except Exception as exc:  # noqa: BLE001
            rec.error(group, f"transformer T={frames}", exc)


def run_vae(group, config, shapes, device, dtype, rec: Recorder) -> None:
    start = time.perf_counter()
    vae = fc.build_vae(config, device, dtype, seed=2)
    _sync(device)
    base = {"group": group, **_module_stats(vae), "build_s": time.perf_counter() - start}
    gen = torch.Generator(device=device).manual_seed(0)
    rate = int(config["sampling_rate"])
    for seconds in shapes["vae_seconds"]:
        samples = int(round(seconds * rate))
        latents = None
        try:
            audio = (0.3 * torch.randn(1, 2, samples, generator=gen, device=device)).to(dtype)
            # Training preprocessing samples the posterior (acestep15 §2.7).
            out, stats = measure(lambda audio=audio: vae.encode(audio).latent_dist.sample(), device)
            latents = out
            rec.row(
                {**base, "component": "vae.encode", "inputs": f"audio {list(audio.shape)}", **stats}
            )
        except Exception as exc:  # noqa: BLE001
            rec.error(group, f"encode {seconds}s", exc)
        try:
            if latents is None:
                frames = samples // 1920
                latents = torch.randn(1, 64, frames, generator=gen, device=device).to(dtype)
            _, stats = measure(lambda latents=latents: vae.decode(latents).sample, device)
            rec.row(
                {
                    **base,
                    "component": "vae.decode",
                    "inputs": f"latents {list(latents.shape)}",
                    **stats,
                }
            )
        except Exception as exc:  # noqa: BLE001
            rec.error(group, f"decode {seconds}s", exc)


def run_qwen(group, config, shapes, device, dtype, rec: Recorder) -> None:
    start = time.perf_counter()
    causal = group.startswith("lm-")
    if causal:
        model = fc.build_lm(config, device, dtype, seed=3)
        tokens = shapes["lm_tokens"]
    else:
        model = fc.build_text_encoder(config, device, dtype, seed=4)
        tokens = shapes["text_encoder_tokens"]
    _sync(device)
    base = {"group": group, **_module_stats(model), "build_s": time.perf_counter() - start}
    gen = torch.Generator(device=device).manual_seed(0)
    ids = torch.randint(0, int(config["vocab_size"]), (1, tokens), generator=gen, device=device)
    try:
        _, stats = measure(lambda: model(input_ids=ids, use_cache=False), device)
        component = "lm (logits)" if causal else "text_encoder (last_hidden_state)"
        rec.row({**base, "component": component, "inputs": f"ids {list(ids.shape)}", **stats})
    except Exception as exc:  # noqa: BLE001
        rec.error(group, "forward", exc)


def environment(device: torch.device, dtype: torch.dtype, tiny: bool) -> dict[str, Any]:
    import diffusers
    import transformers

    env = {
        "date_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "diffusers": diffusers.__version__,
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
        "tiny": tiny,
        "argv": sys.argv,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, gpu_memory_gib=props.total_memory / GIB)
        env["sdpa_cudnn"] = torch.backends.cuda.cudnn_sdp_enabled()
    return env


def summary(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'group':<13}{'component':<34}{'params M':>10}{'weights':>9}{'peak':>9}"
        f"{'act':>8}{'ms':>9}  {'finite':<7}out",
    ]
    for row in rows:
        lines.append(
            f"{row['group']:<13}{row['component']:<34}{row['params'] / 1e6:>10.1f}"
            f"{row['weights_gib']:>9.3f}{row['peak_gib']:>9.3f}{row['activation_gib']:>8.3f}"
            f"{row['forward_ms']:>9.2f}  {row['finite']!s:<7}{row['out_shape']}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("smoke.json"))
    parser.add_argument(
        "--only", default=",".join(GROUPS), help="comma list of " + ",".join(GROUPS)
    )
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--tiny", action="store_true", help="tiny configs and shapes (CPU check)")
    args = parser.parse_args(argv)
    device, dtype = resolve_device_dtype(args.device, args.dtype)
    groups = [group for group in args.only.split(",") if group]
    unknown = sorted(set(groups) - set(GROUPS))
    if unknown:
        parser.error(f"unknown groups {unknown}")
    torch.backends.cuda.matmul.allow_tf32 = True  # irrelevant in bf16; fp32 runs use TF32
    rec = Recorder(args.out, environment(device, dtype, args.tiny))
    print(json.dumps(rec.data["env"]), flush=True)
    shapes = TINY_SHAPES if args.tiny else FULL_SHAPES
    all_configs = configs(args.tiny)
    runners = {"dit": run_dit, "vae": run_vae, "text": run_qwen, "lm": run_qwen}
    for group in groups:
        runner = runners[group.split("-")[0]]
        try:
            runner(group, all_configs[group], shapes, device, dtype, rec)
        except Exception as exc:  # noqa: BLE001 - a build failure loses only this group
            rec.error(group, "build", exc)
        _free(device)  # the group's models are unreachable once its runner returns
    print(summary(rec.data["results"]))
    print(f"{len(rec.data['results'])} rows, {len(rec.data['errors'])} errors -> {args.out}")
    return 1 if rec.data["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
