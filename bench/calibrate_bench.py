"""Wall clock of an LM adapter calibration on one GPU, random weights (issue 12).

A full-size random-initialised ACE-Step 5 Hz LM (default 4B; `full_configs.build_lm`, bf16 on CUDA)
and the real LM tokenizer. A fake run is written to a temporary storage root: M milestone folders,
each a LoRA r16/α32 on q,k,v,o,gate,up,down with random nonzero weights (a different seed each,
exported BF16 as the trainer does), and a dataset of synthetic songs (`lm_codes.jsonl`). Then
`calibrate_lm` runs end to end exactly as `hotstep-ray calibrate run` does: the base row plus
M milestones x S scales, each generating `--seeds` songs of `--codes` codes (duration pinned to
codes / 5 s, metas pinned: no CoT phase), scoring (JS distances, memorisation, length), winner,
bake into `<run>-calibrated/`.

Reported: total wall clock, model build, per-item ms and codes/s (median), adapter load ms, the
scoring + bake time, the projected wall clock of the default grid at the measured rate. With
`--actors N` (> 1) the items run on N Ray actors sharing the GPU (1/N GPU each, one model copy
each) instead of in this process; then `generate_s` includes starting the actors and building
their models.

`--max-batch N` (default `LmCalibrationConfig`'s, 4): the worker decodes N requests of an item
together (`PlannerLM.generate_batch`, 2N CFG rows); 1 = one request at a time, the old path.
Batched vs sequential on the GPU (the same grid; compare `codes_per_s_overall`):

  python bench/calibrate_bench.py --max-batch 4 --codes 900 --out $OUT/calibrate_bench_b4.json
  python bench/calibrate_bench.py --max-batch 1 --codes 900 --out $OUT/calibrate_bench_b1.json

  device:   python bench/calibrate_bench.py --out $OUT/calibrate_bench.json
            python bench/calibrate_bench.py --actors 4 --out $OUT/calibrate_bench_ray4.json
  CPU dry:  python bench/calibrate_bench.py --tiny --device cpu --out /tmp/calibrate_bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root, for hotstep_ray

import torch  # noqa: E402

from hotstep_ray.audition.planner import PlannerLM, shared_copy  # noqa: E402
from hotstep_ray.audition.schemas import LmSampling  # noqa: E402
from hotstep_ray.calibration.lm_calibrate import (  # noqa: E402
    DEFAULT_MAX_BATCH,
    LmCalibrationConfig,
    LmWorker,
    calibrate_lm,
)
from hotstep_ray.calibration.ray_calibrate import make_runner  # noqa: E402
from hotstep_ray.calibration.report import winner_entry  # noqa: E402
from hotstep_ray.core.events import EventLog  # noqa: E402
from hotstep_ray.core.storage import Storage  # noqa: E402
from hotstep_ray.training import adapters, export, lm_data  # noqa: E402

RUN = "adapters/{folder}/bench/2026-01-01_00-00-00"
CODES = "tensors/bench/v1/lm_codes.jsonl"
TARGETS = adapters.LM_ATTENTION_TARGETS + adapters.MLP_TARGETS
RANK, ALPHA = 16, 32
DEFAULT_GRID = {"milestones": 6, "scales": 4, "seeds": 4, "codes": 900}  # keep-6 x 4, 180 s songs


@dataclass(frozen=True)
class RandomLmWorker:
    """Picklable factory: the same random LM (seeded) in every process, then an `LmWorker`."""

    lm_size: str
    data: str
    device: str
    tiny_dir: str = ""
    decode_mode: str = "auto"
    max_batch: int = DEFAULT_MAX_BATCH

    def build(self) -> tuple[torch.nn.Module, Any]:
        from hotstep_ray.models.lm_tokenizer import build_lm_tokenizer

        if self.tiny_dir:
            from hotstep_ray.models.text_models import load_lm

            return load_lm(Path(self.tiny_dir), self.device), build_lm_tokenizer()
        from hotstep_ray.models import full_configs as fc

        dtype = torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        lm = fc.build_lm(fc.LM_CONFIGS[self.lm_size], self.device, dtype, seed=0)
        return lm, build_lm_tokenizer()

    def __call__(self) -> LmWorker:
        lm, tokenizer = self.build()
        planner = PlannerLM(lm, tokenizer, lm_size=self.lm_size, decode_mode=self.decode_mode)
        return LmWorker(planner, Storage(self.data), max_batch=self.max_batch)


def write_run(lm: torch.nn.Module, storage: Storage, run: str, args: argparse.Namespace) -> None:
    """M milestone LoRA folders (random nonzero B) + the log + a synthetic dataset."""
    for m in range(args.milestones):
        copy = shared_copy(lm)
        adapters.inject(copy, adapters.AdapterSpec(rank=RANK, alpha=ALPHA, targets=TARGETS))
        generator = torch.Generator().manual_seed(100 + m)
        with torch.no_grad():
            for key, param in adapters.adapter_parameters(copy).items():
                std = 0.01 if "lora_B" in key else 0.02
                noise = torch.randn(param.shape, generator=generator) * std
                param.copy_(noise.to(param.device, param.dtype))
        export.export_lora(copy, storage, f"{run}/milestones/loss_{m + 1}")
        del copy
    songs = lm_data.synthetic_songs(args.songs, args.song_codes)
    lm_data.write_lm_codes(storage.local_path(CODES), songs)
    log = {"config": {"lm_size": args.lm_size, "codes": CODES}, "milestones": []}
    storage.write_json(f"{run}/lm_train_log.json", log)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--out", default=os.path.join(os.environ.get("OUT", "."), "calibrate_bench.json")
    )
    parser.add_argument("--lm-size", default="4B", choices=("0.6B", "1.7B", "4B"))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--milestones", type=int, default=3)
    parser.add_argument("--scales", default="0.5,0.75,1.0,1.25")
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--codes", type=int, default=150, help="codes per generation (5 per s)")
    parser.add_argument("--cfg-scale", type=float, default=2.0)
    parser.add_argument("--decode-mode", default="auto")
    parser.add_argument("--songs", type=int, default=16)
    parser.add_argument("--song-codes", type=int, default=900)
    parser.add_argument("--actors", type=int, default=1, help="> 1: Ray actors sharing the GPU")
    parser.add_argument(
        "--max-batch",
        type=int,
        default=DEFAULT_MAX_BATCH,
        help="requests of an item decoded together (1 = one at a time)",
    )
    parser.add_argument("--tiny", action="store_true", help="tiny 0.6B LM (CPU dry run)")
    args = parser.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "torch": torch.__version__,
        "device": args.device,
        "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None,
        "args": vars(args),
    }

    def flush() -> None:
        out.write_text(json.dumps(report, indent=2, default=str) + "\n")

    try:
        run_bench(args, report, flush)
    except Exception as exc:
        report["error"] = {"error": repr(exc), "trace": traceback.format_exc()}
        print(f"failed: {exc!r}", file=sys.stderr, flush=True)
        flush()
        return 1
    flush()
    print(json.dumps(report["summary"], indent=2), flush=True)
    return 0


def run_bench(args: argparse.Namespace, report: dict[str, Any], flush) -> None:
    root = Path(tempfile.mkdtemp(prefix="calibrate-bench-"))
    storage = Storage(root)
    tiny_dir = ""
    if args.tiny:
        from hotstep_ray.models.tiny_tree import LM_DIR, write_tiny_lm

        args.lm_size = "0.6B"
        tiny_dir = str(write_tiny_lm(root / "checkpoints" / LM_DIR, seed=3))
        torch.set_num_threads(1)
    folder = {"0.6B": "lm-06b", "1.7B": "lm-17b", "4B": "lm-4b"}[args.lm_size]
    run = RUN.format(folder=folder)
    factory = RandomLmWorker(
        args.lm_size, storage.url, args.device, tiny_dir, args.decode_mode, args.max_batch
    )

    start = time.perf_counter()
    worker = factory()
    _sync(args.device)
    build_s = time.perf_counter() - start
    start = time.perf_counter()
    write_run(worker.planner.base.model, storage, run, args)
    write_s = time.perf_counter() - start
    start = time.perf_counter()
    worker.adapter(f"{run}/milestones/loss_1")
    _sync(args.device)
    adapter_ms = (time.perf_counter() - start) * 1000
    if args.actors > 1:  # every actor builds its own copy; free this one
        del worker
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
        share = 1.0 / args.actors if args.device.startswith("cuda") else 0.0
        runner = make_runner(True, actors=args.actors, num_gpus=share)
        make_worker: Any = factory
    else:
        runner = make_runner(False)
        make_worker = lambda: worker  # noqa: E731 - reuse the built model

    config = LmCalibrationConfig(
        scales=args.scales,
        seeds=args.seeds,
        duration_s=args.codes / 5,
        sampling=LmSampling(cfg_scale=args.cfg_scale),
        include_final=False,
        max_batch=args.max_batch,
    )
    finished: list[float] = []
    events = EventLog(
        lambda e: finished.append(time.perf_counter()) if e.type == "progress" else None
    )
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    outcome = calibrate_lm(
        storage, run, worker=make_worker, config=config, runner=runner, events=events
    )
    _sync(args.device)
    total_s = time.perf_counter() - start
    generated = finished[-1] - start if finished else total_s
    rows = outcome.rows
    item_ms = [r["ms"] for r in rows]
    codes = sum(sum(r["codes_count"]) for r in rows)
    per_item_codes = args.seeds * args.codes
    rate = codes / generated
    grid_codes = (1 + DEFAULT_GRID["milestones"] * DEFAULT_GRID["scales"]) * (
        DEFAULT_GRID["seeds"] * DEFAULT_GRID["codes"]
    )
    report["items"] = [
        {"candidate": r["candidate"], "scale": r["scale"], "ms": r["ms"],
         "codes_per_s": round(per_item_codes / (r["ms"] / 1000), 1)}
        for r in rows
    ]  # fmt: skip
    report["summary"] = {
        "lm": args.lm_size,
        "grid": f"base + {args.milestones} milestones x {len(config.scales)} scales",
        "items": len(rows),
        "generations": len(rows) * args.seeds,
        "codes_per_generation": args.codes,
        "actors": args.actors,
        "max_batch": args.max_batch,
        "build_model_s": round(build_s, 2),
        "write_run_s": round(write_s, 2),
        "adapter_load_ms": round(adapter_ms, 1),
        "calibrate_total_s": round(total_s, 2),
        "generate_s": round(generated, 2),
        "score_and_bake_s": round(total_s - generated, 2),
        "item_ms_median": round(statistics.median(item_ms), 1),
        "codes_per_s_overall": round(rate, 1),
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)
        if args.device.startswith("cuda") and args.actors == 1
        else None,
        "projected_default_grid_s": round(grid_codes / rate, 1),
        "projected_default_grid": DEFAULT_GRID,
        "winner": winner_entry(outcome.winner),
    }
    flush()


if __name__ == "__main__":
    raise SystemExit(main())
