"""5 Hz LM adapter training step on one GPU: tokens/s, MFU, peak memory (issue 7).

Full-size random-initialised ACE-Step LMs (Qwen3 0.6B / 1.7B / 4B, vocab 217,204, tied head), bf16
weights, LoRA r16/α32 on q,k,v,o,gate,up,down with fp32 masters under autocast, the trainer's own
step: `LmLossModule` (body once, chunked fused head CE over the targets only), backward, clip 1.0,
optimizer step, zero_grad. Configurations per size:

    b1700*      one 1700-token sequence, loss on every token (the baseline's setting)
    song*       one 240 s song: 468 prompt tokens, then <think> … 1200 codes <|im_end|>\\n (1700
                tokens), loss from <think> (1231 targets)
    pack4*      four such songs in one 6800-token row, attention per song (sdpa: block-diagonal
                mask from the position ids; varlen: flash varlen on the song boundaries)
    suffixes    _ckpt every layer checkpointed, _fit16 the fewest checkpointed layers that the
                memory model fits in 16 GiB, _muon hybrid Muon instead of AdamW, _compile
                torch.compile of each decoder layer as the trainer does it (Inductor default
                mode, `lm_loss.compile_layers`, static shapes, rows padded to 64 tokens), _ro the
                same in reduce-overhead mode (CUDA graphs, `cudagraph_mark_step_begin` per step)

`--compile off|default|reduce-overhead` overrides the mode of every chosen configuration. A compiled
configuration also reports its first step (the compile), dynamo's graph breaks and graphs, and when
named in `--new-shape` one step on songs 64 tokens longer (what each new row width costs a run).

Per configuration: 3 warm-up steps, then `--steps` timed steps (synchronised), median. MFU uses
`shared/reference/lm-vae-baseline.md`'s model-FLOP formula (`lm_vram.train_flops`; the head counted
for the projected targets) over the H200's dense bf16 peak, 989 TFLOP/s (also reported against the
baseline's 790). `seed_run_s` projects the seed's real 4B run (17 songs of 1700 tokens, 29 epochs)
from the measured tokens/s. One process; a configuration that fails is recorded and the next one
runs. Results go to `$OUT/lm_bench.json` after every configuration, and a table to stdout.

    python bench/lm_bench.py [--sizes 0.6B 1.7B 4B] [--configs NAME ...] [--steps 10]
        [--compile off|default|reduce-overhead] [--new-shape CONFIG ...]
    python bench/lm_bench.py --device cpu --sizes tiny --configs song song_compile --steps 2 \
        --backend aot_eager    # smoke test of the script (tiny: 2 layers, 64 wide)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for hotstep_ray

import torch  # noqa: E402
from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: E402

from hotstep_ray.training import compiling, flat_grads, lm_data, lm_loss, lm_spec, lm_vram  # noqa: E402
from hotstep_ray.training.optim import build_optimizer  # noqa: E402

PEAK_FLOPS = 989e12  # H200 SXM dense bf16
BASELINE_PEAK_FLOPS = 790e12  # the baseline's figure (measured 8192³ matmul rate)
VOCAB = 217204
RANK, ALPHA = 16, 32
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SONG_TOKENS, SONG_PROMPT = 1700, 468  # 468 prompt + 30 CoT + 1200 codes + <|im_end|> + "\n"
SEED_RUN = {"songs": 17, "epochs": 29, "tokens": SONG_TOKENS}  # the seed's real 4B run
BUDGET_16 = 16 * lm_vram.GIB
# acestep15.md §2.8 (used when hotstep_ray.models.full_configs cannot be imported).
SHAPES = {
    "0.6B": (1024, 28, 16, 3072),
    "1.7B": (2048, 28, 16, 6144),
    "4B": (2560, 36, 32, 9728),
}
TINY = (64, 2, 4, 128)  # CPU smoke test only: hidden, layers, heads, intermediate (2 KV heads)
# name: (sequence kind, songs, attention, checkpointing, optimizer, compile mode)
CONFIGS: dict[str, tuple[str, int, str, str, str, str]] = {
    "b1700_ckpt": ("flat", 1, "sdpa", "full", "adamw", "off"),
    "b1700": ("flat", 1, "sdpa", "none", "adamw", "off"),
    "song_fit16": ("song", 1, "sdpa", "fit16", "adamw", "off"),
    "song": ("song", 1, "sdpa", "none", "adamw", "off"),
    "pack4_sdpa": ("song", 4, "sdpa", "none", "adamw", "off"),
    "pack4_varlen": ("song", 4, "varlen", "none", "adamw", "off"),
    "pack4_varlen_fit16": ("song", 4, "varlen", "fit16", "adamw", "off"),
    "pack4_varlen_muon": ("song", 4, "varlen", "none", "muon", "off"),
    "song_compile": ("song", 1, "sdpa", "none", "adamw", "default"),
    "song_fit16_compile": ("song", 1, "sdpa", "fit16", "adamw", "default"),
    "pack4_varlen_compile": ("song", 4, "varlen", "none", "adamw", "default"),
    "song_ro": ("song", 1, "sdpa", "none", "adamw", "reduce-overhead"),
    "song_fit16_ro": ("song", 1, "sdpa", "fit16", "adamw", "reduce-overhead"),
    "pack4_varlen_ro": ("song", 4, "varlen", "none", "adamw", "reduce-overhead"),
    "pack2_varlen_ro": ("song", 2, "varlen", "none", "adamw", "reduce-overhead"),
    "song_ro_muon": ("song", 1, "sdpa", "none", "muon", "reduce-overhead"),
}
COMPILE_CHOICES = ("config", "off", "default", "reduce-overhead")


def qwen3_config(shape: tuple[int, int, int, int], kv_heads: int, head_dim: int) -> dict:
    """A Qwen3 config dict: (hidden, layers, heads, intermediate), the code vocabulary."""
    hidden, layers, heads, inter = shape
    return {
        "model_type": "qwen3",
        "vocab_size": VOCAB,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "tie_word_embeddings": True,
        "use_cache": False,
    }


def lm_config(size: str) -> dict[str, Any]:
    if size == "tiny":
        return qwen3_config(TINY, kv_heads=2, head_dim=TINY[0] // TINY[2])
    try:
        from hotstep_ray.models.full_configs import LM_CONFIGS

        return dict(LM_CONFIGS[size])
    except Exception:  # full_configs imports diffusers, which the GPU machine may lack
        config = qwen3_config(SHAPES[size], kv_heads=8, head_dim=128)
        config.update(rms_norm_eps=1e-6, rope_theta=1000000, max_position_embeddings=40960)
        return config


def build_model(size: str, device: torch.device) -> Qwen3ForCausalLM:
    """Random N(0, 0.02) weights drawn on the GPU in bf16 (transformers' own init)."""
    config = Qwen3Config.from_dict(lm_config(size))
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16 if device.type == "cuda" else torch.float32)
    try:
        with torch.device(device):
            model = Qwen3ForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model.train()


