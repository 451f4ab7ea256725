"""DiT adapter-training throughput on one GPU: full-size random-initialised 2B and XL, bf16.

What is timed is the trainer's own optimizer step (`training.dit.optimizer_step`: crop assembly,
host-to-device copy, seeded draws, flow-matching loss under bf16 autocast, backward, global-norm
clip, LR, Muon/AdamW step) on a synthetic cache of 16 distinct 240 s songs with a 769-token
condition (the peers' shape: 512 lyric + 1 timbre + 256 caption), so no sample is padded;
songs of the longest crop (240 s at 6000 frames), or `--padded-frames` ones that pad.

For every (model, adapter, crop) it measures batch 1, then searches the best batch (2, 4, 8, 16
while throughput still rises by >= 3 % and the VRAM model says it fits). Each row: median ms per
step, audio-seconds trained per second (GA x batch x crop / 25 Hz / step time; GA = 1, as the
peers measured, unless --grad-accum), MFU and HFU with the peer baseline's FLOP formula
(`dit_vram.step_flops`; 22.67 TFLOP for 2B at 6000 frames, r64) on the H200's 989 TFLOP/s dense
bf16 peak, torch's peak allocated memory and the VRAM model's estimate. One process; every row
in its own try/except; the JSON is rewritten after every row, so a crash or the time budget
loses nothing measured.

  device:   python bench/dit_bench.py --out $OUT/dit_bench.json
  subset:   ... --models 2b --adapters lora64 --crops 750,6000
  compile:  ... --compile default            (torch.compile of every block; reduce-overhead
                                              adds CUDA graphs per block, step-graph one
                                              graph per step; several modes: default,none)
  flex:     ... --attention flex             (experimental block-sparse sliding window)
  local:    python bench/dit_bench.py --tiny --device cpu --out /tmp/dit_bench.json
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from the checkout, no install

from hotstep_ray.core.contracts import LATENT_HZ, TrainDitOptions  # noqa: E402
from hotstep_ray.core.storage import Storage  # noqa: E402
from hotstep_ray.models import full_configs as fc  # noqa: E402
from hotstep_ray.models.tiny_dit import tiny_config  # noqa: E402
from hotstep_ray.training import (  # noqa: E402
    compiling,
    dit,
    dit_data,
    dit_vram,
    dit_windows,
    flat_grads,
    kron_kernels,
    optim,
    speed,
    step_graph,
)

DEFAULT_SPEED = speed.SpeedOptions()
GIB = 1024**3
CONDITION_TOKENS = 769
SONGS = 16
SONG_FRAMES = 6000  # 240 s
BATCH_LADDER = (2, 4, 8, 16)
MAX_BATCH_FRAMES = 24_000  # batch x crop cap of the best-batch search (16 min of audio per step)
ADAPTERS: dict[str, dict[str, Any]] = {
    # Peer-comparable LoRA (81.8 M params on 2B) and our LoKR default (75.5 M): same size class.
    "lora64": {"adapter_type": "lora", "rank": 64, "alpha": 128},
    "lora128": {"adapter_type": "lora", "rank": 128, "alpha": 256},  # our LoRA default
    "lokr512": {
        "adapter_type": "lokr",
        "lokr_dim": 512,
        "lokr_alpha": 512,
        "lokr_factor": 6,
        "lokr_decompose_both": True,
    },
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    default_out = Path(os.environ.get("OUT", ".")) / "dit_bench.json"
    parser.add_argument("--out", type=Path, default=default_out)
    parser.add_argument("--models", default="2b,xl", help="2b,xl")
    parser.add_argument("--adapters", default="lora64,lokr512", help=",".join(ADAPTERS))
    parser.add_argument("--crops", default="750,1500,3000,6000", help="frames (25 Hz)")
    parser.add_argument(
        "--batches", default="1,best", help="explicit sizes and/or best, e.g. 1,4 or 1,best"
    )
    parser.add_argument("--ckpt", default="off", choices=("off", "auto", "all"))
    parser.add_argument("--optimizer", default="muon", choices=("muon", "adamw"))
    parser.add_argument(
        "--grad-accum", type=int, default=1, help="micro-batches per optimizer step (peers: 1)"
    )
    parser.add_argument(
        "--compile",
        default="none",
        help="none|default|reduce-overhead|step-graph, comma list",
    )
    parser.add_argument(
        "--attention", default="sdpa", help="sdpa (the trainer's) | flex (experimental), comma list"
    )
    parser.add_argument(
        "--kron-mix",
        default=DEFAULT_SPEED.kron_mix,
        choices=("auto", *speed.KRON_MIXES),
        help="LoKR w1-side mix",
    )
    parser.add_argument(
        "--kron-forward",
        default=DEFAULT_SPEED.kron_forward,
        choices=speed.KRON_FORWARDS,
        help="LoKR: the factored path beside the base Linear, or one Linear on W + ΔW",
    )
    parser.add_argument(
        "--kron-merged-min-tokens",
        type=int,
        default=DEFAULT_SPEED.kron_merged_min_tokens,
        help="LoKR: rows of a Linear's input below which the merged forward runs factored",
    )
    parser.add_argument(
        "--fused-mix",
        default=DEFAULT_SPEED.fused_mix,
        action=argparse.BooleanOptionalAction,
        help="LoKR's backward: w1's pair sums and w2's mix in one kernel pass (fused_mix)",
    )
    parser.add_argument(
        "--flat-grads",
        action=argparse.BooleanOptionalAction,
        default=DEFAULT_SPEED.flat_grads,
        help="CUDA-graph steps: gradients as views of one flat buffer (clip/zero in a few "
        "kernels); step-graph needs it (without, steps run the compiled blocks ungraphed)",
    )
    parser.add_argument(
        "--fold",
        type=int,
        default=1,
        help="planned micro-batches per forward (the trainer's fold_accum; at most --grad-accum)",
    )
    parser.add_argument(
        "--prefetch",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="prepare the next step's inputs during the backward, as the trainer does",
    )
    parser.add_argument(
        "--padded-frames",
        type=int,
        default=0,
        help="songs of N and 2N/3 frames (alternately) with their last 256 / 128 condition "
        "tokens padded: every row masks cross-attention keys, and at batch >= 2 the shorter "
        "song pads to the longer (masked self-attention keys and loss); audio-s/s counts real "
        "frames, MFU the padded ones; 0 = unpadded songs of the longest crop",
    )
    parser.add_argument("--steps", type=int, default=8, help="timed steps per row")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--time-budget-s", type=float, default=540.0)
    parser.add_argument(
        "--muon-ns-precision",
        default="auto",
        choices=("auto", *optim.NS_PRECISIONS),
        help="Muon's Newton-Schulz precision (auto: bfloat16_batched on CUDA)",
    )
    parser.add_argument(
        "--optimizer-time",
        action="store_true",
        help="add each row's update time alone (clip + optimizer step on random gradients)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="profile one step of each crop's first batch"
    )
    parser.add_argument(
        "--profile-top", type=int, default=12, help="kernels listed by time in a profile"
    )
    parser.add_argument(
        "--guards-ab",
        action="store_true",
        help="after the timed steps, time them again with Dynamo's guards skipped "
        "(skip_guard_eval_unsafe): the guards' host share of a step",
    )
    parser.add_argument(
        "--trace",
        action="store_true",
        help="with --profile: a gzipped Chrome trace (host + GPU) of two steps beside --out",
    )
    parser.add_argument("--tiny", action="store_true", help="tiny model (dry run of the script)")
    parser.add_argument("--device", default="cuda")
    return parser.parse_args()


# ----------------------------------------------------------------------------- setup


def synthetic_cache(encoder_width: int, frames: int, padded: bool = False) -> dit_data.TensorCache:
    """SONGS distinct songs of `frames` frames; condition of CONDITION_TOKENS tokens, all real.
    `padded`: odd songs are 2/3 as long, and the last 256 (even songs) or 128 (odd) condition
    tokens are padding, as captions shorter than their slot."""
    g = torch.Generator().manual_seed(0)
    songs = []
    for index in range(SONGS):
        condition_mask = torch.ones(CONDITION_TOKENS, dtype=torch.bool)
        length = frames
        if padded:
            condition_mask[-(128 if index % 2 else 256) :] = False
            length = frames * 2 // 3 if index % 2 else frames
        silence = 0.05 * torch.randn(length, 64, generator=g)
        songs.append(
            dit_data.Song(
                stem=f"song{index}",
                target=torch.randn(length, 64, generator=g),
                context=torch.cat([silence, torch.ones(length, 64)], dim=-1),
                condition=torch.randn(CONDITION_TOKENS, encoder_width, generator=g),
                condition_mask=condition_mask,
            )
        )
    return dit_data.TensorCache(
        songs=songs, channel_std=torch.ones(64), channel_stats_source="file", meta={}
    )


def tiny_cpu_args(crops: str = "32") -> argparse.Namespace:
    """`build_group`'s arguments for the tiny DiT on the CPU (tests and CPU-side benches)."""
    return argparse.Namespace(
        device="cpu",
        tiny=True,
        crops=crops,
        ckpt="off",
        optimizer="muon",
        muon_ns_precision="auto",
        padded_frames=0,
        speed=DEFAULT_SPEED,
    )


