"""`hotstep-ray train-dit run` in-process (--no-ray) on the tiny DiT."""

from __future__ import annotations

import json
import os

import pytest
import typer
from test_dit_support import (  # noqa: F401  (fixtures)
    SLUG,
    read_log,
    single_thread_fixture,
    tiny_dit_dir_fixture,
    write_cache,
)
from typer.testing import CliRunner

from hotstep_ray.cli.train_dit_cmd import _by_adapter, app, build_options
from hotstep_ray.core.contracts import TrainDitOptions
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage
from hotstep_ray.training import dit_data


def test_every_contract_field_is_an_option() -> None:
    options = build_options(
        "turbo", {"rank": "8", "learning_rate": "5e-4", "stages": "train", "target_mlp": False}
    )
    assert (options.rank, options.learning_rate, options.stages) == (8, 5e-4, ["train"])
    assert options.target_mlp is False and options.variant_key == "turbo"
    help_text = (
        CliRunner()
        .invoke(app, ["run", "--help"], terminal_width=200, env={"COLUMNS": "200"})
        .output
    )
    for flag in ("--lokr-factor", "--no-target-mlp", "--crop-min-frames", "--ray", "--variant"):
        assert flag in help_text
    # unset fields resolve by adapter type; the help says to what, not "None"
    assert help_text.count("Default: by adapter") == 3 and "Default: None" not in help_text
    assert _by_adapter("effective_learning_rate") == "lokr 0.002, lora 0.0005"


def test_compile_reaches_the_contract() -> None:
    """A CLI-only `--compile` once shadowed the contract's, so its value never reached training
    (tests/test_cli_flags.py now refuses any flag declared twice)."""
    command = typer.main.get_command(app).commands["run"]
    context = command.make_context("run", [SLUG, "--variant", "turbo", "--compile", "off"])
    contract = {k: v for k, v in context.params.items() if k in TrainDitOptions.model_fields}
    assert build_options("turbo", contract).compile == "off"


def test_cli_trains_and_exports(tmp_path, tiny_dit_dir, single_thread) -> None:
    storage = Storage(tmp_path / "data")
    write_cache(storage)
    # `train-dit SLUG ...` is `train-dit run SLUG ...` (cli.common.RunByDefault)
    args = [SLUG, "--data", str(tmp_path / "data"), "--checkpoints", str(tiny_dit_dir)]
    args += ["--no-ray", "--json", "--adapter-type", "lokr"]  # the only cache: turbo
    args += ["--lokr-dim", "8", "--lokr-factor", "4", "--epochs", "3", "--crop-frames", "48"]
    args += ["--init-adapter", "", "--optimizer", "adamw", "--trigger", "zqx", "--artist", "cli"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output[result.output.index("{") :])
    assert summary["stop_reason"] == "epochs" and summary["epochs_run"] == 3
    assert summary["variant"] == "turbo"  # chosen: the only cache
    run_key = storage.key_of(summary["run"])
    assert run_key.startswith("adapters/dit-turbo/cli/")
    assert storage.exists(f"{run_key}/lokr_weights.safetensors")
    assert read_log(storage, run_key)["config"]["trigger"] == "zqx"
    assert storage.exists(f"jobs/{summary['job']}/events.jsonl")
    bad = CliRunner().invoke(app, ["run", *args[:-2], "--artist", "cli", "--batch", "99"])
    assert bad.exit_code == 2 and "batch" in bad.output


