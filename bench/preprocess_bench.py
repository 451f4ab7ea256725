"""GPU benchmark of preprocessing (issue 5): seconds of audio encoded per GPU-second, and memory.

Full-size random-initialised models in bf16 (`hotstep_ray.models.full_configs`): the Oobleck VAE
(169 M), Qwen3-Embedding-0.6B, the 2B condition encoder and the audio tokenizer (float32, as
preprocessing runs it). One batch = `--songs` songs of `--seconds` each, through the same
`Encoder.encode` the pipeline calls: tiled VAE encode + posterior sample, caption and lyric
encoding, condition encoder, 5 Hz codes; plus a per-stage breakdown and the CPU cost of
decoding/resampling one song (how many CPU cores a GPU needs to stay fed).

Goal (issue 5): >= 2000 s of audio per GPU-second with <= 8 GiB per actor. Baseline
(shared/reference/lm-vae-baseline.md): plain diffusers VAE, 240 s in 334 ms whole (17 GiB) or
403-483 ms in windows (~3 GiB).

VAE paths (`--vae-paths`, one case per path x batch-windows value, each on a fresh VAE of the
same weights since the fast path prepares its VAE in place):
  old        plain diffusers modules (weight norm folded), as before
  fast       hotstep_ray.models.oobleck_fast: Triton Snake, CUDA graph per window-batch shape
  fast-nhwc  the same with channels-last 2-D convs;  fast-nographs, fast-compile likewise
Each fast case records the max |mean - old mean| of its first song's latents.

Memory per case: the batch's allocated and reserved peaks, the reserved memory between batches
(`reserved_after_batch_gib`) and, per stage run alone, the reserved memory at its end and the
allocated peak during it. `--release-cache on,off` sweeps `release_cache_between_stages` (the
encoder returning the allocator's unused blocks after the VAE and the codes stages).
`--memory-cap-gib` sweeps `EncoderSettings.memory_cap_gib` (0 = no cap; the allocator's
per-process fraction is reset to 1 before each case).

5 Hz codes (`--codes-pass`, swept; `hotstep_ray.models.fsq_fast`): "off" runs the audio tokenizer
in float32; "tf32" / "bf16" run a reduced-precision pass 1 and recompute in float32 every window
whose FSQ brackets lie within `--codes-margin` levels of a floor boundary. Each fast case reports
`codes_windows`, `codes_rechecked`, `codes_rechecked_fraction`, `codes_mismatch_vs_fp32` (codes
differing from a float32 run over the same latents, computed outside the timed stages; must be 0)
and `codes_max_level_error` (max |bracket_fast - bracket_fp32| over windows and FSQ dims; the
margin must exceed it). The stage key is `codes` (was `codes_fp32`).

    python3 bench/preprocess_bench.py --quick --budget-s 420 --out $OUT/preprocess_fast.json
    python3 bench/preprocess_bench.py --songs 8 --seconds 240 --vae-paths old,fast \\
        --vae-batch-windows 4,8 --baseline --out $OUT/preprocess.json

Writes the report JSON to `--out` after every case (and prints it at the end; progress on
stderr).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, no install

from hotstep_ray.models import oobleck_kernels  # noqa: E402
from hotstep_ray.preprocess.items import EncoderSettings  # noqa: E402

SWITCH = {"auto": None, "on": True, "off": False}  # --release-cache values
PRODUCT = {value: name for name, value in SWITCH.items()}  # an EncoderSettings default's name


def apply_kernel_sweep(path: str) -> dict[str, list[int]]:
    """Set the Oobleck Triton kernels' configurations to the fastest of a
    bench/oobleck_kernel_sweep.py report, per kernel and channel count (the lowest total time
    over that channel count's shapes, among configurations timed on all of them). Returns what
    it set."""
    data = json.loads(Path(path).read_text())
    chosen: dict[str, list[int]] = {}
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for shape in data["shapes"]:
        groups.setdefault((shape["kernel"], shape["channels"]), []).append(shape)
    for (kernel, channels), shapes in groups.items():
        totals: dict[tuple[int, ...], list[float]] = {}
        for shape in shapes:
            for row in shape["results"]:
                totals.setdefault(tuple(row["cfg"]), []).append(row["ms"])
        full = {cfg: sum(ms) for cfg, ms in totals.items() if len(ms) == len(shapes)}
        best = min(full, key=full.__getitem__)
        residual = kernel == "residual"
        table = oobleck_kernels.RESIDUAL_TILES if residual else oobleck_kernels.SNAKE_NWC_CONFIGS
        table[channels] = best
        chosen[f"{kernel}_{channels}"] = list(best)
    return chosen


GIB = 1024**3
LYRICS = " ".join(
    ["[verse]", "walking down the empty road tonight, city lights are fading out of sight"] * 40
)
CAPTION = (
    "melancholic synthwave with warm analog pads, gated reverb drums, a driving bassline and a "
    "breathy female vocal, nostalgic and cinematic, slow build into a wide anthemic chorus"
)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    torch.cuda.synchronize()
    start = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    return result, time.perf_counter() - start


VAE_PATHS: dict[str, dict[str, Any] | None] = {
    "old": None,
    "fast": {},
    "fast-nhwc": {"layout": "nhwc"},
    "fast-nographs": {"cuda_graphs": False},
    "fast-nofuse": {"fuse_residual": False},
    "fast-torchsnake": {"snake": "torch"},
    "fast-compile": {"compile": True},
}


def build_vae(device: torch.device, dtype: torch.dtype):
    from hotstep_ray.models import full_configs

    return full_configs.build_vae(device=device, dtype=dtype, seed=1)


def build_parts(device: torch.device, dtype: torch.dtype):
    from hotstep_ray.models import full_configs
    from hotstep_ray.models.lm_tokenizer import build_text_tokenizer
    from hotstep_ray.preprocess.dit_parts import encoders_from_models

    vae = build_vae(device, dtype)
    text = full_configs.build_text_encoder(device=device, dtype=dtype, seed=2)
    dit = encoders_from_models(
        full_configs.build_dit(full_configs.dit_config("2b"), device, dtype, seed=0)
    )
    torch.cuda.empty_cache()  # the 2B decoder and detokenizer were built and dropped
    return vae, text, build_text_tokenizer(), dit


def baseline_ms(vae: torch.nn.Module, audio: torch.Tensor, iters: int) -> dict[str, float]:
    """Plain diffusers: `vae.encode(song).latent_dist.sample()` on one whole song."""
    x = audio[None].to(device="cuda", dtype=next(vae.parameters()).dtype)
    with torch.no_grad():
        timed(lambda: vae.encode(x).latent_dist.sample())
        torch.cuda.reset_peak_memory_stats()
        times = [timed(lambda: vae.encode(x).latent_dist.sample())[1] for _ in range(iters)]
    return {
        "ms": 1000 * statistics.median(times),
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / GIB,
    }


def encoded_share(frames: int, chunk: int, overlap: int, tail_step: int) -> float:
    """Frames the VAE runs per frame of song: windows overlap by 2 x `overlap` frames."""
    from hotstep_ray.preprocess.vae_tiles import plan_windows

    windows = plan_windows(frames, chunk, overlap, tail_step)
    return round(sum(w.stop - w.start for w in windows) / frames, 3)


def vae_kernels(encoder, items, top: int = 12) -> dict[str, Any]:
    """Kernel count, kernel ms and the `top` CUDA kernels of one `encoder.latents(items)`."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        encoder.latents(items)
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    totals: dict[str, float] = {}
    for event in kernels:
        totals[event.name[:80]] = totals.get(event.name[:80], 0.0) + event.device_time / 1000
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])[:top]
    return {
        "kernels": len(kernels),
        "kernel_ms": round(sum(totals.values()), 2),
        "top_ms": {name: round(ms, 2) for name, ms in ranked},
    }