def inject_lora(model: torch.nn.Module) -> str:
    """The trainer's `adapters.inject` (fp32 masters); plain peft when pydantic is missing."""
    try:
        from hotstep_ray.training import adapters

        spec = adapters.AdapterSpec(kind="lora", rank=RANK, alpha=ALPHA, targets=TARGETS)
        adapters.inject(model, spec)
        layers = [layer for _, layer in adapters.tuner_layers(model)]
        how = "hotstep_ray.adapters"
    except ImportError:
        from peft import LoraConfig, inject_adapter_in_model
        from peft.tuners.tuners_utils import BaseTunerLayer

        model.requires_grad_(False)
        config = LoraConfig(
            r=RANK, lora_alpha=ALPHA, target_modules=list(TARGETS), lora_dropout=0.0
        )
        inject_adapter_in_model(config, model)
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.data = param.data.float()
                param.requires_grad_(True)
        layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
        how = "peft"
    for layer in layers:  # bf16 activations meet fp32 weights under autocast: no input casts
        layer.cast_input_dtype_enabled = False
    return how


def make_batch(
    kind: str, songs: int, seed: int, pad_multiple: int = 1, tokens: int = SONG_TOKENS
) -> lm_data.MicroBatch:
    """One row of `songs` songs of `tokens` tokens, padded to `pad_multiple` (the trainer pads
    compiled rows to 64: 1700 -> 1728 tokens, 6800 -> 6848; the pads count as no work in MFU)."""
    generator = torch.Generator().manual_seed(seed)
    examples = []
    for i in range(songs):
        ids = torch.randint(0, VOCAB, (tokens,), generator=generator).tolist()
        start = 1 if kind == "flat" else SONG_PROMPT  # flat: loss on every token
        end = tokens if kind == "flat" else tokens - 1  # song: not the final "\n"
        examples.append(lm_data.LmExample(f"s{i}", tuple(ids), start, end, 1200))
    return lm_data.collate(examples, (tuple(range(songs)),), pad_multiple=pad_multiple)


def checkpoint_layers(
    mode: str, dims: lm_vram.LmDims, batch: lm_data.MicroBatch, n_adapter: int
) -> int:
    if mode == "none":
        return 0
    if mode == "full":
        return dims.layers
    fit = lm_vram.fit_checkpointing(
        dims,
        BUDGET_16,
        batch.input_ids.numel(),
        targets=batch.n_targets,
        adapter_parameters=n_adapter,
        optimizer="adamw",
    )
    return fit.checkpointed_layers


