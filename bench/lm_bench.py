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
                torch.compile on each decoder layer

Per configuration: 3 warm-up steps, then `--steps` timed steps (synchronised), median. MFU uses
`shared/reference/lm-vae-baseline.md`'s model-FLOP formula (`lm_vram.train_flops`; the head counted
for the projected targets) over the H200's dense bf16 peak, 989 TFLOP/s (also reported against the
baseline's 790). `seed_run_s` projects the seed's real 4B run (17 songs of 1700 tokens, 29 epochs)
from the measured tokens/s. One process; a configuration that fails is recorded and the next one
runs. Results go to `$OUT/lm_bench.json` after every configuration, and a table to stdout.

    python bench/lm_bench.py [--sizes 0.6B 1.7B 4B] [--configs NAME ...] [--steps 10]
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

from hotstep_ray.training import lm_data, lm_loss, lm_vram  # noqa: E402
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
# name: (sequence kind, songs, attention, checkpointing, optimizer, compile)
CONFIGS: dict[str, tuple[str, int, str, str, str, bool]] = {
    "b1700_ckpt": ("flat", 1, "sdpa", "full", "adamw", False),
    "b1700": ("flat", 1, "sdpa", "none", "adamw", False),
    "song_fit16": ("song", 1, "sdpa", "fit16", "adamw", False),
    "song": ("song", 1, "sdpa", "none", "adamw", False),
    "pack4_sdpa": ("song", 4, "sdpa", "none", "adamw", False),
    "pack4_varlen": ("song", 4, "varlen", "none", "adamw", False),
    "pack4_varlen_fit16": ("song", 4, "varlen", "fit16", "adamw", False),
    "pack4_varlen_muon": ("song", 4, "varlen", "none", "muon", False),
    "song_compile": ("song", 1, "sdpa", "none", "adamw", True),
    "pack4_varlen_compile": ("song", 4, "varlen", "none", "adamw", True),
}


def lm_config(size: str) -> dict[str, Any]:
    try:
        from hotstep_ray.models.full_configs import LM_CONFIGS

        return dict(LM_CONFIGS[size])
    except Exception:  # full_configs imports diffusers, which the GPU machine may lack
        hidden, layers, heads, inter = SHAPES[size]
        return {
            "model_type": "qwen3",
            "vocab_size": VOCAB,
            "hidden_size": hidden,
            "intermediate_size": inter,
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1000000,
            "max_position_embeddings": 40960,
            "tie_word_embeddings": True,
            "use_cache": False,
        }


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


def make_batch(kind: str, songs: int, seed: int) -> lm_data.MicroBatch:
    generator = torch.Generator().manual_seed(seed)
    examples = []
    for i in range(songs):
        ids = torch.randint(0, VOCAB, (SONG_TOKENS,), generator=generator).tolist()
        start = 1 if kind == "flat" else SONG_PROMPT  # flat: loss on every token
        end = SONG_TOKENS if kind == "flat" else SONG_TOKENS - 1  # song: not the final "\n"
        examples.append(lm_data.LmExample(f"s{i}", tuple(ids), start, end, 1200))
    return lm_data.collate(examples, (tuple(range(songs)),))


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
    name: str, model: Qwen3ForCausalLM, dims: lm_vram.LmDims, steps: int, device: torch.device
) -> dict[str, Any]:
    kind, songs, attention, ckpt_mode, optimizer_kind, compiled = CONFIGS[name]
    batch = make_batch(kind, songs, seed=len(name))
    n_adapter = lm_vram.adapter_params(dims, "lora", RANK)
    ckpt = checkpoint_layers(ckpt_mode, dims, batch, n_adapter)
    lm_loss.set_attention(model, attention)
    lm_loss.set_layer_checkpointing(model.model.layers, ckpt)
    if compiled:
        for layer in model.model.layers:
            layer.compile(dynamic=False)
    module = lm_loss.LmLossModule(model, lm_loss.DEFAULT_CE_CHUNK)
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in trainable]
    optimizer = build_optimizer(trainable, kind=optimizer_kind, lr=1e-5)
    batch = batch.to(device)

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = lm_loss.batch_loss(module, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    try:
        sync(device)
        started = time.perf_counter()
        step()
        sync(device)
        first_ms = (time.perf_counter() - started) * 1000  # includes compilation
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
    finally:
        if compiled:
            for layer in model.model.layers:
                layer._compiled_call_impl = None
            torch._dynamo.reset()
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
        "targets": batch.n_targets,
        "attention": attention,
        "checkpointed_layers": ckpt,
        "optimizer": optimizer_kind,
        "compile": compiled,
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
    head = "| LM | config | tokens | ckpt | ms/step | tokens/s | MFU % | peak GiB | est GiB | seed run s |"
    lines = [head, "|" + "---|" * 10]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['size']} | {r['config']} | error: {r['error'][:60]} |" + " |" * 7)
            continue
        lines.append(
            f"| {r['size']} | {r['config']} | {r['tokens']} | {r['checkpointed_layers']} | "
            f"{r['ms_step']} | {r['tokens_per_s']} | {100 * r['mfu']:.1f} | {r['peak_gib']} | "
            f"{r['estimate_gib']} | {r['seed_run_s']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["0.6B", "1.7B", "4B"])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS))
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    parser.add_argument("--device", default="cuda", help="cuda; cpu only to smoke-test the script")
    args = parser.parse_args()
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
                row = {"size": size, **run_config(name, model, dims, args.steps, device)}
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
