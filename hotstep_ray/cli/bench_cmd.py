"""`hotstep-ray bench NAME [ARGS...]`: the main GPU benchmarks of docs/BENCHMARKS.md (the
one-off probes it also cites, e.g. bench/guard_cost.py, run as plain scripts).

The benchmark scripts live in the checkout's `bench/` folder (not in the installed package: they
carry device notes, not library code). This command runs one of them in this process with the
remaining arguments, exactly as `python bench/<its script> ARGS` does, so the numbers a user
gets from the CLI are the documented ones:

    hotstep-ray bench list
    hotstep-ray bench dit --models 2b --adapters lora64 --crops 6000 --batches 1,2 --compile default
    hotstep-ray bench lm --sizes 4B
    hotstep-ray bench dit --tiny --device cpu --out /tmp/dit_bench.json     (a CPU dry run)
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import typer

from hotstep_ray.cli.common import handle_errors
from hotstep_ray.core.errors import InputError

# name -> (script in bench/, what it measures)
BENCHES: dict[str, tuple[str, str]] = {
    "dit": ("dit_bench.py", "DiT adapter training step: ms/step, audio-s/s, MFU, peak memory"),
    "lm": ("lm_bench.py", "5 Hz LM adapter training step: tokens/s, MFU, peak memory"),
    "preprocess": ("preprocess_bench.py", "VAE encode + conditions + codes per song"),
    "audition": ("audition_bench.py", "codes -> WAV latency, planner LM codes/s, load"),
    "calibrate": ("calibrate_bench.py", "wall clock of an LM adapter calibration"),
    "mm3": ("mm3_bench.py", "MM3 DiT LoRA training step"),
    "label": ("label_bench.py", "Essentia analysis cost and actor scaling (CPU)"),
    "compile-check": ("dit_compile_check.py", "compiled vs eager DiT gradients"),
    "kernel-sweep": ("oobleck_kernel_sweep.py", "tiles of the VAE's Triton kernels (GPU)"),
    "decode": ("decode_bench.py", "preprocessing's decode task and resampling per song (CPU)"),
    "muon": ("muon_bench.py", "Muon's update on the DiT adapters' factor shapes, by precision"),
    "kron": ("kron_kernel_bench.py", "LoKR's w1-gradient Triton pass against torch (GPU)"),
}

app = typer.Typer(
    help="Run a benchmark script from the checkout's bench/ folder (see docs/BENCHMARKS.md).",
    no_args_is_help=True,
)


def bench_dir() -> Path:
    """The checkout's bench/ folder (an editable install, as `make` sets up)."""
    return Path(__file__).resolve().parents[2] / "bench"


def script_for(name: str, folder: Path | None = None) -> Path:
    folder = folder or bench_dir()
    if name not in BENCHES:
        raise InputError(f"unknown benchmark {name!r}: expected one of {', '.join(BENCHES)}")
    path = folder / BENCHES[name][0]
    if not path.is_file():
        raise InputError(
            f"{path} not found: the benchmarks run from a source checkout "
            "(git clone + make install), not from an installed wheel"
        )
    return path


@app.command("list")
def list_benches() -> None:
    """What each benchmark measures."""
    for name, (script, what) in BENCHES.items():
        typer.echo(f"{name:14} bench/{script:24} {what}")


def run_script(path: Path, args: list[str]) -> int:
    """Run `path` as `__main__` with `args` as its argv; returns its exit code."""
    saved = sys.argv
    sys.argv = [str(path), *args]
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as done:
        code = done.code
        # `raise SystemExit("why")`: the script's refusal, shown as Python itself would
        if isinstance(code, str):
            typer.echo(code, err=True)
        return code if isinstance(code, int) else (0 if code is None else 1)
    finally:
        sys.argv = saved
    return 0


def _command(name: str):
    @handle_errors
    def command(ctx: typer.Context) -> None:
        code = run_script(script_for(name), list(ctx.args))
        raise typer.Exit(code)

    command.__doc__ = BENCHES[name][1] + " (arguments: see --help of the script)."
    return command


for _name in BENCHES:
    app.command(
        _name,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        add_help_option=False,  # --help goes to the script, which documents its options
    )(_command(_name))
