"""Audition benchmark: codes -> WAV latency, LM codes/s, p50/p99 under concurrent clients.

Full-size random-initialised models built by `hotstep_ray.models.full_configs` (the loaders'
classes and config mapping): the 2B DiT's FSQ quantizer + detokenizer (the rest of the DiT is
built, then dropped), the Oobleck VAE, and the 5 Hz LM (default 1.7B). Everything runs through
the plain audition classes (`CodesDecoder`, `PlannerLM`), the code Serve replicas run.

Sections (each in its own try/except; the JSON is rewritten after every row):
  decode        codes -> WAV bytes for 30 s and 240 s, per tiling/compile config: median/p90,
                GPU-only time, weights and peak memory; each decoder is warmed first (as a
                Serve replica is): `warm_s`, `reserved_after_warm_gib`
  decode-load   8 and 32 concurrent clients (threads) on one decoder, 30 s clips: p50/p99
  lm            codes/s for 30 s and 240 s songs (CFG 2.0, metas pinned), per decode engine
                (LM_ENGINES: graph, compiled = Inductor step in our CUDA graph, compiled-max =
                the same with GEMM autotuning, eager, ...), base and with a random LoRA r16
                adapter (q,k,v,o,gate,up,down); `warmup_s` includes any compile
  lm-load       8 and 32 concurrent clients on one planner, 30 s songs: p50/p99

VAE configs "old*" are the plain diffusers path (weight norm folded, nothing else); "fast*" the
`oobleck_fast` path (fused Snake, CUDA graphs per window shape, ...), each on a fresh VAE of the
same weights (the fast path prepares its VAE in place), so old and fast rows compare directly
and each row records `max_abs_diff_vs_first_config` against the first config's audio.

  device, quick (~5 min; old vs fast decode, then the LM graph/compiled engines vs eager, 30 s):
    python bench/audition_bench.py --quick --budget-s 500 --out $OUT/audition_quick.json
  device, full decode sweep:  --sections decode --vae-configs old,fast,fast-nhwc,fast-t1024,...
  CPU dry:  python bench/audition_bench.py --tiny --device cpu --quick --out /tmp/ab.json
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, no install

from bench_report import JsonReport, percentile, seeded_codes  # noqa: E402

from hotstep_ray.audition.decode import CodesDecoder, pcm16_wav  # noqa: E402
from hotstep_ray.audition.planner import LoadedLm, PlannerLM, shared_copy  # noqa: E402
from hotstep_ray.audition.schemas import LmRequest  # noqa: E402
from hotstep_ray.models.acestep_dit import resolve_device_dtype  # noqa: E402

GIB = 1024**3
SECTIONS = ("decode", "decode-load", "lm", "lm-load")
# Tiling / compile configurations of the VAE decode (TiledVaeDecoder keyword arguments).
_OLD = {"tile_frames": 768, "overlap_frames": 32, "tile_batch": 1, "fast": False}
_FAST = {"tile_frames": 768, "overlap_frames": 16, "tile_batch": 1, "fast": True}
VAE_CONFIGS: dict[str, dict[str, Any]] = {
    "old": _OLD,
    "old-b2": {**_OLD, "tile_batch": 2},
    "old-compiled": {**_OLD, "compile": True},
    "fast": _FAST,  # Triton Snake, ncw convs, CUDA graphs
    "fast-nhwc": {**_FAST, "fast_options": {"layout": "nhwc"}},
    "fast-nographs": {**_FAST, "fast_options": {"cuda_graphs": False}},
    "fast-nofuse": {**_FAST, "fast_options": {"fuse_residual": False}},
    "fast-torchsnake": {**_FAST, "fast_options": {"snake": "torch"}},
    "fast-compile": {**_FAST, "compile": True},
    "fast-compile-nhwc": {**_FAST, "compile": True, "fast_options": {"layout": "nhwc"}},
    "fast-t1024": {**_FAST, "tile_frames": 1024},
    "fast-t512-b2": {**_FAST, "tile_frames": 512, "tile_batch": 2},
    "fast-nhwc-t1024": {**_FAST, "tile_frames": 1024, "fast_options": {"layout": "nhwc"}},
}
# Old names of earlier runs, kept so their commands still work.
VAE_CONFIGS["default"] = VAE_CONFIGS["old"]
VAE_CONFIGS["batch2"] = VAE_CONFIGS["old-b2"]
VAE_CONFIGS["compiled"] = VAE_CONFIGS["old-compiled"]
# LM decode engines the benches time: name -> (PlannerLM decode_mode, Inductor compile_mode).
LM_ENGINES: dict[str, tuple[str, str | None]] = {
    "auto": ("auto", None),
    "eager": ("eager", None),
    "static": ("static", None),
    "graph": ("graph", None),
    "compiled": ("compiled", None),
    "compiled-max": ("compiled", "max-autotune-no-cudagraphs"),
}
PIN = {"bpm": 120, "keyscale": "C major", "timesignature": "4", "language": "en"}
CAPTION = "driving synthwave, analog bass, gated drums, airy female vocal"
LYRICS = "[verse]\nneon on the water, engines in the rain\n[chorus]\nwe ride until the dawn"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _stats(ms: list[float]) -> dict[str, float]:
    return {
        "n": len(ms),
        "median_ms": round(statistics.median(ms), 3),
        "p50_ms": round(percentile(ms, 50), 3),
        "p90_ms": round(percentile(ms, 90), 3),
        "p99_ms": round(percentile(ms, 99), 3),
        "min_ms": round(min(ms), 3),
        "max_ms": round(max(ms), 3),
    }


def _mem(device: torch.device) -> dict[str, float]:
    if device.type != "cuda":
        return {}
    return {
        "allocated_gib": round(torch.cuda.memory_allocated(device) / GIB, 3),
        "peak_allocated_gib": round(torch.cuda.max_memory_allocated(device) / GIB, 3),
        "peak_reserved_gib": round(torch.cuda.max_memory_reserved(device) / GIB, 3),
    }


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _param_gib(*modules: torch.nn.Module) -> float:
    total = sum(p.numel() * p.element_size() for m in modules for p in m.parameters())
    return round(total / GIB, 3)


# --------------------------------------------------------------------------- builders


def build_decoder_parts(args, device, dtype):
    """(quantizer, detokenizer, make_vae) at full size (or from the tiny tree with --tiny);
    make_vae() builds a fresh VAE with the same weights each call."""
    if args.tiny:
        from hotstep_ray.audition.checkpoints import load_codes_parts
        from hotstep_ray.models.text_models import load_vae

        quantizer, detokenizer = load_codes_parts(
            args.tiny_tree / "acestep-v15-turbo", device, dtype
        )
        return quantizer, detokenizer, lambda: load_vae(args.tiny_tree / "vae", device, dtype)
    from hotstep_ray.models import full_configs as fc

    models = fc.build_dit(fc.dit_config("2b"), device, dtype, silence_frames=64)
    quantizer, detokenizer = models.audio_tokenizer.quantizer, models.detokenizer
    del models  # the transformer and condition encoder are not needed for codes -> audio
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return quantizer, detokenizer, lambda: fc.build_vae(device=device, dtype=dtype, seed=0)


def make_decoder(parts, config: str) -> CodesDecoder:
    """A CodesDecoder with a fresh VAE and the named tiling / fast-path options."""
    from hotstep_ray.models.oobleck_fast import OobleckFastOptions

    quantizer, detokenizer, make_vae = parts
    options = dict(VAE_CONFIGS[config])
    if "fast_options" in options:
        options["fast_options"] = OobleckFastOptions(**options["fast_options"])
    return CodesDecoder(quantizer, detokenizer, make_vae(), **options)


def profile_decode(decoder: CodesDecoder, codes: list[int], top: int = 15) -> list[dict]:
    """The `top` kernels of one warm decode by device time (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if decoder.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        decoder.decode_tensor(codes)
    rows = []
    for event in prof.key_averages():
        device_us = getattr(event, "device_time_total", 0) or getattr(event, "cuda_time_total", 0)
        if device_us or decoder.device.type != "cuda":
            rows.append(
                {
                    "name": event.key[:120],
                    "calls": event.count,
                    "device_ms": round(device_us / 1000, 3),
                    "cpu_ms": round(event.cpu_time_total / 1000, 3),
                }
            )
    key = "device_ms" if decoder.device.type == "cuda" else "cpu_ms"
    return sorted(rows, key=lambda r: -r[key])[:top]


def build_lm(args, device, dtype):
    from hotstep_ray.models.lm_tokenizer import build_lm_tokenizer

    if args.tiny:
        from hotstep_ray.models.text_models import load_lm

        lm = load_lm(args.tiny_tree / "acestep-5Hz-lm-0.6B", device, dtype)
        return lm, build_lm_tokenizer(), "0.6B"
    from hotstep_ray.models import full_configs as fc

    lm = fc.build_lm(fc.LM_CONFIGS[args.lm_size], device, dtype)
    return lm, build_lm_tokenizer(), args.lm_size


def random_lora(lm: torch.nn.Module, rank: int = 16) -> LoadedLm:
    """A LoRA r16/a32 on every projection of a shared copy, nonzero B (as a trained one)."""
    from hotstep_ray.training import adapters

    copy = shared_copy(lm)
    targets = adapters.LM_ATTENTION_TARGETS + adapters.MLP_TARGETS
    adapters.inject(copy, adapters.AdapterSpec(rank=rank, alpha=2 * rank, targets=targets))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for key, param in adapters.adapter_parameters(copy).items():
            if "lora_B" in key:
                noise = torch.randn(param.shape, generator=generator) * 0.01
                param.copy_(noise.to(param.device, param.dtype))
    copy.eval().requires_grad_(False)
    return LoadedLm(name="bench-lora", model=copy, key="")


# --------------------------------------------------------------------------- sections


def bench_decode(args, device, dtype, record: Callable[[dict], None], parts) -> None:
    reference: dict[float, torch.Tensor] = {}  # seconds -> the first config's audio (CPU)
    for name in args.vae_configs:
        if args.out_of_time():
            record({"section": "decode", "config": name, "skipped": "time budget"})
            continue
        decoder = make_decoder(parts, name)
        # As a Serve replica does: the tile window's graph first, so it sizes the graph pool.
        warm: dict[str, float] = {"warm_s": round(decoder.warm(), 2)}
        if device.type == "cuda":
            warm["reserved_after_warm_gib"] = round(torch.cuda.memory_reserved(device) / GIB, 3)
        weights = _param_gib(decoder.quantizer, decoder.detokenizer, decoder.vae.vae)
        for seconds in args.decode_seconds:
            codes = seeded_codes(seconds, seed=int(seconds))
            row: dict[str, Any] = {
                "section": "decode",
                "config": name,
                "path": "fast" if VAE_CONFIGS[name].get("fast") else "old",
                "tiling": VAE_CONFIGS[name],
                "vae": decoder.vae.describe(),
                "seconds": seconds,
                "codes": len(codes),
                "weights_gib": weights,
                "plan": vars(decoder.vae.plan(len(codes) * 5)),
                **warm,  # the decoder's, before its first row
            }
            start = time.perf_counter()
            for _ in range(args.warmup):
                decoder.decode(codes)
            row["warmup_s"] = round(time.perf_counter() - start, 2)  # includes any compile
            gc.collect()
            _reset_peak(device)
            gpu_ms, total_ms = [], []
            for _ in range(args.repeat):
                start = time.perf_counter()
                decoder.decode_tensor(codes)  # synchronised decode, audio left on the device
                gpu_ms.append((time.perf_counter() - start) * 1000)
                start = time.perf_counter()
                result = decoder.decode(codes)  # + PCM16 on device, transfer, WAV bytes
                total_ms.append((time.perf_counter() - start) * 1000)
            row["decode_to_tensor"] = _stats(gpu_ms)
            row["codes_to_wav_bytes"] = _stats(total_ms)
            audio = decoder.decode_tensor(codes)  # [2, T] on the device: the WAV step alone
            wav_ms = []
            for _ in range(args.repeat):
                start = time.perf_counter()
                pcm16_wav(audio)
                wav_ms.append((time.perf_counter() - start) * 1000)
            row["wav_only"] = _stats(wav_ms)
            del audio
            row["wav_bytes"] = len(result.audio)
            row["memory"] = _mem(device)
            row["realtime_x"] = round(seconds / (statistics.median(total_ms) / 1000), 1)
            audio = decoder.decode_tensor(codes).cpu()
            if seconds in reference:
                row["max_abs_diff_vs_first_config"] = round(
                    float((audio - reference[seconds]).abs().max()), 5
                )
            else:
                reference[seconds] = audio
                row["reference_for_diffs"] = True
            if args.profile and seconds == max(args.decode_seconds):
                row["top_kernels"] = profile_decode(decoder, codes)
            record(row)
        del decoder
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _load(fn: Callable[[int], float], clients: int, requests_per_client: int) -> dict[str, Any]:
    """`clients` threads, each issuing `requests_per_client` calls of fn(i) back to back."""
    latencies: list[float] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        for k in range(requests_per_client):
            ms = fn(index * requests_per_client + k)
            with lock:
                latencies.append(ms)

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        list(pool.map(client, range(clients)))
    wall = time.perf_counter() - start
    return {
        "clients": clients,
        "requests": len(latencies),
        "wall_s": round(wall, 3),
        "throughput_rps": round(len(latencies) / wall, 3),
        **_stats(latencies),
    }


def bench_decode_load(args, device, dtype, record, parts) -> None:
    if args.out_of_time():
        record({"section": "decode-load", "skipped": "time budget"})
        return
    decoder = make_decoder(parts, args.load_vae_config)
    clips = [seeded_codes(args.load_seconds, seed=i) for i in range(8)]
    decoder.decode(clips[0])

    def one(i: int) -> float:
        start = time.perf_counter()
        decoder.decode(clips[i % len(clips)])
        return (time.perf_counter() - start) * 1000

    for clients in args.clients:
        row = {
            "section": "decode-load",
            "seconds": args.load_seconds,
            "config": args.load_vae_config,
        }
        row.update(_load(one, clients, args.requests_per_client))
        row["note"] = "one decoder instance: requests queue on its lock (one replica)"
        record(row)


def _lm_request(seconds: float, seed: int, adapter: str = "") -> LmRequest:
    return LmRequest(caption=CAPTION, lyrics=LYRICS, duration=seconds, lm_seed=seed, **PIN)


def bench_lm(args, device, dtype, record, lm_parts) -> None:
    lm, tokenizer, size = lm_parts
    adapters = [None, random_lora(lm)] if args.lm_adapter else [None]
    for mode, merge in itertools.product(args.decode_modes, args.lm_merge):
        decode_mode, compile_mode = LM_ENGINES[mode]
        planner = PlannerLM(
            lm,
            tokenizer,
            lm_size=size,
            decode_mode=decode_mode,
            compile_mode=compile_mode,
            merge_adapters=merge,
        )
        for adapter in adapters:
            for seconds in args.lm_seconds:
                if mode == "eager" and seconds > args.eager_max_seconds:
                    continue  # eager is the slow reference: its long rows cost minutes
                if args.out_of_time():
                    record({"section": "lm", "decode_mode": mode, "skipped": "time budget"})
                    continue
                request = _lm_request(seconds, seed=1)
                row: dict[str, Any] = {
                    "section": "lm",
                    "lm": size,
                    "decode_mode": mode,
                    "compile_mode": compile_mode,
                    "adapter": "lora-r16-all-proj" if adapter else "",
                    "merged": bool(adapter) and planner.merge_adapters,
                    "seconds": seconds,
                    "codes": int(seconds * 5),
                    "cfg_scale": request.cfg_scale,
                }
                start = time.perf_counter()
                planner.generate(request, adapter)  # warm-up: compile, graph capture, allocator
                row["warmup_s"] = round(time.perf_counter() - start, 2)
                _reset_peak(device)
                ms, rates = [], []
                for k in range(args.lm_repeat):
                    result = planner.generate(_lm_request(seconds, seed=2 + k), adapter)
                    ms.append(result.lm_ms)
                    rates.append(result.codes_per_s)
                row["latency"] = _stats(ms)
                row["codes_per_s_median"] = round(statistics.median(rates), 1)
                if args.lm_profile and device.type == "cuda":
                    row["profile"] = profile_lm(planner, _lm_request(seconds, seed=2), adapter)
                row["same_codes_as_eager"] = _same_as_eager(args, planner, lm_parts, seconds)
                ran = adapter or planner.base
                if adapter is not None and planner.merge_adapters:
                    ran = adapter.merged
                row["engines_used"] = sorted({s.mode for s in ran.steppers.values()})
                row["memory"] = _mem(device)
                record(row)
        del planner
        gc.collect()


def profile_lm(planner: PlannerLM, request: LmRequest, adapter, top: int = 12) -> dict:
    """GPU kernel time vs wall time of one request: a wall far above the kernel sum means the
    decode loop is bound by the host (launches, syncs), not by the GPU."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        planner.generate(request, adapter)
        torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - start) * 1000
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    totals: dict[str, float] = {}
    for event in kernels:
        totals[event.name[:80]] = totals.get(event.name[:80], 0.0) + event.device_time / 1000
    cpu = sorted(
        (e for e in prof.key_averages() if e.cpu_time_total),
        key=lambda e: -e.self_cpu_time_total,
    )[:top]
    return {
        "wall_ms": round(wall_ms, 1),
        "kernels": len(kernels),
        "kernel_ms": round(sum(totals.values()), 1),
        "top_kernels_ms": {
            k: round(v, 2) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])[:top]
        },
        "cpu_self_ms": {e.key[:60]: [e.count, round(e.self_cpu_time_total / 1000, 1)] for e in cpu},
    }


def _same_as_eager(args, planner: PlannerLM, lm_parts, seconds: float) -> bool | None:
    """Whether this engine's codes equal eager's for one seeded 10 s request (greedy, so only
    real divergence, not a near-tie, shows). None for the eager engine itself."""
    if planner.decode_mode == "eager" or not args.check_eager:
        return None
    lm, tokenizer, size = lm_parts
    eager = PlannerLM(lm, tokenizer, lm_size=size, decode_mode="eager")
    request = _lm_request(10, seed=7).model_copy(update={"temperature": 0.0})
    return eager.generate(request).codes == planner.generate(request).codes


def bench_lm_load(args, device, dtype, record, lm_parts) -> None:
    if args.out_of_time():
        record({"section": "lm-load", "skipped": "time budget"})
        return
    lm, tokenizer, size = lm_parts
    decode_mode, compile_mode = LM_ENGINES[args.load_decode_mode]
    planner = PlannerLM(
        lm, tokenizer, lm_size=size, decode_mode=decode_mode, compile_mode=compile_mode
    )
    planner.generate(_lm_request(args.load_seconds, seed=0))

    def one(i: int) -> float:
        return planner.generate(_lm_request(args.load_seconds, seed=100 + i)).lm_ms

    for clients in args.clients:
        row = {
            "section": "lm-load",
            "lm": size,
            "seconds": args.load_seconds,
            "decode_mode": args.load_decode_mode,
        }
        start = time.perf_counter()
        row.update(_load(one, clients, 1))
        row["codes_per_s_aggregate"] = round(
            clients * args.load_seconds * 5 / (time.perf_counter() - start), 1
        )
        row["note"] = "one planner instance: generations queue on its lock (one replica)"
        record(row)


# --------------------------------------------------------------------------- main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--out", default=os.path.join(os.environ.get("OUT", "."), "audition_bench.json")
    )
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--vae-configs", default="old,fast,fast-nhwc,fast-nographs")
    parser.add_argument("--decode-seconds", default="30,240")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--lm-size", default="1.7B")
    parser.add_argument("--decode-modes", default="graph,compiled,eager", help="LM_ENGINES names")
    parser.add_argument("--eager-max-seconds", type=float, default=30.0, help="longer: skipped")
    parser.add_argument("--lm-adapter", action="store_true", help="also time a random LoRA")
    parser.add_argument(
        "--lm-merge",
        type=lambda text: text.split(","),
        default=["auto"],
        help="comma list of the planner's merge_adapters (auto, on, off)",
    )
    parser.add_argument("--no-check-eager", dest="check_eager", action="store_false")
    parser.add_argument("--profile", action="store_true", help="top kernels of the long decode")
    parser.add_argument("--budget-s", type=float, default=0, help="skip rows after this (0: off)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="old vs fast decode (30/240 s, 5 repeats) and the LM engines on 30 s",
    )
    parser.add_argument("--lm-seconds", default="30,240")
    parser.add_argument("--lm-repeat", type=int, default=3)
    parser.add_argument("--lm-profile", action="store_true", help="kernel vs wall time per row")
    parser.add_argument("--clients", default="8,32")
    parser.add_argument("--requests-per-client", type=int, default=4)
    parser.add_argument("--load-seconds", type=float, default=30.0)
    parser.add_argument("--load-vae-config", default="fast")
    parser.add_argument("--load-decode-mode", default="graph")
    parser.add_argument("--tiny", action="store_true", help="tiny checkpoints (CPU dry run)")
    args = parser.parse_args()
    if args.quick:  # only what the user left at its default changes
        quick = {"sections": "decode,lm", "repeat": 5, "lm_repeat": 2, "lm_seconds": "30"}
        quick["vae_configs"] = "old,fast,fast-nhwc"
        for key, value in quick.items():
            if getattr(args, key) == parser.get_default(key):
                setattr(args, key, value)
    started = time.perf_counter()
    args.out_of_time = lambda: bool(args.budget_s) and time.perf_counter() - started > args.budget_s
    args.sections = [s for s in args.sections.split(",") if s]
    args.vae_configs = [c for c in args.vae_configs.split(",") if c]
    args.decode_seconds = [float(s) for s in args.decode_seconds.split(",")]
    args.lm_seconds = [float(s) for s in args.lm_seconds.split(",")]
    args.decode_modes = [m for m in args.decode_modes.split(",") if m]
    args.clients = [int(c) for c in args.clients.split(",")]
    unknown = set(args.sections) - set(SECTIONS) or set(args.vae_configs) - set(VAE_CONFIGS)
    unknown = unknown or set(args.decode_modes + [args.load_decode_mode]) - set(LM_ENGINES)
    if unknown:
        parser.error(f"unknown section/config/decode mode {sorted(unknown)}")
    device, dtype = resolve_device_dtype(args.device, args.dtype)
    if args.tiny:
        import tempfile

        from hotstep_ray.models.tiny_tree import make_tiny_tree

        args.tiny_tree = make_tiny_tree(tempfile.mkdtemp(prefix="audition-bench-"))
        torch.set_num_threads(1)

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "torch": torch.__version__,
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "dtype": str(dtype),
        "tiny": args.tiny,
        "args": {k: v for k, v in vars(args).items() if k not in ("tiny_tree", "out_of_time")},
        "rows": [],
        "errors": [],
    }

    log = JsonReport(out, report)
    flush, record, attempt = log.write, log.record, log.attempt

    if {"decode", "decode-load"} & set(args.sections):
        holder: dict[str, Any] = {}
        attempt(
            "build-decoder", lambda: holder.update(parts=build_decoder_parts(args, device, dtype))
        )
        if "parts" in holder:
            if "decode" in args.sections:
                attempt(
                    "decode", lambda: bench_decode(args, device, dtype, record, holder["parts"])
                )
            if "decode-load" in args.sections:
                attempt(
                    "decode-load",
                    lambda: bench_decode_load(args, device, dtype, record, holder["parts"]),
                )
        holder.clear()
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if {"lm", "lm-load"} & set(args.sections):
        holder = {}
        attempt("build-lm", lambda: holder.update(lm=build_lm(args, device, dtype)))
        if "lm" in holder:
            if "lm" in args.sections:
                attempt("lm", lambda: bench_lm(args, device, dtype, record, holder["lm"]))
            if "lm-load" in args.sections:
                attempt("lm-load", lambda: bench_lm_load(args, device, dtype, record, holder["lm"]))
    report["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
    flush()
    print(f"wrote {out}", flush=True)
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