def run_config(
    name: str,
    model: Qwen3ForCausalLM,
    dims: lm_vram.LmDims,
    steps: int,
    device: torch.device,
    compile_mode: str = "config",
    backend: str = "inductor",
    new_shape: bool = False,
) -> dict[str, Any]:
    kind, songs, attention, ckpt_mode, optimizer_kind, mode = CONFIGS[name]
    mode = mode if compile_mode == "config" else compile_mode
    compiled = mode != "off"
    # the trainer's rows (`lm_setup.row_multiple`)
    pad = lm_loss.COMPILE_PAD_MULTIPLE if compiled else 1
    batch = make_batch(kind, songs, seed=len(name), pad_multiple=pad)
    n_adapter = lm_vram.adapter_params(dims, "lora", RANK)
    ckpt = checkpoint_layers(ckpt_mode, dims, batch, n_adapter)
    lm_loss.set_attention(model, attention)
    lm_loss.set_layer_checkpointing(model.model.layers, ckpt)
    counters = torch._dynamo.utils.counters
    counters.clear()
    if compiled:
        lm_loss.compile_layers(model.model.layers, mode, backend=backend)
    module = lm_loss.LmLossModule(model, lm_vram.DEFAULT_CE_CHUNK)
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in trainable]
    optimizer = build_optimizer(trainable, kind=optimizer_kind, lr=1e-5)
    # as `lm_setup.setup_lm`: with CUDA graphs, gradients outside the graph pool as views of one flat
    # buffer, clipped and zeroed as one (`FlatGrads`)
    flats = flat_grads.FlatGrads(params) if mode == "reduce-overhead" else None
    batch = batch.to(device)

    def step(batch: lm_data.MicroBatch = batch) -> None:
        if mode == "reduce-overhead":  # as `lm.run_epoch`: the last step's graph outputs are dead
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = lm_loss.batch_loss(module, batch)
        loss.backward()
        flat_grads.clip_grads(params, 1.0, flats)
        optimizer.step()
        flat_grads.zero_grads(optimizer, flats, set_to_none=True)

    compile_info: dict[str, Any] = {}
    try:
        sync(device)
        started = time.perf_counter()
        step()
        sync(device)
        first_ms = (time.perf_counter() - started) * 1000  # includes compilation
        if compiled:
            compile_info = {
                "graph_breaks": sum(counters["graph_break"].values()),
                "break_reasons": sorted(counters["graph_break"])[:5],
                "graphs": counters["stats"]["unique_graphs"],
            }
        for _ in range(2):
            step()
        sync(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        times = []
        for _ in range(steps):
            started = time.perf_counter()
            step()
            sync(device)
            times.append(time.perf_counter() - started)
        peak, reserved = peak_memory(device)
        if compiled and new_shape:  # a row 64 tokens wider: what each new width costs a run
            wider = make_batch(kind, songs, seed=1, pad_multiple=pad, tokens=SONG_TOKENS + 64)
            wider = wider.to(device)
            sync(device)
            started = time.perf_counter()
            step(wider)
            sync(device)
            compile_info["new_shape_ms"] = round((time.perf_counter() - started) * 1000, 1)
            compile_info["graphs_after_new_shape"] = counters["stats"]["unique_graphs"]
    finally:
        if compiled:
            lm_loss.uncompile_layers(model.model.layers)
            torch._dynamo.reset()  # also frees the CUDA-graph pools of reduce-overhead
        lm_loss.set_layer_checkpointing(model.model.layers, 0)
        model.zero_grad(set_to_none=True)
    seconds = statistics.median(times)
    flops = lm_vram.train_flops(dims, batch.doc_lengths, batch.n_targets, RANK, ckpt)
    estimate = lm_vram.estimate_vram(
        dims,
        batch.input_ids.numel(),
        checkpointed_layers=ckpt,
        adapter_parameters=n_adapter,
        targets=batch.n_targets,
        optimizer=optimizer_kind,
    )
    tokens_per_s = batch.n_tokens / seconds
    seed_tokens = SEED_RUN["songs"] * SEED_RUN["epochs"] * SEED_RUN["tokens"]
    return {
        "config": name,
        "sequence": kind,
        "songs_per_step": songs,
        "tokens": batch.n_tokens,
        "width": int(batch.input_ids.shape[1]),
        "targets": batch.n_targets,
        "attention": attention,
        "checkpointed_layers": ckpt,
        "optimizer": optimizer_kind,
        "compile": mode,
        **({"backend": backend} if compiled and backend != "inductor" else {}),
        "ms_step": round(seconds * 1000, 2),
        "ms_p10": round(sorted(times)[len(times) // 10] * 1000, 2),
        "ms_p90": round(sorted(times)[(len(times) * 9) // 10 - 1] * 1000, 2),
        "first_step_ms": round(first_ms, 1),
        "tokens_per_s": round(tokens_per_s),
        "model_tflop": round(flops["model_flops"] / 1e12, 3),
        "mfu": round(flops["model_flops"] / seconds / PEAK_FLOPS, 4),
        "mfu_at_790": round(flops["model_flops"] / seconds / BASELINE_PEAK_FLOPS, 4),
        "hfu": round(flops["hardware_flops"] / seconds / PEAK_FLOPS, 4),
        "peak_gib": round(peak / lm_vram.GIB, 3),
        "reserved_gib": round(reserved / lm_vram.GIB, 3),
        "estimate_gib": round(estimate.total / lm_vram.GIB, 3),
        "seed_run_s": round(seed_tokens / tokens_per_s, 1),
        **compile_info,
    }


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory(device: torch.device) -> tuple[int, int]:
    """(max allocated, max reserved) bytes since the last reset; zeros off CUDA."""
    if device.type != "cuda":
        return 0, 0
    return torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)


def environment(device: torch.device) -> dict[str, Any]:
    import transformers

    try:
        import peft

        peft_version = peft.__version__
    except ImportError:
        peft_version = None
    return {
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "peft": peft_version,
        "python": platform.python_version(),
        "flash_varlen": lm_loss.flash_varlen_available(),
        "peak_tflops": PEAK_FLOPS / 1e12,
    }


def table(results: list[dict[str, Any]]) -> str:
    head = (
        "| LM | config | compile | tokens | ckpt | ms/step | tokens/s | MFU % | peak GiB | "
        "est GiB | seed run s | first step ms |"
    )
    lines = [head, "|" + "---|" * 12]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['size']} | {r['config']} | error: {r['error'][:60]} |" + " |" * 9)
            continue
        lines.append(
            f"| {r['size']} | {r['config']} | {r['compile']} | {r['tokens']} | "
            f"{r['checkpointed_layers']} | {r['ms_step']} | {r['tokens_per_s']} | "
            f"{100 * r['mfu']:.1f} | {r['peak_gib']} | {r['estimate_gib']} | {r['seed_run_s']} | "
            f"{r['first_step_ms']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["0.6B", "1.7B", "4B"])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    parser.add_argument("--device", default="cuda", help="cuda; cpu only to smoke-test the script")
    parser.add_argument(
        "--compile",
        choices=COMPILE_CHOICES,
        default="config",
        help="compile mode of every configuration (config: each one's own)",
    )
    parser.add_argument(
        "--backend", default="inductor", help="torch.compile backend (aot_eager: CPU smoke test)"
    )
    parser.add_argument(
        "--new-shape",
        nargs="*",
        default=[],
        metavar="CONFIG",
        help="compiled configurations that also time one step on a 64-token wider row",
    )
    parser.add_argument(
        "--activation-budget",
        type=float,
        default=lm_spec.LmEngine.model_fields["activation_budget"].default,
        help="activation memory budget of the compiled layers (default: the trainer's, "
        "`LmEngine.activation_budget`; < 1: the partitioner recomputes the cheapest ops in the "
        "backward instead of saving them; BENCHMARKS rows say which they used)",
    )
    args = parser.parse_args()
    compiling.set_activation_budget(args.activation_budget)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("lm_bench needs a CUDA GPU")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"environment": environment(device), "results": []}
    print(json.dumps(report["environment"]), flush=True)
    for size in args.sizes:
        model = None
        try:
            started = time.perf_counter()
            model = build_model(size, device)
            how = inject_lora(model)
            dims = lm_vram.LmDims.from_config(model.config)
            print(
                f"{size}: built in {time.perf_counter() - started:.1f} s, adapter via {how}",
                flush=True,
            )
        except Exception as exc:  # record and go on
            report["results"].append({"size": size, "config": "build", "error": repr(exc)})
            continue
        for name in args.configs:
            try:
                row = run_config(
                    name,
                    model,
                    dims,
                    args.steps,
                    device,
                    args.compile,
                    args.backend,
                    new_shape=name in args.new_shape,
                )
                row = {"size": size, **row, "activation_budget": args.activation_budget}
            except Exception as exc:  # one failing configuration must not stop the rest
                row = {"size": size, "config": name, "error": repr(exc)[:500]}
                traceback.print_exc()
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            report["results"].append(row)
            print(json.dumps(row), flush=True)
            (out / "lm_bench.json").write_text(json.dumps(report, indent=2))
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(table(report["results"]))
    (out / "lm_bench.md").write_text(table(report["results"]) + "\n")


if __name__ == "__main__":
    main()