def speed_options(args: argparse.Namespace) -> speed.SpeedOptions:
    """The A/B flags as the runs' `SpeedOptions` (`build_group` reads `args.speed`)."""
    return speed.SpeedOptions(
        kron_mix=args.kron_mix,
        kron_forward=args.kron_forward,
        kron_merged_min_tokens=args.kron_merged_min_tokens,
        fused_mix=args.fused_mix,
        flat_grads=args.flat_grads,
    )


def build_group(
    args, layout: str, adapter: str, compile_mode: str, attention: str, storage: Storage
):
    """A random model with one adapter, wrapped in a real `DitRun` (as `dit.setup` builds it)."""
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = tiny_config("turbo" if layout == "2b" else "xl-turbo") if args.tiny else None
    config = config or fc.dit_config(layout)
    models = fc.build_dit(config, device=device, dtype=dtype, silence_frames=64)
    for part in (models.condition_encoder, models.audio_tokenizer, models.detokenizer):
        part.to("cpu")  # as in training: only the transformer (+ null condition) on the GPU
    dims = dit_vram.DitDims.from_config(config)
    crops = [int(c) for c in args.crops.split(",")]
    frames = max(crops) if not args.tiny else 64
    padded = args.padded_frames > 0
    cache = synthetic_cache(dims.encoder_hidden, args.padded_frames or frames, padded)
    options = TrainDitOptions(
        **ADAPTERS[adapter],
        variant_key="bench",
        crop_frames=min(crops) if not args.tiny else 32,
        batch=1,
        grad_accum=1,
        checkpoint_segments={"off": 0, "auto": 1, "all": 32}[args.ckpt],
        optimizer=args.optimizer,
        muon_ns_precision=args.muon_ns_precision,
        init_adapter="",
        epochs=1000,
        compile="off" if compile_mode == "none" else compile_mode,  # the trainer's own path
    )
    # fold off: a row's batch is what each forward runs (`--grad-accum` then means forwards)
    settings = dit.DitSettings(
        device=str(device), run_key="adapters/bench/run", fold_accum="off", speed=args.speed
    )
    run = dit.prepare(options, storage, "bench", cache, models, "random-init", settings)
    if attention == "flex":
        run.transformer.set_attn_processor(FlexAttnProcessor(compiled=compile_mode == "none"))
    return run


