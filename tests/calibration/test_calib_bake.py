"""Baking a scale into adapter files, and the `<run>-calibrated/` folder rules."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hotstep_ray.calibration import bake, runs
from hotstep_ray.core import layout
from hotstep_ray.core.storage import Storage
from hotstep_ray.training import adapters, export

RUN = "adapters/lm-06b/band/2026-01-02_03-04-05"


class Toy(nn.Module):
    """Two blocks named like Qwen3 layers (`layers.N.self_attn.q_proj`, `mlp.up_proj`)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList()
        for _ in range(2):
            block = nn.Module()
            block.self_attn = nn.Module()
            block.self_attn.q_proj = nn.Linear(12, 12, bias=False)
            block.mlp = nn.Module()
            block.mlp.up_proj = nn.Linear(12, 24, bias=False)
            self.layers.append(block)


def _trained(kind: str, seed: int = 1) -> nn.Module:
    model = Toy()
    spec = adapters.AdapterSpec(
        kind=kind,
        rank=4,
        alpha=8,
        targets=("q_proj", "up_proj"),
        factor=2 if kind == "lokr" else -1,
    )
    adapters.inject(model, spec)
    generator = torch.Generator().manual_seed(seed)
    for param in adapters.adapter_parameters(model).values():
        param.data = 0.3 * torch.randn(param.shape, generator=generator)
    return model


def _deltas(storage: Storage, key: str, scale: float = 1.0) -> dict[str, torch.Tensor]:
    model = Toy()
    export.load_exported(model, storage, key)
    adapters.set_scale(model, scale)
    return adapters.delta_weights(model)


@pytest.mark.parametrize("kind", ["lora", "lokr"])
def test_baked_scale_reproduces_the_scaled_delta(tmp_path, kind):
    storage = Storage(tmp_path)
    export.export_adapter(_trained(kind), storage, "src", trigger="bandx")
    bake.bake_adapter(storage, "src", "out", 0.75, metadata={"hot_step_calibrated": "v1"})
    want, got = _deltas(storage, "src", 0.75), _deltas(storage, "out")
    assert set(want) == set(got)
    # The baked file rounds the scaled factor to BF16 once more: <= 2^-8 = 3.9e-3 relative per
    # element (8-bit significand, round to nearest). LoKR's w1 (x) w2 has at most that norm-wise
    # error; in LoRA's B A the per-element errors (random signs) average to under half of it. The
    # float32 products add ~1e-7, so the bound does not depend on the CPU.
    for path in want:
        error = (got[path] - want[path]).norm() / want[path].norm()
        assert error < 5e-3, path
    _, _, meta = export.read_adapter_file(storage, "out")
    assert meta["hot_step_calibrated"] == "v1" and meta["hot_step_trigger"] == "bandx"
    if kind == "lora":
        assert storage.exists("out/adapter_config.json")


def test_bake_adds_the_runs_trigger_when_the_source_has_none(tmp_path):
    storage = Storage(tmp_path)
    export.export_adapter(_trained("lora"), storage, "src")
    bake.bake_adapter(storage, "src", "out", 1.0, trigger=("bandx", "append"))
    assert export.read_trigger(storage, "out")["hot_step_trigger_position"] == "append"


def _run(storage: Storage) -> runs.RunInfo:
    export.export_adapter(_trained("lora"), storage, RUN)
    export.export_adapter(_trained("lora", 2), storage, f"{RUN}/milestones/loss_3")
    storage.write_json(f"{RUN}/lm_train_log.json", {"config": {"lm_size": "0.6B"}})
    return runs.read_run(storage, RUN)


def test_calibrated_folder_layout_and_resume_rules(tmp_path):
    storage = Storage(tmp_path)
    run = _run(storage)
    assert [c.name for c in run.candidates] == ["final", "loss_3"]
    assert run.candidates[1].loss == 3.0 and run.lm_size == "0.6B"
    winner = {"candidate": "loss_3", "key": f"{RUN}/milestones/loss_3", "scale": 1.25, "score": 0.1}
    folder = bake.write_calibrated(storage, run, {"grid": []}, winner)
    assert folder.key == f"{RUN}-calibrated" == folder.weights_key
    assert storage.read_json(folder.eval_key)["baked"]["scale"] == 1.25
    assert storage.exists(f"{RUN}-calibrated/lm_train_log.json")
    artist = "adapters/lm-06b/band"
    assert layout.latest_run_dir(storage, artist, skip_calibrated=True) == RUN  # never resumed
    assert layout.latest_run_dir(storage, artist) == folder.key  # repointed: what `latest` is
    with pytest.raises(Exception, match="calibrated"):
        runs.read_run(storage, folder.key)


def test_no_repoint_keeps_the_artist_on_the_run_and_no_winner_writes_only_the_report(tmp_path):
    storage = Storage(tmp_path)
    run = _run(storage)
    winner = {"candidate": "final", "key": RUN, "scale": 0.5, "score": 0.2}
    folder = bake.write_calibrated(storage, run, {}, winner, repoint=False)
    assert folder.weights_key == f"{RUN}-calibrated/baked"
    assert layout.has_weights(storage, folder.weights_key)
    assert layout.latest_run_dir(storage, "adapters/lm-06b/band") == RUN
    empty = bake.write_calibrated(storage, run, {}, None)  # replaces the folder
    assert not empty.weights_key and not layout.has_weights(storage, empty.key)
    assert not storage.exists(f"{empty.key}/baked")
    assert storage.read_json(empty.eval_key)["baked"] is None
