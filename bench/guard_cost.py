"""Host cost of Dynamo's guards on a compiled DiT block, per adapter, on the CPU.

On the H200 at batch 1 on short crops a step is host-bound, and each of the 24 compiled blocks
pays Dynamo's cache lookup (its guard evaluation) on every call (docs/BENCHMARKS.md, fourteenth
run). This measures that lookup on the tiny DiT with the trainer's own step and the GPU's adapter
paths (bf16 autocast, LoKR's "ordered" mix), compiled with Dynamo + AOTAutograd and no Inductor
(the CPU's compile path in the tests): the guards are Dynamo's either way, so the count and the
relative cost carry over, though not the absolute microseconds.

  python bench/guard_cost.py --adapters lora64,lokr512 --repeat 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dit_bench  # noqa: E402

from hotstep_ray.core.storage import Storage  # noqa: E402
from hotstep_ray.training import dit  # noqa: E402
from hotstep_ray.training.speed import SpeedOptions  # noqa: E402


def lookup_us(adapter: str, repeat: int) -> dict[str, float]:
    """Median over `repeat` profiled steps of Dynamo's cache lookup per block call (µs), with
    every guard and with only the differentiating ones (`skip_guard_eval_unsafe`; the
    trainer's policy of that stance, `SKIP_SEEN_GUARDS`, was removed after the H200 found no
    gain: docs/BENCHMARKS.md, fifteenth run), alternately."""
    from torch.profiler import ProfilerActivity, profile

    args = dit_bench.tiny_cpu_args()
    args.speed = SpeedOptions(kron_mix="ordered")  # CUDA's factored LoKR path, read at trace time
    run = dit_bench.build_group(args, "2b", adapter, "none", "sdpa", Storage(tempfile.mkdtemp()))
    run.autocast = torch.bfloat16  # the GPU's compute path (the CPU trainer runs float32)
    dit.compile_blocks(run.transformer, "default", backend="aot_eager")
    window = [(0,)]
    for _ in range(3):  # compile, then settle
        dit.optimizer_step(run, window)
    per_call: dict[bool, list[float]] = {False: [], True: []}  # guards skipped -> µs per call
    for i in range(2 * repeat):
        skip = i % 2 == 1
        with torch.compiler.set_stance("default", skip_guard_eval_unsafe=skip):
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                dit.optimizer_step(run, window)
        events = [e for e in prof.key_averages() if e.key == "TorchDynamo Cache Lookup"]
        per_call[skip].append(events[0].cpu_time_total / events[0].count)
    return {
        "lookup_us_per_block": round(statistics.median(per_call[False]), 1),
        "lookup_us_skipping": round(statistics.median(per_call[True]), 1),
        "calls": events[0].count,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--adapters", default="lora64,lokr512")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rows = {}
    for adapter in args.adapters.split(","):
        torch._dynamo.reset()
        rows[adapter] = lookup_us(adapter, args.repeat)
        print(json.dumps({adapter: rows[adapter]}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