def configure(run: dit.DitRun, crop: int, batch: int, ckpt: str) -> None:
    """Point the run at one (crop, batch, checkpointing) row."""
    trained = run.fit.trained_layers
    ckpt_layers = {"off": 0, "all": trained}.get(ckpt, run.fit.ckpt_layers)
    plan = dit_vram.Plan(crop, batch, ckpt_layers, trained, CONDITION_TOKENS)
    run.fit = dataclasses.replace(
        run.fit,
        crop_frames=crop,
        batch=batch,
        ckpt_layers=ckpt_layers,
        estimate=dit_vram.estimate(
            run.dims, run.spec, plan, False, run.engine.mode != "off", run.settings.speed
        ),
    )
    run.frames = dit_data.batch_frames(run.cache, crop)
    compiling.install_checkpointing(run.transformer, ckpt_layers, trained)


# ----------------------------------------------------------------------------- attention


class FlexAttnProcessor:
    """Experimental (`--attention flex`): the stock ACE-Step attention with FlexAttention in place
    of SDPA + a dense additive band mask. Sliding layers get a block-sparse |i - j| <= window
    mask, so the key blocks outside the band (about 90 % at 6000 frames) are skipped in forward
    and backward. It ignores attention masks, so `--padded-frames` refuses it; the trainer
    keeps the key-padding processor."""

    def __init__(self, compiled: bool) -> None:
        from torch.nn.attention.flex_attention import flex_attention

        self.attention = (
            torch.compile(flex_attention, dynamic=False) if compiled else flex_attention
        )
        self.block_masks: dict[tuple, Any] = {}

    def band(self, window: int, tokens: int, device: torch.device):
        from torch.nn.attention.flex_attention import create_block_mask

        key = (window, tokens, str(device))
        if key not in self.block_masks:

            def inside(b, h, q, kv):
                return (q - kv).abs() <= window

            self.block_masks[key] = create_block_mask(inside, None, None, tokens, tokens, device)
        return self.block_masks[key]

    def __call__(
        self,
        attn,
        hidden_states,
        encoder_hidden_states=None,
        attention_mask=None,
        image_rotary_emb=None,
    ):
        from diffusers.models.embeddings import apply_rotary_emb

        is_cross = attn.is_cross_attention and encoder_hidden_states is not None
        kv_input = encoder_hidden_states if is_cross else hidden_states
        query = attn.to_q(hidden_states).unflatten(-1, (attn.heads, attn.head_dim))
        key = attn.to_k(kv_input).unflatten(-1, (attn.kv_heads, attn.head_dim))
        value = attn.to_v(kv_input).unflatten(-1, (attn.kv_heads, attn.head_dim))
        query, key = attn.norm_q(query), attn.norm_k(key)
        if not is_cross and image_rotary_emb is not None:
            rope = {"use_real": True, "use_real_unbind_dim": -2, "sequence_dim": 1}
            query = apply_rotary_emb(query, image_rotary_emb, **rope)
            key = apply_rotary_emb(key, image_rotary_emb, **rope)
        window = getattr(attn, "sliding_window", None)
        tokens = key.shape[1]
        block_mask = None
        if not is_cross and window is not None and tokens > window:
            block_mask = self.band(window, tokens, hidden_states.device)
        out = self.attention(
            query.transpose(1, 2),
            key.transpose(1, 2),
            value.transpose(1, 2),
            block_mask=block_mask,
            scale=attn.scaling,
            enable_gqa=attn.heads != attn.kv_heads,
        )
        out = out.transpose(1, 2).flatten(2, 3).to(query.dtype)
        return attn.to_out[1](attn.to_out[0](out))


