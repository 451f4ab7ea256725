"""The LM recipe end to end on the tiny LM: learning, resume, export, generation, identity, Ray."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from hotstep_ray.core.contracts import TrainLmOptions
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.events import EventLog
from hotstep_ray.core.storage import Storage
from hotstep_ray.models import lm_tokenizer, prompts
from hotstep_ray.models.text_models import load_lm
from hotstep_ray.models.tiny_tree import write_tiny_lm
from hotstep_ray.training import adapters, export, lm, lm_save, lm_setup, lm_spec, lm_start
from hotstep_ray.training import lm_data as D

CODES_KEY = "tensors/band/v1/lm_codes.jsonl"
TRIGGER = "zq"


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """The tiny models gain nothing from intra-op threads, and on a busy 2-core box idle threads
    spin-waiting for each other cost more than the work: run these tests on one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Storage]:
    """A tiny LM folder (real tokenizer) whose tied embeddings are scaled up so the 32-wide
    model can actually fit its targets (at N(0, 0.02) its logits span < 1 nat), and a storage
    root holding two short songs' codes."""
    root = tmp_path_factory.mktemp("lm")
    folder = write_tiny_lm(root / "ckpt" / "acestep-5Hz-lm-0.6B", embedding_scale=25)
    storage = Storage(root / "data")
    D.write_lm_codes(storage.local_path(CODES_KEY), D.synthetic_songs(2, 6, seed=5))
    return folder, storage


def make_spec(
    folder: Path, run_key: str = "", engine: dict | None = None, **options
) -> lm_spec.LmTrainSpec:
    given = {  # None = not given (identity fields are then adopted from an init adapter)
        "lm_size": "0.6B",
        "adapter_type": "lora",
        "rank": 8,
        "alpha": 16,
        "optimizer": "muon",
        "learning_rate": 1e-2,
        "grad_accum": 1,
        "loss_on_cot": False,  # codes only: 7 targets per song keep the 217k-wide head cheap
        "init_adapter": "",
        "target_loss": 0,
        "milestone_step": 0,
        **options,
    }
    return lm_spec.LmTrainSpec(
        options=TrainLmOptions(**{k: v for k, v in given.items() if v is not None}),
        lm_dir=str(folder),
        codes_key=CODES_KEY,
        artist="band",
        trigger=TRIGGER,
        engine=lm_spec.LmEngine(**(engine or {})),
        run_key=run_key,
    )


@pytest.fixture(scope="module")
def trained(tiny) -> lm_save.LmRunResult:
    folder, storage = tiny
    spec = make_spec(folder, epochs=30, milestone_step=2.0, milestone_keep=2)
    return lm.run_lm_training(spec, storage)


def test_loss_falls_on_a_memorisable_set(trained, tiny):
    _, storage = tiny
    losses = [row["loss"] for row in trained.log["epochs"]]
    assert len(losses) == 30 and trained.finished
    assert min(losses[-5:]) < 0.5 * losses[0]  # a learning signal; round-off moves it ~1e-6
    assert trained.log["saved_reason"] == "best" and trained.log["saved_loss"] == min(losses)
    assert trained.run_key.startswith("adapters/lm-06b/band/")
    names = {key.rsplit("/", 1)[1] for key in trained.files}
    assert names == {"adapter_config.json", "adapter_model.safetensors", lm_save.LOG_FILE}
    assert not storage.exists(lm_save.checkpoint_key(trained.run_key))  # removed after export
    milestones = trained.log["milestones"]
    assert 1 <= len(milestones) <= 2
    assert all(storage.exists(f"{m['path']}/adapter_model.safetensors") for m in milestones)
    assert export.read_trigger(storage, trained.run_key)["hot_step_trigger"] == TRIGGER


