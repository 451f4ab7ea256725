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


def test_bench_muon_counts_the_adapters_matrices(tmp_path, monkeypatch):
    """The Muon bench's shapes are the trainer's: LoKR 512 and LoRA r64 on the 2B DiT have the
    VRAM model's parameter counts (less the tiny w1 factors, which AdamW takes)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("muon_bench", bench_cmd.script_for("muon"))
    muon_bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(muon_bench)

    from hotstep_ray.models import full_configs as fc
    from hotstep_ray.training import dit_vram

    dims = dit_vram.DitDims.from_config(fc.dit_config("2b"))
    lokr, lora = muon_bench.SPECS["lokr512"], muon_bench.SPECS["lora64"]
    lokr_shapes = muon_bench.matrix_shapes("2b", lokr)
    lora_shapes = muon_bench.matrix_shapes("2b", lora)
    assert len(lokr_shapes) == 264 and len(lora_shapes) == 528
    w1 = 24 * (4 * 4 * 8 + 6 * 4 * 2 + 4 * 6)  # [4, 4] attention, [6, 4] gate/up, [4, 6] down
    assert sum(a * b for a, b in lokr_shapes) + w1 == dit_vram.adapter_params(dims, lokr, 24)
    assert sum(a * b for a, b in lora_shapes) == dit_vram.adapter_params(dims, lora, 24)
    out = tmp_path / "muon.json"
    args = ["bench", "muon", "--device", "cpu", "--models", "2b", "--adapters", "lora64"]
    result = runner.invoke(app, [*args, "--precisions", "tf32", "--repeat", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(out.read_text())["rows"]
    assert row["matrices"] == 528 and row["step_ms"] > 0
    assert row["ns_max_rel_error"] < 1e-4  # the CPU's "tf32" is float32