# ----------------------------------------------------------------------------- measure


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(args, run: dit.DitRun, crop: int, batch: int) -> dict[str, Any]:
    configure(run, crop, batch, args.ckpt)
    run.engine.fold = max(1, min(args.fold, args.grad_accum))
    device = run.device
    if run.engine.step_graphs is not None:  # this row's shapes: its graphs alone, counted alone
        run.engine.step_graphs = step_graph.StepGraphs(device)
    window = [tuple(range(batch))] * args.grad_accum  # one optimizer step per window
    # Every step's loss, warm-up included: rows of two compile modes from fresh runs (same seed)
    # must agree to bf16 rounding, or the faster mode computes something else.
    # As the trainer runs: each step prepares the next one's inputs during its backward (the
    # bench's next window is the same crops; `--no-prefetch` times steps that assemble their own)
    upcoming = window if args.prefetch else None
    warmup_started = time.perf_counter()
    losses = [dit.optimizer_step(run, window, upcoming).loss for _ in range(args.warmup)]
    synchronize(device)
    # the warm-up holds any compile and graph capture: with a warm compile cache it shrinks
    warmup_s = time.perf_counter() - warmup_started
    if device.type == "cuda":
        torch.cuda.empty_cache()  # so the reserved peak is this row's, not an earlier row's
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    finite = True
    frames = 0  # real (unpadded) frames a step trains; every timed step runs the same crops
    for _ in range(args.steps):
        started = time.perf_counter()
        result = dit.optimizer_step(run, window, upcoming)
        synchronize(device)
        times.append((time.perf_counter() - started) * 1000)
        finite = finite and result.finite
        losses.append(result.loss)
        frames = result.frames
    median = statistics.median(times)
    ab: dict[bool, list[float]] = {False: [], True: []}  # guards skipped -> step times
    if args.guards_ab:
        # The same steps, alternately with every guard and with Dynamo evaluating only those
        # that tell its cached graphs apart (every graph this row needs was compiled in the
        # warm-up), so drift and jitter fall on both: the host time the guards take per step,
        # which a small GPU step cannot hide. A measurement only. The adapter and the
        # optimizer come back as they were, as after the other extra measurements.
        with unchanged(run):
            for i in range(2 * args.steps):
                skip = i % 2 == 1
                with torch.compiler.set_stance("default", skip_guard_eval_unsafe=skip):
                    started = time.perf_counter()
                    dit.optimizer_step(run, window, upcoming)
                    synchronize(device)
                ab[skip].append((time.perf_counter() - started) * 1000)
    flops = dit_vram.step_flops(
        run.dims,
        run.spec,
        crop,
        CONDITION_TOKENS,
        batch * args.grad_accum,
        run.fit.trained_layers,
        run.fit.ckpt_layers,
    )
    run.engine.prefetched = None
    row: dict[str, Any] = {
        "fold": run.engine.fold,
        "prefetch": args.prefetch,
        "step_ms": round(median, 2),
        "warmup_s": round(warmup_s, 2),
        "step_ms_min": round(min(times), 2),
        "step_ms_all": [round(t, 2) for t in times],
        "frames": frames,
        "audio_s_per_s": round(frames / LATENT_HZ / (median / 1000), 1),
        "model_tflop": round(flops["model"] / 1e12, 3),
        "mfu": round(flops["model"] / (median / 1000) / dit_vram.H200_BF16_PEAK_FLOPS, 4),
        "hfu": round(flops["hardware"] / (median / 1000) / dit_vram.H200_BF16_PEAK_FLOPS, 4),
        "ckpt_layers": run.fit.ckpt_layers,
        "est_gib": round(run.fit.estimate.total / GIB, 2),
        "finite": finite,
        "losses": [round(loss, 6) for loss in losses],
        # which LoKR kernels passed their self-checks in this process (empty for LoRA / CPU)
        "lokr_kernels": kron_kernels.verdicts(),
    }
    if run.engine.step_graphs is not None:  # compile step-graph: how its steps ran
        graphs = run.engine.step_graphs
        row["step_graphs"] = {
            "captures": graphs.captures,
            "replays": graphs.replays,
            "eager": graphs.eager,
            "evictions": graphs.evictions,
            "failure": graphs.failure,
        }
    if ab[True]:
        row["step_ms_ab_guarded"] = round(statistics.median(ab[False]), 2)
        row["step_ms_skip_guards"] = round(statistics.median(ab[True]), 2)
        row["step_ms_skip_guards_all"] = [round(t, 2) for t in ab[True]]
    if device.type == "cuda":
        row["peak_gib"] = round(torch.cuda.max_memory_allocated(device) / GIB, 2)
        # CUDA-graph pools (compile mode reduce-overhead) are reserved, not always "allocated"
        row["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved(device) / GIB, 2)
    return row


def profile_step(run: dit.DitRun, top_n: int = 12) -> dict[str, Any]:
    """Kernel count and GPU kernel time of one step (the peers lost most of a step to launches),
    and the `top_n` kernel names by summed time with their call counts."""
    from torch.profiler import ProfilerActivity, profile

    window = [tuple(range(run.fit.batch))]
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        dit.optimizer_step(run, window)
        synchronize(run.device)
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    busy_us = sum(e.device_time for e in kernels)
    top: dict[str, list[float]] = {}
    for event in kernels:
        entry = top.setdefault(event.name, [0.0, 0])
        entry[0] += event.device_time
        entry[1] += 1
    ranked = sorted(top.items(), key=lambda kv: -kv[1][0])[:top_n]
    return {
        "kernels": len(kernels),
        "kernel_ms": round(busy_us / 1000, 2),
        # full names: cuBLAS / CUTLASS names can share a long prefix
        "top_kernels_ms": {name: round(us / 1000, 2) for name, (us, _) in ranked},
        "top_kernels_calls": {name: calls for name, (_, calls) in ranked},
    }


def _random_update(run: dit.DitRun) -> Any:
    """The update alone (clip + optimizer step) on random gradients, warmed once. Existing
    gradient buffers are filled in place: the CUDA-graph trainer keeps them across steps."""
    for param in run.params:
        if param.grad is None:
            param.grad = torch.randn_like(param) * 1e-3
        else:
            param.grad.normal_().mul_(1e-3)

    def update() -> None:
        flat_grads.clip_grads(run.params, 1.0, run.engine.live_flats())
        run.optimizer.step()

    update()  # warm (lazy state)
    synchronize(run.device)
    return update


@contextlib.contextmanager
def unchanged(run: dit.DitRun) -> Iterator[None]:
    """The adapter and the optimizer state come back as they were after the block, so a later
    row of the same process trains on from its own steps, not from the random updates or extra
    steps of a measurement. Gradient buffers are left zeroed, as the graph trainer keeps them."""
    params = [param.detach().clone() for param in run.params]
    state = copy.deepcopy(run.optimizer.state_dict())
    try:
        yield
    finally:
        with torch.no_grad():
            torch._foreach_copy_(run.params, params)
        run.optimizer.load_state_dict(state)
        run.optimizer.zero_grad(set_to_none=False)


def update_ms(run: dit.DitRun, repeats: int) -> float:
    """Median wall time of the update alone (clip + optimizer step on random gradients;
    synchronised): the share of the step set by the adapter's factor shapes and Muon's
    precision, not by the tokens. Changes the adapter: call it inside `unchanged`."""
    update = _random_update(run)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        update()
        synchronize(run.device)
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 2)