def test_a_paused_run_prints_how_to_continue_and_continues(
    tmp_path, tiny_dit_dir, single_thread
) -> None:
    write_cache(Storage(tmp_path / "data"))
    args = [SLUG, "--data", str(tmp_path / "data"), "--checkpoints", str(tiny_dit_dir), "--no-ray"]
    args += ["--rank", "4", "--alpha", "8", "--epochs", "2", "--crop-frames", "48"]
    args += ["--init-adapter", "", "--optimizer", "adamw", "--batch", "1", "--grad-accum", "1"]
    paused = CliRunner().invoke(app, [*args, "--max-steps", "2"])
    assert paused.exit_code == 0, paused.output
    line = next(x for x in paused.output.splitlines() if x.startswith("paused: continue with"))
    flags = line.split("continue with ", 1)[1].split()
    assert flags[0] == "--resume" and len(flags) == 2  # the run folder: it finds the checkpoint
    run_key = flags[1]
    result = CliRunner().invoke(app, [*args, *flags, "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output[result.output.index("{") :])
    assert summary["run_key"] == run_key and summary["stop_reason"] == "epochs"
    log = read_log(Storage(tmp_path / "data"), run_key)
    assert log["resumes"] == [{"step": 2, "epoch": 1}] and log["steps"] == 6


def test_requests_that_would_lose_or_fake_a_run_are_refused(
    tmp_path, tiny_dit_dir, single_thread
) -> None:
    storage = Storage(tmp_path / "data")
    write_cache(storage)
    args = [SLUG, "--data", str(tmp_path / "data"), "--checkpoints", str(tiny_dit_dir), "--no-ray"]
    args += ["--rank", "4", "--alpha", "8", "--epochs", "1", "--crop-frames", "48", "--json"]
    args += ["--init-adapter", "", "--optimizer", "adamw", "--artist", "keep"]
    args += ["--adapter-type", "lora"]  # the LoKR case below gives its own (the last one wins)
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    run_key = json.loads(first.output[first.output.index("{") :])["run_key"]
    adapter = storage.read_bytes(f"{run_key}/adapter_model.safetensors")
    # training from scratch into that folder again would replace its adapter and log
    again = CliRunner().invoke(app, [*args, "--run-key", run_key])
    assert again.exit_code != 0 and "already holds a run" in again.output
    assert storage.read_bytes(f"{run_key}/adapter_model.safetensors") == adapter
    replaced = CliRunner().invoke(app, [*args, "--run-key", run_key, "--overwrite"])
    assert replaced.exit_code == 0, replaced.output
    # an export stage with nothing trained or loaded would publish a random adapter
    export_only = CliRunner().invoke(app, [*args, "--stages", "export"])
    assert export_only.exit_code != 0 and "nothing was loaded" in export_only.output
    # LoKR has no dropout: the value is refused, not dropped
    lokr = CliRunner().invoke(app, [*args, "--adapter-type", "lokr", "--lora-dropout", "0.1"])
    assert lokr.exit_code != 0 and "a LoKR adapter has none" in lokr.output
    assert [key.rsplit("/", 1)[-1] for key in storage.list("adapters/dit-turbo/keep")] == [
        run_key.rsplit("/", 1)[-1]
    ]  # no refused request left a folder behind


def test_the_variant_defaults_to_the_newest_cache(tmp_path) -> None:
    """As train-lm and the studio choose: the variant whose songs were written last."""
    storage = Storage(tmp_path / "data")
    with pytest.raises(InputError, match="no tensor cache .* preprocess band"):
        dit_data.pick_variant(storage, SLUG, None)
    for variant, stamp in (("turbo", 2_000_000_000), ("base", 1_000_000_000)):
        write_cache(storage, variant=variant)
        for song in (tmp_path / "data" / "tensors" / SLUG / variant).glob("*.safetensors"):
            os.utime(song, (stamp, stamp))
    storage.write_text(f"tensors/{SLUG}/empty/notes.txt", "no songs here")  # newest, but no songs
    for other in (".old", "mm3-sampled-s42"):  # hidden; another model's cache (newer still)
        write_cache(storage, variant="turbo")
        source = tmp_path / "data" / "tensors" / SLUG / "turbo"
        (source.parent / other).mkdir()
        for song in source.glob("*.safetensors"):
            (source.parent / other / song.name).write_bytes(song.read_bytes())
            os.utime(source.parent / other / song.name, (4e9, 4e9))  # the newest songs
    storage.write_json(f"tensors/{SLUG}/mm3-sampled-s42/mm3_cache.json", {"kind": "mm3"})
    for song in (tmp_path / "data" / "tensors" / SLUG / "turbo").glob("*.safetensors"):
        os.utime(song, (2_000_000_000, 2_000_000_000))
    assert sorted(dit_data.cached_variants(storage, SLUG)) == ["base", "turbo"]
    assert dit_data.pick_variant(storage, SLUG, None) == "turbo"
    assert dit_data.pick_variant(storage, SLUG, "base") == "base"
    os.utime(next((tmp_path / "data/tensors" / SLUG / "base").glob("*.safetensors")), (3e9, 3e9))
    assert dit_data.pick_variant(storage, SLUG, None) == "base"