def encode_profile(encoder, items, finite: bool, top: int = 15) -> dict[str, Any]:
    """One whole batch (`encode`, or its unchecked work when random weights gave non-finite
    latents) under the profiler: its wall time against the GPU's busy time (kernels and copies),
    and the host calls that cost most. The gap between the batch and the sum of its stages is
    host time: syncs, cache releases, copies, tokenizing."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        encoder.encode(items, check_finite=finite)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    device = [e for e in prof.events() if e.device_type.name == "CUDA"]
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:top]
    return {
        "wall_ms": round(1000 * wall, 1),
        "gpu_busy_ms": round(sum(e.device_time for e in device) / 1000, 1),
        "cpu_top": {e.key[:60]: [e.count, round(e.self_cpu_time_total / 1000, 2)] for e in rows},
    }


def cpu_prep_s(seconds: float) -> float:
    """Seconds on one thread to resample one stereo 44.1 kHz song to 48 kHz (the decode task's
    main cost after the codec itself; a decode task holds one CPU). It was process time before,
    summed over every thread torch ran on (0.81 s on the 16-core H200 machine)."""
    from hotstep_ray.preprocess.resample import resample

    audio = 0.1 * torch.randn(2, int(seconds * 44100))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        resample(audio[:, :44100], 44100, 48000)
        start = time.perf_counter()
        resample(audio, 44100, 48000)
        return time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)


def run_stage(encoder, fn: Callable[[], Any], release: bool) -> tuple[Any, dict[str, float]]:
    """One stage alone: its result and {ms, reserved_gib, peak_allocated_gib}, then the cache
    release `encode` does after it when `release` (gated by the encoder's setting). Reserved only
    grows within a stage, so the reserved memory at its end is the stage's high mark."""
    torch.cuda.reset_peak_memory_stats()
    result, seconds = timed(fn)
    facts = {
        "ms": 1000 * seconds,
        "reserved_gib": torch.cuda.memory_reserved() / GIB,
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / GIB,
    }
    if release:
        encoder.release_between_stages()
    return result, facts


def codes_accuracy(encoder, latents, found, stats: dict[str, Any]) -> dict[str, Any]:
    """How a fast codes pass compares with float32 over the same latents (untimed): counts from
    `encoder.last_codes_stats`, codes that differ from the float32 run, and the max FSQ bracket
    error of pass 1 (level units; `--codes-margin` must exceed it)."""
    from hotstep_ray.models.fsq_fast import window_brackets

    reference = encoder.codes(latents, fast_pass="off")
    mismatch = sum(int((a != b).sum()) for a, b in zip(found, reference, strict=True))
    tokenizer = encoder.dit.audio_tokenizer
    silence = encoder.dit.silence_latent.to(encoder.device)[None]  # [1, N, 64]
    error = 0.0
    for z in latents:  # one song at a time: brackets of every window, fast vs float32
        fast = window_brackets(tokenizer, z[None].float(), silence, encoder.codes_fast_pass)
        exact = window_brackets(tokenizer, z[None].float(), silence, "off")
        error = max(error, float((fast - exact).abs().max()))
    return {
        "codes_windows": stats["windows"],
        "codes_rechecked": stats["rechecked"],
        "codes_rechecked_fraction": stats["rechecked"] / max(1, stats["windows"]),
        "codes_mismatch_vs_fp32": mismatch,
        "codes_max_level_error": error,
    }


def run_case(encoder, items, iters: int, weights: int) -> dict[str, Any]:
    """Median batch time of `encoder.encode(items)` and of each stage, and memory: the batch's
    peaks (GiB), the reserved memory between batches and each stage's (see `run_stage`)."""
    songs = len(items)
    seconds = items[0].audio.shape[-1] / 48000
    latents = encoder.latents(items)  # warm-up: cuDNN autotune, torch.compile
    finite = all(bool(torch.isfinite(z).all()) for z in latents)

    # Random weights may overflow bf16 somewhere; `encode` refuses NaN latents, so time it
    # without that check then (same work) and say so.
    def run() -> None:
        encoder.encode(items, check_finite=finite)

    timed(run)
    torch.cuda.reset_peak_memory_stats()
    batch = [timed(run)[1] for _ in range(iters)]
    peak, peak_reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    reserved_after_batch = torch.cuda.memory_reserved()  # what the actor holds between batches
    captions = [item.caption_prompt for item in items]
    lyrics = [item.lyric_prompt for item in items]
    # The stages in `encode`'s order, each releasing where `encode` does.
    latents, vae = run_stage(encoder, lambda: encoder.latents(items), release=True)
    _, cond = run_stage(encoder, lambda: encoder.conditions(captions, lyrics), release=False)
    found, codes = run_stage(encoder, lambda: encoder.codes(latents), release=True)
    codes_stats = dict(encoder.last_codes_stats)
    stages = {"vae_latents": vae, "conditions": cond, "codes": codes}
    median = statistics.median(batch)
    accuracy = {}
    if encoder.codes_fast_pass != "off":
        accuracy = codes_accuracy(encoder, latents, found, codes_stats)
        encoder.release_between_stages()
    return {
        "finite_latents": finite,
        "batch_ms": 1000 * median,
        "batch_ms_all": [round(1000 * t, 1) for t in batch],
        "audio_s_per_gpu_s": songs * seconds / median,
        "ms_per_song": 1000 * median / songs,
        "stage_ms": {name: facts["ms"] for name, facts in stages.items()},
        # what the batch spends outside its stages' own timings (syncs, releases, copies)
        "outside_stages_ms": 1000 * median - sum(facts["ms"] for facts in stages.values()),
        "stage_reserved_gib": {name: facts["reserved_gib"] for name, facts in stages.items()},
        "stage_peak_allocated_gib": {
            name: facts["peak_allocated_gib"] for name, facts in stages.items()
        },
        "peak_allocated_gib": peak / GIB,
        "peak_reserved_gib": peak_reserved / GIB,
        "reserved_after_batch_gib": reserved_after_batch / GIB,
        "activation_peak_gib": (peak - weights) / GIB,
        **accuracy,  # fast codes passes only
    }


def comma_list(
    parser: argparse.ArgumentParser, flag: str, value: str, allowed: tuple[str, ...]
) -> list[str]:
    """A swept flag's comma list, each item one of `allowed` (else the parser's error)."""
    items = value.split(",")
    if set(items) - set(allowed):
        parser.error(f"{flag} takes {', '.join(allowed)} (comma list), not {value!r}")
    return items


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--songs", type=int, default=8, help="songs per encoder batch")
    parser.add_argument("--seconds", type=float, default=240.0, help="length of each song")
    parser.add_argument(
        "--vae-chunk", default="1536", help="comma list to sweep: VAE window, latent frames"
    )
    parser.add_argument("--vae-overlap", type=int, default=48, help="discarded frames per side")
    parser.add_argument(
        "--vae-batch-windows",
        default="1",
        help="comma list to sweep (x chunk = frames/forward; 1 = the product default)",
    )
    parser.add_argument(
        "--compile", default="none", help="comma list: none, default, max-autotune-no-cudagraphs"
    )
    parser.add_argument("--vae-paths", default="old,fast", help=f"comma list of {list(VAE_PATHS)}")
    parser.add_argument(
        "--release-cache",
        default=PRODUCT[EncoderSettings.release_cache_between_stages],
        help="comma list to sweep of auto, on, off: free cached blocks after the VAE and codes "
        "stages (auto: unless expandable segments)",
    )
    parser.add_argument(
        "--staged-upload",
        default=PRODUCT[EncoderSettings.staged_upload],
        help="comma list to sweep of on, off: songs cross to the GPU one by one on a side stream",
    )
    parser.add_argument(
        "--pageable-audio",
        action="store_true",
        help="songs in pageable memory, as Ray Data hands them to an encoder (default: pinned)",
    )
    parser.add_argument(
        "--snake-sin",
        default="fast",
        help="comma list to sweep of fast, accurate: the Triton Snake's sin for bf16 "
        "(oobleck_kernels.SNAKE_FAST_SIN)",
    )
    parser.add_argument(
        "--codes-pass",
        default="off,tf32",
        help="comma list to sweep of off, tf32, bf16: the 5 Hz codes' pass 1 precision",
    )
    parser.add_argument(
        "--codes-margin",
        type=float,
        default=EncoderSettings.codes_recheck_margin,  # the product default
        help="FSQ level units: windows this close to a floor boundary are rechecked in float32",
    )
    parser.add_argument(
        "--codes-frames-per-call",
        type=int,
        default=EncoderSettings.codes_frames_per_call,  # the product default
        help="latent frames per audio-tokenizer call (its activations set the codes' peak)",
    )
    parser.add_argument(
        "--memory-cap-gib",
        default="0",
        help="comma list to sweep: the encoder's per-process CUDA allocator cap (0 = none)",
    )
    parser.add_argument(
        "--kernel-sweep",
        default="",
        help="a bench/oobleck_kernel_sweep.py report: run with its fastest kernel configurations",
    )
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--baseline", action="store_true", help="also time plain diffusers")
    parser.add_argument(
        "--out", default=os.path.join(os.environ.get("OUT", "."), "preprocess.json")
    )
    parser.add_argument("--budget-s", type=float, default=0, help="skip cases after this (0: off)")
    parser.add_argument(
        "--profile", action="store_true", help="top CUDA kernels of one VAE pass per case"
    )
    parser.add_argument(
        "--quick", action="store_true", help="8 x 240 s, old,fast-nhwc at 1 window, 2 iters"
    )
    args = parser.parse_args()
    if args.quick:  # only what the user left at its default changes
        quick = {"vae_paths": "old,fast-nhwc", "vae_batch_windows": "1", "iters": 2}
        for key, value in quick.items():
            if getattr(args, key) == parser.get_default(key):
                setattr(args, key, value)
    unknown = set(args.vae_paths.split(",")) - set(VAE_PATHS)
    if unknown:
        parser.error(f"unknown --vae-paths {sorted(unknown)}")
    releases = comma_list(parser, "--release-cache", args.release_cache, ("auto", "on", "off"))
    uploads = comma_list(parser, "--staged-upload", args.staged_upload, ("on", "off"))
    sines = comma_list(parser, "--snake-sin", args.snake_sin, ("fast", "accurate"))
    code_passes = comma_list(parser, "--codes-pass", args.codes_pass, ("off", "tf32", "bf16"))
    if not args.codes_margin >= 0:
        parser.error(f"--codes-margin must be >= 0, not {args.codes_margin}")
    if args.codes_frames_per_call < 1:
        parser.error(f"--codes-frames-per-call must be >= 1, not {args.codes_frames_per_call}")
    try:
        caps = [float(cap) for cap in args.memory_cap_gib.split(",")]
    except ValueError:
        parser.error(f"--memory-cap-gib takes numbers, not {args.memory_cap_gib!r}")
    if any(not cap >= 0 for cap in caps):
        parser.error(f"--memory-cap-gib takes numbers >= 0, not {args.memory_cap_gib!r}")
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    device_gib = torch.cuda.get_device_properties(0).total_memory / GIB
    if max(caps) > device_gib:  # the encoder would refuse it outside a case's error handling
        parser.error(f"--memory-cap-gib {max(caps)} exceeds the GPU's {device_gib:.1f} GiB")
    started = time.perf_counter()
    kernel_configs = apply_kernel_sweep(args.kernel_sweep) if args.kernel_sweep else {}

    from hotstep_ray.models.oobleck_fast import OobleckFastOptions
    from hotstep_ray.models.prompts import build_dit_caption_prompt, build_lyric_prompt
    from hotstep_ray.preprocess.encode import Encoder
    from hotstep_ray.preprocess.items import EncodeItem
    from hotstep_ray.preprocess.vae_tiles import TAIL_STEP

    torch.backends.cudnn.benchmark = True  # every VAE window has the same shape
    device, dtype = torch.device("cuda"), torch.bfloat16
    log("building full-size random models ...")
    vae, text, tokenizer, dit = build_parts(device, dtype)
    generator = torch.Generator().manual_seed(0)
    samples = int(args.seconds * 48000)
    audios = [0.1 * torch.randn(2, samples, generator=generator) for _ in range(args.songs)]
    if not args.pageable_audio:
        audios = [audio.pin_memory() for audio in audios]
    metas = {"bpm": 120, "timesignature": "4", "keyscale": "A minor", "duration": args.seconds}
    items = [
        EncodeItem(
            sample_id=f"song{i}",
            audio=audios[i],
            caption_prompt=build_dit_caption_prompt(CAPTION, metas),
            lyric_prompt=build_lyric_prompt(LYRICS, "en"),
        )
        for i in range(args.songs)
    ]
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "dtype": "bf16 (audio tokenizer fp32 weights; codes pass 1 per case)",
        "songs": args.songs,
        "seconds_per_song": args.seconds,
        "vae_chunk_frames": args.vae_chunk,  # the swept list
        "vae_overlap_frames": args.vae_overlap,
        "release_cache": args.release_cache,  # the swept list
        "snake_sin": args.snake_sin,  # the swept list
        "staged_upload": args.staged_upload,  # the swept list
        "pageable_audio": args.pageable_audio,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "residual_tiles": {str(c): list(v) for c, v in oobleck_kernels.RESIDUAL_TILES.items()},
        "snake_nwc_configs": {
            str(c): list(v) for c, v in oobleck_kernels.SNAKE_NWC_CONFIGS.items()
        },
        "kernel_sweep_applied": kernel_configs,
        "cudnn_benchmark_limit": torch.backends.cudnn.benchmark_limit,
        "codes_pass": args.codes_pass,  # the swept list
        "codes_margin": args.codes_margin,
        "codes_frames_per_call": args.codes_frames_per_call,
        "memory_cap_gib": args.memory_cap_gib,  # the swept list
        "caption_tokens": len(tokenizer(items[0].caption_prompt)["input_ids"]),
        "lyric_tokens": len(tokenizer(items[0].lyric_prompt)["input_ids"]),
        "cpu_resample_s_per_song": cpu_prep_s(args.seconds),
        "goal": {"audio_s_per_gpu_s": 2000, "max_gib_per_actor": 8},
    }
    if args.baseline:
        log("baseline: plain diffusers whole-song encode ...")
        report["baseline_whole_song"] = baseline_ms(vae, audios[0], args.iters)
        torch.cuda.empty_cache()
    weights = torch.cuda.memory_allocated()
    report["weights_gib"] = weights / GIB
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    cases: list[dict[str, Any]] = []
    report["cases"] = cases

    def flush() -> None:
        out.write_text(json.dumps(report, indent=2, default=str) + "\n")

    reference_mean = None  # the first case's first-song latent mean (CPU float32)
    for path in args.vae_paths.split(","):
        for mode in args.compile.split(","):
            if mode != "none" and path != "old":
                continue  # the fast path has its own compile option (fast-compile)
            sweep = [
                (int(chunk), int(windows), release, upload, sine, codes_pass, cap)
                for chunk in args.vae_chunk.split(",")
                for windows in args.vae_batch_windows.split(",")
                for release in releases
                for upload in uploads
                for sine in sines
                for codes_pass in code_passes
                for cap in caps
            ]
            for chunk, windows, release, upload, sine, codes_pass, cap in sweep:
                case: dict[str, Any] = {
                    "vae_path": path,
                    "compile": mode,
                    "vae_chunk_frames": chunk,
                    "vae_batch_windows": windows,
                    "release_cache": release,
                    "staged_upload": upload,
                    "snake_sin": sine,
                    "codes_pass": codes_pass,
                    "memory_cap_gib": cap,
                }
                if codes_pass != "off":
                    case["codes_margin"] = args.codes_margin
                if args.budget_s and time.perf_counter() - started > args.budget_s:
                    case["skipped"] = "time budget"
                    cases.append(case)
                    flush()
                    continue
                # A fresh VAE (same weights) per case: the fast path prepares its VAE in place.
                # The last case's encoder (and its CUDA-graph pool) goes first, so each case's
                # reserved peak is its own.
                encoder = vae = None
                gc.collect()
                torch.cuda.empty_cache()
                torch.cuda.set_per_process_memory_fraction(1.0)  # the last case's cap, undone
                torch.cuda.reset_peak_memory_stats()
                oobleck_kernels.SNAKE_FAST_SIN = sine == "fast"  # read at each kernel call
                vae = build_vae(device, dtype)
                if mode != "none":
                    vae.encoder = torch.compile(vae.encoder, mode=mode)
                settings = EncoderSettings(
                    vae_chunk_frames=chunk,
                    vae_overlap_frames=args.vae_overlap,
                    vae_batch_frames=windows * chunk,
                    release_cache_between_stages=SWITCH[release],
                    staged_upload=upload == "on",
                    codes_fast_pass=codes_pass,
                    codes_recheck_margin=args.codes_margin,
                    codes_frames_per_call=args.codes_frames_per_call,
                    memory_cap_gib=cap,
                )
                fast = VAE_PATHS[path]
                encoder = Encoder(
                    vae,
                    text,
                    tokenizer,
                    dit,
                    settings,
                    device,
                    dtype,
                    fast_vae=fast is not None,
                    vae_options=OobleckFastOptions(**fast) if fast is not None else None,
                )
                if encoder.fast_vae is not None:
                    case["vae"] = encoder.fast_vae.describe()
                log(f"case {case} ...")
                try:
                    case.update(run_case(encoder, items, args.iters, weights))
                    case["frames_encoded_per_song_frame"] = encoded_share(
                        int(args.seconds * 25), chunk, args.vae_overlap, TAIL_STEP
                    )
                    if args.profile:
                        case["vae_top_kernels_ms"] = vae_kernels(encoder, items)
                        finite = case["finite_latents"]
                        case["encode_profile"] = encode_profile(encoder, items, finite)
                    case["meets_goal"] = (  # the goal is what an actor holds: reserved
                        case["audio_s_per_gpu_s"] >= 2000 and case["peak_reserved_gib"] <= 8
                    )
                    from hotstep_ray.preprocess.vae_tiles import encode_moments

                    ((mean, _),) = encode_moments(
                        vae,
                        [audios[0]],
                        chunk,
                        args.vae_overlap,
                        windows * chunk,
                        fast=encoder.fast_vae,
                        staged_upload=settings.staged_upload,  # the case's own upload
                    )
                    mean = mean.cpu()
                    if reference_mean is None:
                        reference_mean = mean
                        case["reference_for_diffs"] = True
                    else:
                        case["max_abs_mean_diff_vs_first_case"] = float(
                            (mean - reference_mean).abs().max()
                        )
                except Exception as exc:  # an OOM in one case should not lose the others
                    case["error"] = f"{type(exc).__name__}: {exc}"
                    torch.cuda.empty_cache()
                cases.append(case)
                flush()
                log(json.dumps(case, default=str))
    report["total_s"] = time.perf_counter() - started
    flush()
    print(json.dumps(report, indent=2, default=str))


if __name__ == "__main__":
    main()