def profile_optimizer(run: dit.DitRun) -> dict[str, Any]:
    """Kernels of the update alone (clip + optimizer step on random gradients): what of the step
    is the optimizer's, to tell it from the forward/backward's share."""
    from torch.profiler import ProfilerActivity, profile

    wall_ms = update_ms(run, repeats=1)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        flat_grads.clip_grads(run.params, 1.0, run.engine.live_flats())
        run.optimizer.step()
        synchronize(run.device)
    run.optimizer.zero_grad(set_to_none=False)  # the next profiled step starts from zero
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    return {
        "wall_ms": wall_ms,
        "kernels": len(kernels),
        "kernel_ms": round(sum(e.device_time for e in kernels) / 1000, 2),
    }


def phase_times(run: dit.DitRun, repeats: int = 3) -> dict[str, Any]:
    """Wall time of each phase of one step, synchronised at every boundary (so the phases add
    up to a slower step than the pipelined one): where the host time between kernels goes."""
    window = [tuple(range(run.fit.batch))]
    phases: dict[str, list[float]] = {}
    graphs = run.engine.graphs
    if graphs:
        run.engine.keep_grads()  # the trainer's gradient buffers, as in its step

    def mark(name: str, started: float) -> float:
        synchronize(run.device)
        now = time.perf_counter()
        phases.setdefault(name, []).append((now - started) * 1000)
        return now

    for _ in range(repeats):
        step = run.state.step
        t = time.perf_counter()
        draws = dit_windows.draw_window(run.sampling, window, step)
        t = mark("draw", t)
        batch = dit_data.batch_to(
            dit_data.assemble(run.cache, draws.crops[0], run.frames), run.device
        )
        t = mark("assemble_copy", t)
        out = dit.micro_batch_loss(
            run,
            draws.crops[0],
            draws.t[0],
            draws.cfg_drop[0],
            draws.weights[0],
            [((0, step), len(window[0]))],
        )
        t = mark("assemble_copy_forward", t)
        out.loss.backward()
        t = mark("backward", t)
        flat_grads.clip_grads(run.params, 1.0, run.engine.live_flats())
        t = mark("clip", t)
        run.optimizer.step()
        flats = run.engine.live_flats() if graphs else None  # as the trainer's step ends
        flat_grads.zero_grads(run.optimizer, flats, set_to_none=not graphs)
        mark("optimizer", t)
        del batch
    return {name: round(statistics.median(ms), 2) for name, ms in phases.items()}


