"""End to end on the tiny tree: 2 milestones (PEFT LoRA folders, different nonzero weights) x 2
scales, a dataset constructed so one grid point must win, the calibrated folder, the CLI."""

from __future__ import annotations

from dataclasses import replace

import pytest
from typer.testing import CliRunner

from hotstep_ray.audition.schemas import LmSampling
from hotstep_ray.calibration.grid import WorkItem
from hotstep_ray.calibration.lm_calibrate import (
    LmCalibrationConfig,
    LmWorker,
    calibrate_lm,
    lm_requests,
)
from hotstep_ray.calibration.prompts import song_prompts
from hotstep_ray.core import layout
from hotstep_ray.core.events import EventLog, MetricEvent, ProgressEvent
from hotstep_ray.core.storage import Storage
from hotstep_ray.training import lm_data

RUN = "adapters/lm-06b/band/2026-01-02_03-04-05"
CODES = "tensors/band/v1/lm_codes.jsonl"
WINNER = ("loss_3", 0.5)  # the grid point the dataset is made from
# duration 4 s = 20 codes per generation: below the 25-code memorisation limit, so the winner's
# exact reproductions of the dataset stay eligible. top_k 8: the tiny LM's logits are nearly
# flat, so without it the sampler's race ignores the weights and every adapter looks alike.
CONFIG = LmCalibrationConfig(
    scales=(0.5, 1.0),
    seeds=6,
    duration_s=4,
    sampling=LmSampling(top_k=8),
    include_final=False,
)


@pytest.fixture(scope="module")
def dataset(lm_tree, planner, write_lm_lora, tmp_path_factory):
    """A run with its own adapter and milestones loss_2 / loss_3; the dataset's six songs carry
    exactly the codes milestone loss_3 generates at scale 0.5 for their own prompts and seeds."""
    root = tmp_path_factory.mktemp("calib-data")
    storage = Storage(root)
    write_lm_lora(lm_tree, root / RUN, seed=1)
    write_lm_lora(lm_tree, root / RUN / "milestones" / "loss_2", seed=2)
    write_lm_lora(lm_tree, root / RUN / "milestones" / "loss_3", seed=3)
    songs = lm_data.synthetic_songs(6, 30)
    prompts = song_prompts(songs, CONFIG.seeds, CONFIG.base_seed)
    requests = tuple(lm_requests(prompts, CONFIG))
    key = f"{RUN}/milestones/{WINNER[0]}"
    made = LmWorker(planner, storage)(WorkItem(0, WINNER[0], key, WINNER[1], requests)).outputs
    codes = {p.song: tuple(c) for p, c in zip(prompts, made, strict=True)}
    lm_data.write_lm_codes(root / CODES, [replace(s, codes=codes[s.song_id]) for s in songs])
    log = {
        "config": {"lm_size": "0.6B", "codes": storage.url_of(CODES)},
        "milestones": [{"name": "loss_2", "epoch": 4, "loss": 1.9, "path": ""}],
    }
    storage.write_json(f"{RUN}/lm_train_log.json", log)
    return storage


@pytest.fixture(scope="module")
def outcome(dataset, planner):
    events: list = []
    result = calibrate_lm(
        dataset,
        RUN,
        worker=lambda: LmWorker(planner, dataset),
        config=CONFIG,
        events=EventLog(events.append),
    )
    return result, events


def test_the_constructed_grid_point_wins_with_score_zero(outcome):
    result, events = outcome
    rows = {(r["candidate"], r["scale"]): r for r in result.rows}
    assert set(rows) == {("base", 0.0), ("loss_2", 0.5), ("loss_2", 1.0), ("loss_3", 0.5),
                         ("loss_3", 1.0)}  # fmt: skip
    assert (result.winner["candidate"], result.winner["scale"]) == WINNER
    # Exact: the winner regenerates the dataset's codes in this process (same prompts, seeds and
    # kernels), and JS of identical histograms is 0.0 (test_calib_metrics); any other code
    # histogram scores > 0.
    assert rows[WINNER]["score"] == 0.0 and rows[WINNER]["eligible"]
    assert all(r["score"] > 0 for k, r in rows.items() if k != WINNER)
    assert rows[WINNER]["memorisation"]["longest_codes"] == 20  # whole songs, all under 5 s
    assert all(r["length"]["ratio"] == 1.0 for r in rows.values())
    evals = [e for e in events if isinstance(e, MetricEvent) and e.metric == "eval"]
    assert len(evals) == 5 and sum(e.model_extra["winner"] for e in evals) == 1
    progress = [e for e in events if isinstance(e, ProgressEvent)]
    assert [p.done for p in progress] == [1, 2, 3, 4, 5] and progress[-1].total == 5


