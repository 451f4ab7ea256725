"""`hotstep-ray bench`: the documented benchmark scripts behind one command."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from hotstep_ray.cli import bench_cmd
from hotstep_ray.cli.main import app
from hotstep_ray.core.errors import InputError

runner = CliRunner()


def test_every_listed_benchmark_is_a_script_in_the_checkout():
    result = runner.invoke(app, ["bench", "list"])
    assert result.exit_code == 0
    for name, (script, _) in bench_cmd.BENCHES.items():
        assert bench_cmd.script_for(name).name == script
        assert f"bench/{script}" in result.output


def test_unknown_or_missing_benchmarks_are_refused(tmp_path):
    with pytest.raises(InputError, match="unknown benchmark 'gpu'"):
        bench_cmd.script_for("gpu")
    with pytest.raises(InputError, match="source checkout"):
        bench_cmd.script_for("dit", folder=tmp_path)


def test_script_exit_codes_pass_through(tmp_path):
    script = tmp_path / "fake_bench.py"
    script.write_text("import sys\nprint(sys.argv[1:])\nsys.exit(3)\n")
    assert bench_cmd.run_script(script, ["--x", "1"]) == 3


@pytest.mark.slow
def test_bench_dit_runs_the_trainers_step_and_writes_rows(tmp_path):
    out = tmp_path / "dit.json"
    args = ["bench", "dit", "--tiny", "--device", "cpu", "--models", "2b", "--adapters"]
    args += ["lora64", "--batches", "1", "--steps", "1", "--warmup", "0", "--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["rows"]
    assert [row["crop"] for row in rows] == [32, 64]  # the tiny model's two crops
    assert all(row["step_ms"] > 0 and row["finite"] for row in rows)
    timed = tmp_path / "timed.json"
    result = runner.invoke(app, [*args[:-1], str(timed), "--optimizer-time", "--guards-ab"])
    assert result.exit_code == 0, result.output
    for row in json.loads(timed.read_text())["rows"]:
        assert row["optimizer_ms"] > 0
        # the guard A/B times the same number of steps again with each stance, alternately
        assert len(row["step_ms_skip_guards_all"]) == 1 and row["step_ms_skip_guards"] > 0
        assert row["step_ms_ab_guarded"] > 0


def test_bench_trace_writes_a_chrome_trace_and_its_gpu_summary(tmp_path):
    """`--trace`: two steps' host + GPU timeline as a gzipped Chrome trace; the GPU's busy time is
    the union of kernel intervals (two streams may overlap), so its idle share is never negative."""
    import gzip
    from types import SimpleNamespace

    from hotstep_ray.core.storage import Storage

    dit_bench = _load_bench("dit")
    assert dit_bench.covered([(0, 4), (2, 6), (10, 11)]) == 7  # overlap counted once, gap not
    assert dit_bench.covered([(0, 10), (2, 3)]) == 10  # a kernel inside another
    assert dit_bench.covered([]) == 0

    def event(device: str, start: float, end: float, label: bool = False) -> SimpleNamespace:
        kind = SimpleNamespace(name=device)
        span = SimpleNamespace(start=start, end=end)
        return SimpleNamespace(device_type=kind, time_range=span, is_user_annotation=label)

    # a kernel, a host op, and a host label mirrored on the GPU timeline across an idle gap
    events = [event("CUDA", 5, 6), event("CPU", 0, 9), event("CUDA", 0, 9, label=True)]
    events.append(event("CUDA", 1, 2))
    assert dit_bench.gpu_spans(events) == [(1, 2), (5, 6)]
    args = dit_bench.tiny_cpu_args()
    run = dit_bench.build_group(args, "2b", "lora64", "none", "sdpa", Storage(str(tmp_path)))
    dit_bench.configure(run, 32, 1, "off")
    step_before = run.state.step
    summary = dit_bench.trace_steps(run, tmp_path / "t.trace.json.gz")
    assert run.state.step == step_before + 2
    assert summary["steps"] == 2 and summary["wall_ms"] > 0 and summary["file"] == "t.trace.json.gz"
    assert summary["gpu_busy_ms"] == 0 and summary["gpu_idle_share"] is None  # no GPU here
    events = json.loads(gzip.open(tmp_path / "t.trace.json.gz").read())["traceEvents"]
    assert sum(e.get("name", "").startswith("Optimizer.step") for e in events) == 2
    assert not (tmp_path / "t.trace.json").exists()  # only the gzipped copy is kept


def _load_bench(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"{name}_bench", bench_cmd.script_for(name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_update_timing_leaves_the_adapter_and_optimizer_as_they_were():
    """`--optimizer-time` steps the optimizer on random gradients; `unchanged` puts the
    parameters and the optimizer state back, so later rows train on from their own steps."""
    from types import SimpleNamespace

    import torch

    from hotstep_ray.training.optim import build_optimizer

    dit_bench = _load_bench("dit")
    params = [torch.nn.Parameter(torch.randn(32, 48)), torch.nn.Parameter(torch.randn(48))]
    optimizer = build_optimizer([("w", params[0]), ("b", params[1])])
    engine = SimpleNamespace(live_flats=lambda: None)  # per-parameter gradients, no flat buffer
    run = SimpleNamespace(
        params=params, optimizer=optimizer, device=torch.device("cpu"), engine=engine
    )
    for param in params:  # one real step first, so there is state to keep
        param.grad = torch.randn_like(param)
    optimizer.step()
    before = [param.detach().clone() for param in params]
    state = [leaf.clone() if torch.is_tensor(leaf) else leaf for leaf in _leaves(optimizer)]
    with dit_bench.unchanged(run):
        assert dit_bench.update_ms(run, repeats=2) > 0
        assert not torch.equal(params[0], before[0])  # the timing did move them
    for param, kept in zip(params, before, strict=True):
        assert torch.equal(param, kept)
        assert torch.count_nonzero(param.grad) == 0  # zeroed buffers, as the graph trainer
    for now, kept in zip(_leaves(optimizer), state, strict=True):
        assert torch.equal(now, kept) if torch.is_tensor(kept) else now == kept


def _leaves(optimizer) -> list:
    from torch.utils._pytree import tree_leaves

    return tree_leaves(optimizer.state_dict())


def test_bench_muon_counts_the_adapters_matrices(tmp_path):
    """The Muon bench's matrices are the trainers' Muon half (`dit_vram.adapter_matrices`, which
    test_dit_vram checks against injected adapters): LoKR's small w1 factors are AdamW's, XL's
    low-rank w2 pairs count, and each precision's Newton–Schulz error is in its class."""
    muon_bench = _load_bench("muon")

    lokr, lora = muon_bench.SPECS["lokr512"], muon_bench.SPECS["lora64"]
    lokr_shapes = muon_bench.matrix_shapes("2b", lokr)
    assert len(lokr_shapes) == 264 and len(muon_bench.matrix_shapes("2b", lora)) == 528
    assert len(muon_bench.matrix_shapes("2b", lora, layers=2)) == 2 * 528 // 24
    assert min(min(shape) for shape in lokr_shapes) >= 256  # no [4, 4] / [6, 4] w1 in Muon
    assert len(muon_bench.matrix_shapes("xl", lokr)) == 448  # 9728-wide MLP: low-rank w2 pairs
    out = tmp_path / "muon.json"
    args = ["bench", "muon", "--device", "cpu", "--models", "2b", "--adapters", "lora64"]
    args += ["--precisions", "tf32,bfloat16,bfloat16_batched", "--repeat", "1", "--layers", "1"]
    args += ["--out", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    tf32, bf16, batched = json.loads(out.read_text())["rows"]
    # one layer of 24 (`--layers 1`): bf16 matmuls crawl on a CPU without bf16 units
    assert tf32["matrices"] == bf16["matrices"] == batched["matrices"] == 22
    assert tf32["step_ms"] > 0 and not {"error"} & (tf32.keys() | bf16.keys() | batched.keys())
    # Errors are max |x - x_f64| / max |x_f64| after 5 Newton-Schulz steps (3 matmuls each, K up to
    # 6144). float32 ("tf32" is float32 off CUDA): u sqrt(K) ~ 5e-6 per matmul (u = eps_f32 / 2)
    # over 15 matmuls of gain ~1 stays under 1e-4. bf16 (u = 2^-8): rounding the bf16 result
    # alone moves its largest entries by up to 2^-9..2^-8 (> 1e-3: a float32 path would fail),
    # and <= 3 bf16 roundings per step, carried on by the quintic with gains of O(1), stay under
    # ~25 u ~ 0.1; both bf16 paths share that bound (the per-slab float32 norm saves one rounding
    # of ~16).
    assert 1e-3 < batched["ns_max_rel_error"] < 0.1  # bf16 stacks, per-slab float32 norm
    assert tf32["ns_max_rel_error"] < 1e-4  # the CPU's "tf32" is float32
    assert 1e-3 < bf16["ns_max_rel_error"] < 0.1  # torch's bf16 iteration


def test_a_scripts_refusal_reaches_the_user(tmp_path, capsys):
    from hotstep_ray.cli.bench_cmd import run_script

    script = tmp_path / "refuses_bench.py"
    script.write_text('raise SystemExit("--this needs a GPU")\n')
    assert run_script(script, []) == 1
    assert "--this needs a GPU" in capsys.readouterr().err


def test_bench_padded_songs_take_the_masked_paths(tmp_path):
    dit_bench = _load_bench("dit")
    padded = dit_bench.synthetic_cache(16, 42, padded=True).songs
    tokens = dit_bench.CONDITION_TOKENS
    assert [song.target.shape[0] for song in padded[:4]] == [42, 28, 42, 28]
    assert [int(song.condition_mask.sum()) for song in padded[:2]] == [tokens - 256, tokens - 128]
    assert all(bool(song.condition_mask.all()) for song in dit_bench.synthetic_cache(16, 40).songs)
    out = tmp_path / "padded.json"
    args = ["bench", "dit", "--tiny", "--device", "cpu", "--models", "2b", "--adapters", "lora64"]
    args += ["--batches", "2", "--steps", "1", "--warmup", "0"]
    result = runner.invoke(app, [*args, "--padded-frames", "42", "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["rows"]
    # the tiny model's crops: 32 inside both songs (28 in the short one), 64 past them, where
    # the 28-frame song pads to the 42-frame one; audio-s/s counts the real frames
    assert [(row["crop"], row["batch"]) for row in rows] == [(32, 2), (64, 2)]
    assert [row["frames"] for row in rows] == [32 + 28, 42 + 28]
    assert all(row["finite"] for row in rows)