def cpu_profile(run: dit.DitRun) -> dict[str, Any]:
    """Top host-side ops of one step by self CPU time (what the Python/dispatch side costs)."""
    from torch.profiler import ProfilerActivity, profile

    window = [tuple(range(run.fit.batch))]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        dit.optimizer_step(run, window)
        synchronize(run.device)
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:25]
    return {e.key[:70]: [e.count, round(e.self_cpu_time_total / 1000, 2)] for e in rows}


def covered(spans: list[tuple[float, float]]) -> float:
    """Length of the union of (start, end) intervals sorted by start: the GPU's busy time when
    kernels of two streams overlap."""
    total, reach = 0.0, float("-inf")
    for start, end in spans:
        total += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    return total


def gpu_spans(events: Any) -> list[tuple[float, float]]:
    """(start, end) of the GPU's own work among profiler events, sorted: kernels, copies and
    memsets. A profile that records the host too puts its `record_function` labels (e.g.
    `Optimizer.step#Muon.step`) on the GPU timeline as well, spanning the idle gaps between
    the kernels they launched: those are not work."""
    return sorted(
        (e.time_range.start, e.time_range.end)
        for e in events
        if e.device_type.name == "CUDA" and not getattr(e, "is_user_annotation", False)
    )


def trace_steps(run: dit.DitRun, path: Path, steps: int = 2) -> dict[str, Any]:
    """A host + GPU timeline of `steps` steps, written as a gzipped Chrome trace to `path`, and
    its summary: wall time, the union of GPU kernel time, and the GPU's idle share of the span
    (a host-bound step leaves the GPU waiting between its kernels)."""
    from torch.profiler import ProfilerActivity, profile

    window = [tuple(range(run.fit.batch))]
    synchronize(run.device)
    started = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            dit.optimizer_step(run, window)
        synchronize(run.device)
    wall_ms = (time.perf_counter() - started) * 1000
    spans = gpu_spans(prof.events())
    busy_us = covered(spans)
    span_us = (spans[-1][1] - spans[0][0]) if spans else 0.0
    prof.export_chrome_trace(str(path))  # gzipped by torch for a .gz name
    return {
        "steps": steps,
        "wall_ms": round(wall_ms, 2),
        "gpu_busy_ms": round(busy_us / 1000, 2),
        "gpu_span_ms": round(span_us / 1000, 2),
        "gpu_idle_share": round(1 - busy_us / span_us, 3) if span_us else None,
        "file": path.name,
    }