def test_calibrated_folder_holds_the_report_and_the_baked_winner(outcome, dataset):
    result, _ = outcome
    folder = f"{RUN}-calibrated"
    assert result.folder.key == result.folder.weights_key == folder
    doc = dataset.read_json(f"{folder}/hot_step_eval.json")
    assert doc["format"] == "hot-step-eval-v1" and doc["kind"] == "lm" and doc["run"] == RUN
    assert doc["seeds"] == list(range(1234, 1240)) and len(doc["grid"]) == 4
    assert doc["base"]["candidate"] == "base" and doc["config"]["scales"] == [0.5, 1.0]
    assert doc["winner"]["candidate"] == "loss_3" and doc["baked"]["scale"] == 0.5
    assert {c["name"]: c["epoch"] for c in doc["candidates"]} == {"loss_2": 4, "loss_3": None}
    assert layout.has_weights(dataset, folder) and dataset.exists(f"{folder}/adapter_config.json")
    assert layout.latest_run_dir(dataset, "adapters/lm-06b/band", skip_calibrated=True) == RUN
    assert layout.latest_run_dir(dataset, "adapters/lm-06b/band") == folder


def test_the_baked_adapter_at_scale_one_generates_the_winners_codes(outcome, dataset, planner):
    result, _ = outcome
    requests = tuple(lm_requests(song_prompts(lm_data.synthetic_songs(6, 30), 6, 1234), CONFIG))
    baked = LmWorker(planner, dataset)(WorkItem(0, "baked", f"{RUN}-calibrated", 1.0, requests))
    winner = next(r for r in result.rows if (r["candidate"], r["scale"]) == WINNER)
    # Bit-identical codes: the winner's scale 0.5 is a power of two, so folding it into lora_B is
    # exact in any float format, and both decodes run in this process on the same kernels.
    assert baked.receipts == winner["codes_sha1"]


def test_holdout_loss_of_the_tiny_lm_through_the_trainers_loss(planner):
    from hotstep_ray.training.holdout import HoldoutEval, lm_song_losses

    songs = lm_data.synthetic_songs(2, 12)
    examples, _ = lm_data.build_examples(planner.tokenizer, songs, 0)
    events: list = []
    evaluator = HoldoutEval(lm_song_losses(examples), songs=2, events=EventLog(events.append))
    loss = evaluator(1, planner.base.model)
    assert loss is not None and 5.0 < loss < 20.0  # ~ln(217,204) = 12.3 for a random LM
    assert events[0].metric == "eval" and events[0].loss == loss and events[0].epoch == 1


def test_cli_calibrates_the_run_from_its_log(outcome, dataset, lm_tree):
    from hotstep_ray.cli.calibrate_cmd import app

    args = ["run", str(dataset.local_path(RUN)), "--data", dataset.url, "--checkpoints",
            str(lm_tree), "--scales", "0.5,1.0", "--seeds", "2", "--duration", "4", "--top-k", "8",
            "--cfg-scale", "1", "--device", "cpu", "--max-batch", "2"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "calibrated:" in result.output
    doc = dataset.read_json(f"{RUN}-calibrated/hot_step_eval.json")
    assert doc["config"]["seeds"] == 2 and doc["config"]["sampling"]["cfg_scale"] == 1.0
    assert doc["config"]["max_batch"] == 2
    assert len(doc["grid"]) == 6  # the CLI keeps the run's own adapter: 3 candidates x 2
    assert doc["dataset"]["codes"] == CODES and doc["winner"] is not None
