"""GPU check: the LM trainer with CUDA graphs gives the eager run's losses, epoch by epoch.

The CPU suite runs the compiled trainer through `aot_eager` (tests/training/test_lm_compile.py);
CUDA graphs only exist on the GPU. This runs the real trainer (`lm.run_lm_training`) on the tiny
LM tree (real tokenizer) with six songs of different lengths, so rows pad to several 64-token
widths (several graphs), two micro-batches per optimizer step (the LM default grad_accum 2: a
replay of the next micro-batch must not overwrite the gradients accumulated so far) and held-out
songs evaluated eagerly, once per compile mode. It prints and writes one JSON: the epoch losses
of each mode and the largest relative difference to the eager run.

    python bench/lm_graph_check.py --out lm_graph_check.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


from hotstep_ray.core.contracts import TrainLmOptions  # noqa: E402
from hotstep_ray.core.storage import Storage  # noqa: E402
from hotstep_ray.models.tiny_tree import write_tiny_lm  # noqa: E402
from hotstep_ray.training import lm, lm_data, lm_setup, lm_spec  # noqa: E402

CODES_KEY = "tensors/band/v1/lm_codes.jsonl"
MODES = ("off", "default", "reduce-overhead", "auto")


def prepare(root: Path) -> tuple[Path, Storage]:
    """The tiny LM (embeddings scaled up so the loss moves, as the CPU tests do) and six songs
    of 91-216 tokens."""
    folder = write_tiny_lm(root / "ckpt" / "acestep-5Hz-lm-0.6B", embedding_scale=25)
    storage = Storage(root / "data")
    songs = lm_data.synthetic_songs(6, [4, 60, 5, 130, 3, 6], seed=5)
    lm_data.write_lm_codes(storage.local_path(CODES_KEY), songs)
    return folder, storage


def spec(
    folder: Path,
    mode: str,
    epochs: int,
    device: str,
    lr: float,
    checkpointing: str = "none",
    run: str = "",
) -> lm_spec.LmTrainSpec:
    """LoRA r4, AdamW, grad_accum 2, a third of the songs held out; rows padded to 64-token
    multiples (several widths, several graphs). tests/training/test_lm_compile.py runs the
    same spec on the CPU."""
    options = TrainLmOptions(
        lm_size="0.6B", adapter_type="lora", rank=4, alpha=8, optimizer="adamw",
        learning_rate=lr, epochs=epochs, grad_accum=2, loss_on_cot=False, init_adapter="",
        target_loss=0, milestone_step=0, holdout_fraction=0.34,
    )  # fmt: skip
    return lm_spec.LmTrainSpec(
        options=options,
        lm_dir=str(folder),
        codes_key=CODES_KEY,
        artist="band",
        engine=lm_spec.LmEngine(
            device=device, compile=mode, checkpointing=checkpointing, pad_multiple=64
        ),
        run_key=f"adapters/lm-06b/band/{run or mode}",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--lr", type=float, default=3e-2, help="large: the loss must move")
    parser.add_argument("--out", default="lm_graph_check.json")
    parser.add_argument("--device", default="cuda", help="cpu: a smoke test of the script")
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args()
    report: dict = {"rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        folder, storage = prepare(Path(tmp))
        eager: list[float] = []
        for mode in args.modes.split(","):
            started = time.perf_counter()
            setup = lm_setup.setup_lm(
                spec(folder, mode, args.epochs, args.device, args.lr), storage
            )
            state = lm.train_lm(setup)
            losses = [row["loss"] for row in state.history]
            held = [row["loss"] for row in state.holdout]
            row = {"mode": mode, "resolved": setup.compile, "losses": losses, "holdout": held}
            row["seconds"] = round(time.perf_counter() - started, 1)
            if mode == "off":
                eager = losses
            else:
                row["max_rel_diff"] = max(
                    abs(a - b) / abs(b) for a, b in zip(losses, eager, strict=True)
                )
            report["rows"].append(row)
            print(json.dumps(row), flush=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