def fits(run: dit.DitRun, crop: int, batch: int, ckpt: str) -> bool:
    if run.device.type != "cuda":
        return True
    trained = run.fit.trained_layers
    ckpt_layers = {"off": 0, "all": trained}.get(ckpt, run.fit.ckpt_layers)
    plan = dit_vram.Plan(crop, batch, ckpt_layers, trained, CONDITION_TOKENS)
    compiled = run.engine.mode != "off"
    need = dit_vram.estimate(run.dims, run.spec, plan, False, compiled, run.settings.speed).total
    free, total = torch.cuda.mem_get_info(run.device)
    held = torch.cuda.memory_allocated(run.device)
    # the estimate includes what the run already holds (weights, adapter, optimizer state)
    return need <= (free + held) * 0.95 and need <= total


# ----------------------------------------------------------------------------- main


class Report:
    def __init__(self, path: Path, args: argparse.Namespace) -> None:
        self.path = path
        self.data: dict[str, Any] = {"meta": meta(args), "rows": [], "summary": []}

    def add(self, row: dict[str, Any]) -> None:
        self.data["rows"].append(row)
        # one line per row, all a device script needs to grep ('"step_ms"') instead of reading
        # the JSON back
        keys = ("model", "adapter", "compile", "attention", "crop", "batch")
        shown = {k: row.get(k) for k in keys}
        measured = ("step_ms", "audio_s_per_s", "mfu", "peak_gib", "peak_reserved_gib")
        extra = ("optimizer_ms", "step_ms_ab_guarded", "step_ms_skip_guards")
        numbers = {k: row[k] for k in (*measured, *extra) if k in row}
        print(json.dumps({**shown, **numbers, "error": row.get("error", "")[:200]}), flush=True)
        self.write()

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        tmp.replace(self.path)