def test_resume_equals_uninterrupted(tiny):
    folder, storage = tiny
    # grad_accum 2 over 3 micro-batches per epoch also covers a short last window
    D.write_lm_codes(
        storage.local_path("tensors/band/v2/lm_codes.jsonl"), D.synthetic_songs(3, [4, 6, 5])
    )
    common = {"epochs": 4, "grad_accum": 2, "milestone_step": 1.0}
    whole = make_spec(folder, "adapters/lm-06b/band/whole", **common)
    part = make_spec(folder, "adapters/lm-06b/band/part", **common)
    whole = whole.model_copy(update={"codes_key": "tensors/band/v2/lm_codes.jsonl"})
    part = part.model_copy(update={"codes_key": "tensors/band/v2/lm_codes.jsonl"})
    straight = lm.run_lm_training(whole, storage)
    first = lm.run_lm_training(part, storage, stop_after_epoch=2)
    assert not first.finished and storage.exists(lm_save.checkpoint_key(part.run_key))
    resumed = lm.run_lm_training(part, storage, resume=True)
    # exact: the same kernels in this process, the checkpoint restores every float32 bit
    assert [r["loss"] for r in resumed.log["epochs"]] == [r["loss"] for r in straight.log["epochs"]]
    assert resumed.log["milestones"] == [
        {**m, "path": m["path"].replace("whole", "part")} for m in straight.log["milestones"]
    ]
    a = load_file(storage.local_path(f"{whole.run_key}/adapter_model.safetensors"))
    b = load_file(storage.local_path(f"{part.run_key}/adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _song_loss(model, tokenizer, song: D.LmSong) -> float:
    example = D.render_example(tokenizer, song, D.RenderOptions(trigger=TRIGGER, loss_on_cot=False))
    ids = torch.tensor([example.input_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
    pred = torch.arange(example.loss_start - 1, example.loss_end - 1)
    return torch.nn.functional.cross_entropy(logits[pred], ids[0, pred + 1]).item()


def test_exported_adapter_loads_in_peft_and_changes_the_logits(trained, tiny):
    from peft import PeftModel

    folder, storage = tiny
    tokenizer = lm_spec.load_tokenizer(folder)
    song = D.load_lm_codes(storage, CODES_KEY)[0][0]
    base = load_lm(folder, device="cpu")
    base_loss = _song_loss(base, tokenizer, song)
    ids = torch.tensor([D.render_example(tokenizer, song).input_ids])
    with torch.no_grad():
        base_logits = base(input_ids=ids).logits
    tuned = PeftModel.from_pretrained(
        load_lm(folder, device="cpu"), storage.local_path(trained.run_key)
    )
    with torch.no_grad():
        tuned_logits = tuned(input_ids=ids).logits
    assert (tuned_logits - base_logits).abs().max() > 1.0  # the adapter's effect, not round-off
    # the PEFT-loaded adapter is the trained one: it predicts the song's codes as training saw
    tuned_loss = _song_loss(tuned, tokenizer, song)
    assert tuned_loss < 0.5 * base_loss  # a learning signal, as above


def test_generation_with_the_adapter_emits_only_code_tokens_after_think(trained, tiny):
    from peft import PeftModel

    folder, storage = tiny
    tokenizer = lm_spec.load_tokenizer(folder)
    song = D.load_lm_codes(storage, CODES_KEY)[0][1]
    caption = D.song_caption(song, TRIGGER)
    cot = prompts.format_cot(D.cot_metadata(song, caption))
    lyrics = prompts.normalize_lyrics(song.lyrics, song.instrumental)
    prompt = prompts.build_lm_phase2_prompt(tokenizer, caption, lyrics, cot)
    assert prompt.endswith("</think>\n\n")
    ids = torch.tensor([tokenizer(prompt, add_special_tokens=False)["input_ids"]])
    model = PeftModel.from_pretrained(
        load_lm(folder, device="cpu"), storage.local_path(trained.run_key)
    )
    n = len(song.codes)
    processor = D.CodesOnlyLogitsProcessor(ids.shape[1], min_codes=n, max_codes=n)
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=n + 3,
        do_sample=False,
        logits_processor=[processor],
        pad_token_id=lm_tokenizer.PAD_ID,
        eos_token_id=lm_tokenizer.IM_END_ID,
    )
    new = out[0, ids.shape[1] :].tolist()
    assert new[-1] == lm_tokenizer.IM_END_ID and len(new) == n + 1
    assert all(
        lm_tokenizer.AUDIO_CODE_BASE_ID <= t < lm_tokenizer.AUDIO_CODE_BASE_ID + 64000
        for t in new[:-1]
    )
    text = tokenizer.decode(out[0], skip_special_tokens=False)
    after = text.split("</think>", 1)[1]
    assert (
        after
        == "\n\n"
        + lm_tokenizer.audio_codes_text(lm_tokenizer.audio_codes_from_ids(new))
        + "<|im_end|>"
    )


def test_identity_mismatch_on_init_adapter_is_refused(trained, tiny):
    folder, storage = tiny
    source = trained.run_key
    # not given: adopted from the source run (lora r8, alpha 16)
    adopted = lm_setup.setup_lm(make_spec(folder, init_adapter=source, rank=None), storage)
    assert adopted.options.rank == 8 and adopted.identity.rank == 8
    assert adopted.init_from["url"].endswith(source)
    # given and contradicting: refused with the reason
    with pytest.raises(InputError, match="rank 8 vs 16"):
        lm_setup.setup_lm(make_spec(folder, init_adapter=source, rank=16), storage)
    with pytest.raises(InputError, match="adapter type lora vs lokr"):
        lm_setup.setup_lm(
            make_spec(folder, init_adapter=source, adapter_type="lokr", lokr_factor=4), storage
        )
    other_size = lm_start.AdapterIdentity(hidden=1024, layers=28, kind="lora", rank=8, size="0.6B")
    mine = lm_start.AdapterIdentity(hidden=2560, layers=36, kind="lora", rank=8, size="4B")
    with pytest.raises(InputError, match="base LM 0.6B vs 4B"):
        lm_start.check_identity(other_size, mine, "somewhere")


def test_lokr_run_exports_lycoris_and_is_continued_with_its_shape(tiny):
    folder, storage = tiny
    lokr = {"adapter_type": "lokr", "lokr_dim": 4, "lokr_alpha": 4, "lokr_factor": 4}
    spec = make_spec(folder, "adapters/lm-06b/band/lokr", epochs=2, **lokr)
    result = lm.run_lm_training(spec, storage)
    assert [k.rsplit("/", 1)[1] for k in result.files] == [
        "lokr_weights.safetensors",
        lm_save.LOG_FILE,
    ]
    kind, tensors, meta = export.read_adapter_file(storage, spec.run_key)
    assert kind == "lokr" and meta["format"] == "lycoris" and meta["algo"] == "lokr"
    assert json.loads(meta["lokr_config"])["linear_dim"] == 4
    assert all(k.startswith("lycoris_model_layers_") for k in tensors)
    assert all(t.dtype == torch.bfloat16 for t in tensors.values())
    assert meta["hot_step_trigger"] == TRIGGER and meta["hot_step_lm_trainer"] == "v1"
    again = lm_setup.setup_lm(
        make_spec(folder, init_adapter=spec.run_key, adapter_type=None), storage
    )
    assert again.identity == lm_start.AdapterIdentity(32, 2, "lokr", 4, 4, "0.6B")


def test_no_epoch_is_best_before_a_step_has_changed_the_weights(tiny):
    """lr(0) = 0: the first step leaves LoRA's B at zero, so its epoch's loss is the base model's
    and must not be kept as the "best" adapter; a run with no other step exports its adapter as
    "final" and says it never changed."""
    folder, storage = tiny
    one_step = {"grad_accum": 2}  # the two songs make one optimizer step per epoch
    spec = make_spec(folder, "adapters/lm-06b/band/lr0", epochs=3, **one_step)
    setup = lm_setup.setup_lm(spec, storage)
    state = lm.train_lm(setup)
    assert setup.schedule.factor(0) == 0 and state.step == 3
    assert state.saved_reason == "best" and state.best_epoch >= 2

    messages: list[str] = []
    events = EventLog(lambda event: messages.append(getattr(event, "message", "")))
    spec = make_spec(folder, "adapters/lm-06b/band/lr0-only", epochs=3, **one_step)
    setup = lm_setup.setup_lm(spec, storage, events=events)
    state = lm.train_lm(setup, stop_after_epoch=1)  # stopped after its lr(0) step
    assert state.step == 1 and not state.saved_state  # nothing was ever "best"
    result = lm_save.save_lm(setup, state)
    assert result.log["saved_reason"] == "final"
    assert any("the adapter never changed" in message for message in messages)


def test_a_non_finite_gradient_stops_before_the_step(tiny):
    folder, storage = tiny
    setup = lm_setup.setup_lm(make_spec(folder, "adapters/lm-06b/band/nan", epochs=5), storage)
    key, poisoned = next(iter(adapters.adapter_parameters(setup.model).items()))
    with torch.no_grad():
        poisoned.fill_(float("nan"))
    before = {k: v.clone() for k, v in adapters.adapter_state_dict(setup.model).items()}
    state = lm.train_lm(setup)
    assert state.stop_reason == "non_finite" and state.epoch == 1 and not state.saved_state
    after = adapters.adapter_state_dict(setup.model)
    assert all(torch.equal(after[k], before[k]) for k in before if k != key)  # no step was taken
    with pytest.raises(InputError, match="no finite epoch"):
        lm_save.save_lm(setup, state)


def test_cli_trains_and_writes_the_run(tiny):
    from hotstep_ray.cli.train_lm_cmd import app

    folder, storage = tiny
    args = [
        "run", "band", "--data", storage.url, "--checkpoints", str(folder.parent),
        "--size", "0.6B", "--variant", "v1", "--epochs", "2", "--adapter-type", "lora", "--rank", "4",
        "--no-loss-on-cot", "--init-adapter", "", "--artist", "cli-band", "--json",
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    log = json.loads(result.output[result.output.index("{") :])
    assert log["epochs_run"] == 2 and log["config"]["rank"] == 4
    assert log["config"]["epochs"] == 2 and log["config"]["target_loss"] == 4.0  # recipe default
    run = storage.list("adapters/lm-06b/cli-band")
    assert len(run) == 1 and storage.exists(f"{run[0]}/adapter_model.safetensors")
    bad = CliRunner().invoke(app, [*args, "--adapter-type", "nope"])
    assert bad.exit_code == 2


@pytest.mark.slow
@pytest.mark.ray
def test_a_ray_job_continues_an_interrupted_run(ray_session, tiny):
    """`resume` on Ray: the job starts from the run folder's checkpoint (options included)
    and ends where the same run, never interrupted, ends; the spent checkpoint goes."""
    from hotstep_ray.training.ray_lm import run_lm_on_ray

    folder, storage = tiny
    whole = make_spec(folder, "adapters/lm-06b/band/ray-whole", epochs=3)
    part = make_spec(folder, "adapters/lm-06b/band/ray-part", epochs=3)
    straight = lm.run_lm_training(whole, storage)
    assert not lm.run_lm_training(part, storage, stop_after_epoch=1).finished
    # this request's options differ; the checkpoint's (3 epochs) are the ones that continue
    asked = part.model_copy(update={"options": part.options.model_copy(update={"epochs": 9})})
    resumed = run_lm_on_ray(asked, storage, use_gpu=False, max_failures=0, resume=True)
    assert resumed.finished and [r["epoch"] for r in resumed.log["epochs"]] == [1, 2, 3]
    # the same computation on this host (Ray's CPU worker: one thread, the same kernels); the
    # slack covers a worker whose allocations align differently (MKL may then round otherwise)
    assert [r["loss"] for r in resumed.log["epochs"]] == pytest.approx(
        [r["loss"] for r in straight.log["epochs"]], rel=1e-5
    )
    assert not storage.exists(lm_save.checkpoint_key(part.run_key))
    with pytest.raises(InputError, match="no training checkpoint"):
        run_lm_on_ray(part, storage, use_gpu=False, max_failures=0, resume=True)


@pytest.mark.slow
@pytest.mark.ray
def test_ray_train_job_survives_a_worker_failure(ray_session, tiny):
    from hotstep_ray.training.ray_lm import run_lm_on_ray

    folder, storage = tiny
    spec = make_spec(folder, epochs=3)
    spec = spec.model_copy(update={"artist": "ray-band", "events_key": "jobs/ray-lm/events.jsonl"})
    result = run_lm_on_ray(
        spec, storage, num_workers=1, use_gpu=False, max_failures=1, fail_after_epoch=1
    )
    assert result.finished and result.log["epochs_run"] == 3
    assert [r["epoch"] for r in result.log["epochs"]] == [1, 2, 3]
    assert any(k.endswith("adapter_model.safetensors") for k in result.files)
    events = storage.read_text("jobs/ray-lm/events.jsonl")
    assert "resumed after a failure at epoch 1" in events


def test_the_checkpoint_names_the_job_that_trains_the_run(tiny):
    """`adapters list` tells a live LM run from a killed one by the job its checkpoint names."""
    from hotstep_ray.studio.adapter_runs import read_lm_progress

    folder, storage = tiny
    spec = make_spec(folder, "adapters/lm-06b/band/live", epochs=2).model_copy(
        update={"job_id": "job-7"}
    )
    setup = lm_setup.setup_lm(spec, storage)
    state = lm.train_lm(setup, stop_after_epoch=1)
    lm_save.save_state(setup, state, storage, lm_save.checkpoint_key(spec.run_key))
    assert read_lm_progress(storage, spec.run_key).job_id == "job-7"