def meta(args: argparse.Namespace) -> dict[str, Any]:
    info: dict[str, Any] = {
        "created_at": datetime.now(UTC).isoformat(),
        "args": {k: str(v) for k, v in vars(args).items()},
        "python": platform.python_version(),
        "torch": torch.__version__,
        "peak_tflops": dit_vram.H200_BF16_PEAK_FLOPS / 1e12,
        "condition_tokens": CONDITION_TOKENS,
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_total_gib"] = round(torch.cuda.mem_get_info(0)[1] / GIB, 1)
    try:
        import diffusers
        import peft

        info["diffusers"], info["peft"] = diffusers.__version__, peft.__version__
    except ImportError:
        pass
    return info


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (model, adapter, compile, attention, crop): the batch-1 and the best-throughput row."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("audio_s_per_s"):
            key = (row["model"], row["adapter"], row["compile"], row["attention"], row["crop"])
            groups.setdefault(key, []).append(row)
    summary = []
    for (model, adapter, compile_mode, attention, crop), found in groups.items():
        one = next((r for r in found if r["batch"] == 1), None)
        best = max(found, key=lambda r: r["audio_s_per_s"])
        summary.append(
            {
                "model": model,
                "adapter": adapter,
                "compile": compile_mode,
                "attention": attention,
                "crop": crop,
                "batch1_audio_s_per_s": one and one["audio_s_per_s"],
                "batch1_ms": one and one["step_ms"],
                "batch1_peak_gib": one and one.get("peak_gib"),
                "best_batch": best["batch"],
                "best_audio_s_per_s": best["audio_s_per_s"],
                "best_mfu": best["mfu"],
                "best_peak_gib": best.get("peak_gib"),
            }
        )
    return summary


def main() -> int:
    args = parse_args()
    if args.padded_frames and "flex" in args.attention.split(","):
        raise SystemExit("--attention flex ignores attention masks: not with --padded-frames")
    args.speed = speed_options(args)  # every run's adapters and steps (`build_group`)
    # No global TF32 switch: the bench runs the trainer's own precision settings (the product
    # sets none; Muon's Newton-Schulz has its own, --muon-ns-precision).
    started = time.time()
    report = Report(args.out, args)
    crops = [int(c) for c in args.crops.split(",")] if not args.tiny else [32, 64]
    batches = args.batches.split(",")
    storage = Storage(tempfile.mkdtemp(prefix="dit-bench-"))

    def over_budget() -> bool:
        return time.time() - started > args.time_budget_s

    for layout in args.models.split(","):
        for adapter in args.adapters.split(","):
            for compile_mode, attention in [
                (c, a) for c in args.compile.split(",") for a in args.attention.split(",")
            ]:
                base = {
                    "model": layout,
                    "adapter": adapter,
                    "compile": compile_mode,
                    "attention": attention,
                }
                if over_budget():
                    report.add({**base, "error": "skipped: time budget"})
                    continue
                run = None
                try:
                    t0 = time.time()
                    run = build_group(args, layout, adapter, compile_mode, attention, storage)
                    base["adapter_params"] = sum(
                        p.numel() for _, p in dit.adapters.trainable_parameters(run.transformer)
                    )
                    base["optimizer_split"] = run.optimizer.split_summary()
                    # "auto" resolved: its meaning moved (tf32 on CUDA until the twelfth run)
                    muon = getattr(run.optimizer, "muon", None)
                    base["muon_ns_precision"] = muon.ns_precision if muon is not None else None
                    base["build_s"] = round(time.time() - t0, 1)
                except Exception as exc:  # one bad group must not stop the others
                    report.add(
                        {**base, "error": f"build: {exc!r}", "trace": traceback.format_exc()}
                    )
                    continue
                for crop in crops:
                    best_rate = 0.0
                    explicit = sorted({int(b) for b in batches if b.isdigit()})
                    ladder = explicit + [
                        b for b in (BATCH_LADDER if "best" in batches else ()) if b not in explicit
                    ]
                    for batch in ladder:
                        row = {**base, "crop": crop, "batch": batch}
                        if over_budget():
                            report.add({**row, "error": "skipped: time budget"})
                            break
                        if batch > 1 and (
                            batch * crop > MAX_BATCH_FRAMES or not fits(run, crop, batch, args.ckpt)
                        ):
                            if batch in explicit:
                                continue
                            break
                        try:
                            row.update(measure(args, run, crop, batch))
                            if args.optimizer_time:
                                with unchanged(run):
                                    row["optimizer_ms"] = update_ms(run, repeats=5)
                        except Exception as exc:
                            row.update(error=repr(exc)[:500], trace=traceback.format_exc()[-2000:])
                            report.add(row)
                            if run.device.type == "cuda":
                                torch.cuda.empty_cache()
                            break
                        report.add(row)  # on disk before a profile that may hit a timeout
                        if args.profile and batch == ladder[0] and run.device.type == "cuda":
                            row["profile"] = {}
                            try:  # each part lands in the file as soon as it is measured
                                with unchanged(run):
                                    row["profile"]["phases_ms"] = phase_times(run)
                                    report.write()
                                    row["profile"]["optimizer"] = profile_optimizer(run)
                                    report.write()
                                    row["profile"].update(profile_step(run, args.profile_top))
                                    report.write()
                                    row["profile"]["cpu_top"] = cpu_profile(run)
                                    if args.trace:
                                        report.write()
                                        name = "-".join(
                                            (args.out.stem, layout, adapter, compile_mode)
                                            + (attention, f"{crop}x{batch}")
                                        )
                                        trace = args.out.parent / f"{name}.trace.json.gz"
                                        row["profile"]["trace"] = trace_steps(run, trace)
                            except Exception as exc:  # the timing row stands without it
                                row["profile"]["error"] = repr(exc)[:300]
                            report.write()
                        if batch not in explicit and row["audio_s_per_s"] < 1.03 * best_rate:
                            break
                        best_rate = max(best_rate, row["audio_s_per_s"])
                report.data["summary"] = summarise(report.data["rows"])
                report.write()
                del run
                gc.collect()
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
    report.data["summary"] = summarise(report.data["rows"])
    report.data["meta"]["total_s"] = round(time.time() - started, 1)
    report.write()
    print(json.dumps({"summary": report.data["summary"]}, indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
