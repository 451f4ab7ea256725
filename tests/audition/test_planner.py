"""Planner LM: constrained codes, seeds, phase 1, adapters, sampling, decode engines."""

from __future__ import annotations

import pytest
import torch

from hotstep_ray.audition.errors import NotFoundError
from hotstep_ray.audition.lm_decode import Sampling, combine_cfg, sample_token
from hotstep_ray.audition.planner import PlannerLM
from hotstep_ray.audition.schemas import LmRequest
from hotstep_ray.core.errors import InputError
from hotstep_ray.models.lm_tokenizer import AUDIO_CODE_BASE_ID, IM_END_ID

# All metas pinned (no phase 1). top_k: the tiny LM's logits are nearly flat over 64,000 codes,
# so with one seed the exponential race picks the same code whatever the weights; restricting to
# the model's own top 8 makes its ranking (and so the adapter) decide.
# All metas pinned (no phase 1). top_k: the tiny LM's logits are nearly flat over 64,000 codes,
# so with one seed the exponential race picks the same code whatever the weights; restricting to
# the model's own top 8 makes its ranking (and so the adapter) decide.
PIN = {"bpm": 120, "keyscale": "C major", "timesignature": "4", "top_k": 8}


def _request(**extra) -> LmRequest:
    return LmRequest(**{"caption": "dark synthwave", "lyrics": "[verse]\nneon", **PIN, **extra})


def test_constrained_decoding_emits_duration_x5_codes_then_eos(planner):
    plan = planner.plan(_request(duration=3, lm_seed=1))
    assert plan.result.codes_count == 15 and not plan.result.phase1
    assert len(plan.token_ids) == 16 and plan.token_ids[-1] == IM_END_ID
    assert all(AUDIO_CODE_BASE_ID <= t < AUDIO_CODE_BASE_ID + 64000 for t in plan.token_ids[:-1])
    assert "duration: 3" in plan.result.cot and "bpm: 120" in plan.result.cot


def test_same_seed_same_codes_other_seed_other_codes(planner):
    first = planner.generate(_request(duration=2, lm_seed=42))
    again = planner.generate(_request(duration=2, lm_seed=42))
    other = planner.generate(_request(duration=2, lm_seed=43))
    assert first.codes == again.codes and first.lm_seed == 42
    assert other.codes != first.codes
    picked = planner.generate(_request(duration=1))  # no seed: one is chosen and recorded
    assert picked.lm_seed >= 0


def test_phase1_plans_missing_metas(planner):
    result = planner.generate(LmRequest(caption="lofi", duration=1, lm_seed=3, max_cot_tokens=24))
    assert result.phase1 and result.codes_count == 5
    assert result.cot.startswith("<think>\n") and "duration: 1" in result.cot


def test_adapter_changes_codes_and_leaves_base_untouched(planner, runs):
    base = planner.generate(_request(duration=2, lm_seed=9))
    tuned = planner.generate(_request(duration=2, lm_seed=9, lm_adapter="band", use_trigger=False))
    assert tuned.codes != base.codes and tuned.lm_adapter == "band"
    assert planner.generate(_request(duration=2, lm_seed=9)).codes == base.codes
    zero = planner.generate(
        _request(duration=2, lm_seed=9, lm_adapter="band", use_trigger=False, lm_adapter_scale=0)
    )
    assert zero.codes == base.codes  # scale 0 is the base model
    tagged = planner.generate(_request(duration=1, lm_seed=9, lm_adapter="lm-06b/band"))
    assert tagged.caption == "band, dark synthwave" and tagged.trigger.source == "folder"
    assert tagged.trigger.path == runs["lm"]


def test_unknown_or_mismatched_adapters_are_refused(planner):
    with pytest.raises(NotFoundError):
        planner.generate(_request(duration=1, lm_adapter="nobody"))
    with pytest.raises(InputError, match="1.7B"):
        planner.generate(_request(duration=1, lm_adapter="lm-17b/band"))
    with pytest.raises(InputError):
        planner.generate(_request(duration=1, lm_adapter="../etc"))


def test_static_engine_matches_eager(planner):
    static = PlannerLM(planner.base.model, planner.tokenizer, lm_size="0.6B", decode_mode="static")
    request = _request(duration=2, lm_seed=5, temperature=0)
    assert static.generate(request).codes == planner.generate(request).codes


def test_sampling_filters():
    gen = torch.Generator().manual_seed(0)
    logits = torch.tensor([0.1, 3.0, 2.9, -1.0])
    assert int(sample_token(logits, Sampling(top_k=1, top_p=1.0), gen)) == 1
    assert int(sample_token(logits, Sampling(top_p=0.01), gen)) == 1
    assert int(sample_token(logits, Sampling(temperature=0), gen)) == 1
    penalised = Sampling(temperature=0, rep_penalty=2.0)
    assert int(sample_token(logits, penalised, gen, torch.tensor([1]))) == 2
    rows = torch.tensor([[2.0, 0.0], [1.0, 1.0]])
    assert combine_cfg(rows, 2.0).tolist() == [3.0, -1.0]  # uncond + 2 (cond - uncond)


def test_failed_graph_capture_falls_back_without_losing_steps(planner):
    """A capture that dies after its warm-up steps rewinds the cache counters and decodes on
    (CPU stands in for the GPU here: the capture is replaced by one that fails)."""
    from hotstep_ray.audition.lm_decode import Stepper

    rows = [list(range(100, 130)), list(range(200, 212))]
    tokens = [torch.tensor(t) for t in (5, 6, 7)]
    reference = Stepper(planner.base.model, "static")
    expected = [reference.start(rows, 8)] + [reference.step(t) for t in tokens]

    stepper = Stepper(planner.base.model, "static")
    stepper.mode = "graph"

    def failing_capture() -> None:
        stepper._static_step()
        stepper._static_step()
        raise RuntimeError("capture not supported here")

    stepper._capture = failing_capture
    got = [stepper.start(rows, 8)] + [stepper.step(t) for t in tokens]
    assert stepper.mode == "static"
    for a, b in zip(got, expected, strict=True):  # static both sides, in-process: bit-identical
        torch.testing.assert_close(a, b)


def test_adapter_cache_is_lru(planner, runs):
    lru = PlannerLM(
        planner.base.model,
        planner.tokenizer,
        lm_size="0.6B",
        storage=planner.storage,
        max_adapters=1,
    )
    first = lru.adapter("band")
    assert lru.adapter("band") is first  # cached
    lru.adapter(runs["lm"].removeprefix("adapters/"))  # another id evicts the oldest
    assert lru.cached_adapters == [runs["lm"].removeprefix("adapters/")]
    assert lru.adapter("band") is not first  # reloaded after eviction


def test_a_new_adapter_scale_rebuilds_the_step_engines(planner):
    """A captured CUDA graph replays the LoRA scale it was captured at, so engines built at one
    scale are dropped when a request asks for another (and kept while the scale stays)."""
    request = _request(duration=1, lm_seed=5, lm_adapter="band", use_trigger=False)
    planner.generate(request)
    loaded = planner.adapter("band")
    engines = dict(loaded.steppers)
    assert engines and loaded.scale == 1.0
    planner.generate(request)
    assert all(loaded.steppers[key] is engine for key, engine in engines.items())
    half = planner.generate(request.model_copy(update={"lm_adapter_scale": 0.5}))
    assert loaded.scale == 0.5
    assert all(loaded.steppers.get(key) is not engine for key, engine in engines.items())
    full = planner.generate(request)
    assert loaded.scale == 1.0 and full.codes != half.codes


def test_adapter_cache_loads_once_and_evicts_the_least_recently_used():
    from hotstep_ray.audition.planner import AdapterCache

    loads = []
    cache = AdapterCache(lambda name: loads.append(name) or name.upper(), size=2)
    assert cache.get("a") == "A" and cache.get("b") == "B" and cache.get("a") == "A"
    assert loads == ["a", "b"] and cache.ids == ["b", "a"]  # "a" was used last
    cache.get("c")  # evicts "b", the least recently used
    assert cache.ids == ["a", "c"]
    cache.get("b")
    assert loads == ["a", "b", "c", "b"] and cache.ids == ["c", "b"]


# -- batched generation ---------------------------------------------------------------------------
def _fields(result) -> dict:
    """A result's fields but its timing (which a batch shares out)."""
    return result.model_dump(exclude={"lm_ms", "codes_per_s"})


def test_a_batch_of_one_is_generate(planner):
    request = _request(duration=2, lm_seed=17)  # sampled (temperature 0.85, top-k 8), CFG
    (batched,) = planner.generate_batch([request])
    assert _fields(batched) == _fields(planner.generate(request))


def test_a_greedy_batch_gives_each_request_its_own_codes(planner):
    """Different seeds, captions, lyrics, negative prompts and durations (prompts of different
    lengths, left-padded; requests finishing early) in one batch of 3 x [cond, uncond] rows:
    each gets exactly its own `generate` codes (greedy in float32 on the CPU: batching leaves
    every argmax alone). The repetition penalty (each request's own recent codes) keeps the tiny
    LM's greedy codes from repeating one code, so a token fed to the wrong row shows."""
    greedy = {"temperature": 0, "rep_penalty": 2.0, "rep_window": 16}
    requests = [
        _request(duration=2, lm_seed=1, caption="a", **greedy),
        _request(duration=3, lm_seed=2, lyrics="[chorus]\nneon nights, analog", **greedy),
        _request(duration=1, lm_seed=3, negative_prompt="noise", **greedy),
    ]
    batched = planner.generate_batch(requests)
    assert (6, 0) in planner.base.steppers  # one 6-row engine decoded them together
    singles = [planner.generate(r) for r in requests]
    assert [_fields(b) for b in batched] == [_fields(s) for s in singles]
    assert [b.codes_count for b in batched] == [10, 15, 5]
    assert len(set(batched[1].codes)) > 5
    assert all(b.lm_ms > 0 and b.codes_per_s > 0 for b in batched)


def test_a_sampled_batch_keeps_each_seed(planner):
    requests = [_request(duration=2, lm_seed=seed) for seed in (21, 22, 23)]
    first = planner.generate_batch(requests)
    again = planner.generate_batch(requests)
    assert [r.codes for r in first] == [r.codes for r in again]  # each seed reproduces
    assert len({tuple(r.codes) for r in first}) == 3  # and the seeds differ within the batch
    assert [r.lm_seed for r in first] == [21, 22, 23]
    assert [r.codes_sha1 for r in first] == [r.codes_sha1 for r in again]


def test_a_batch_without_cfg(planner):
    requests = [_request(duration=d, lm_seed=d, temperature=0, cfg_scale=1.0) for d in (1, 2)]
    fresh = PlannerLM(planner.base.model, planner.tokenizer, lm_size="0.6B", decode_mode="eager")
    batched = fresh.generate_batch(requests)
    assert list(fresh.base.steppers) == [(2, 0)]  # 2 cond rows, no uncond
    assert [b.codes for b in batched] == [planner.generate(r).codes for r in requests]


def test_a_batch_runs_phase1_per_request_then_decodes_together(planner):
    requests = [
        LmRequest(caption=caption, lm_seed=seed, max_cot_tokens=16, temperature=0)
        for caption, seed in (("lofi", 3), ("rock", 4))
    ]
    batched = planner.generate_batch(requests)
    assert all(b.phase1 for b in batched)
    assert [_fields(b) for b in batched] == [_fields(planner.generate(r)) for r in requests]


def test_unbatchable_requests_run_one_at_a_time(planner):
    mixed = [_request(duration=1, lm_seed=4), _request(duration=1, lm_seed=4, temperature=0.5)]
    assert not PlannerLM.batchable(mixed)
    assert not PlannerLM.batchable([_request(lm_adapter="band"), _request()])
    scaled = [_request(lm_adapter="band"), _request(lm_adapter="band", lm_adapter_scale=0.5)]
    assert not PlannerLM.batchable(scaled)
    assert PlannerLM.batchable([_request(lm_seed=1), _request(lm_seed=2, duration=9, bpm=90)])
    fresh = PlannerLM(planner.base.model, planner.tokenizer, lm_size="0.6B", decode_mode="eager")
    got = fresh.generate_batch(mixed)
    assert list(fresh.base.steppers) == [(2, 0)]  # two single requests, no 4-row batch
    assert [_fields(g) for g in got] == [_fields(planner.generate(r)) for r in mixed]
    assert fresh.generate_batch([]) == []


def test_a_batch_on_an_adapter(planner):
    requests = [
        _request(duration=1, lm_seed=s, lm_adapter="band", lm_adapter_scale=0.5, use_trigger=False)
        for s in (8, 9)
    ]
    batched = planner.generate_batch(requests)
    assert all(b.lm_adapter == "band" and b.lm_adapter_scale == 0.5 for b in batched)
    assert (4, 0) in planner.adapter("band").steppers
    assert [_fields(b) for b in batched] == [_fields(planner.generate(r)) for r in requests]


def test_merged_adapters_decode_like_the_adapter_on_the_base_structure(planner, runs):
    """merge_adapters on: the adapter's side runs on a plain model (no adapter layers, the
    base's module structure) with ΔW·scale in fresh weight copies; its codes equal the unmerged
    run's (float32 here), the base weights and codes are untouched, a new scale re-merges, and
    only MAX_MERGED adapters keep a copy."""
    from hotstep_ray.audition import planner as planner_module
    from hotstep_ray.training.adapters import tuner_layers

    merged = PlannerLM(
        planner.base.model,
        planner.tokenizer,
        lm_size="0.6B",
        storage=planner.storage,
        merge_adapters="on",
    )
    assert not planner.merge_adapters  # auto: eager on the CPU keeps the adapter layers
    before = {k: v.clone() for k, v in planner.base.model.state_dict().items()}
    request = _request(duration=2, lm_seed=9, lm_adapter="band", use_trigger=False)
    for scale in (1.0, 0.5):
        want = planner.generate(request.model_copy(update={"lm_adapter_scale": scale}))
        got = merged.generate(request.model_copy(update={"lm_adapter_scale": scale}))
        assert got.codes == want.codes and got.lm_adapter_scale == scale
    # no metas: phase 1 (the CoT) runs on the merged model at the request's scale too
    planned = LmRequest(
        caption="lofi", duration=1, lm_seed=3, max_cot_tokens=24, lm_adapter="band",
        use_trigger=False, lm_adapter_scale=0.3, top_k=8,
    )  # fmt: skip
    phase1_models = []
    phase1 = merged._phase1
    merged._phase1 = lambda loaded, *args: phase1_models.append(loaded) or phase1(loaded, *args)
    want, got = planner.generate(planned), merged.generate(planned)
    assert got.phase1 and (got.cot, got.codes) == (want.cot, want.codes)
    ran = merged.adapter("band").merged
    assert phase1_models == [ran] and ran.scale == 0.3  # not the unmerged layers' scale
    merged.generate(request.model_copy(update={"lm_adapter_scale": 0.5}))
    loaded = merged.adapter("band")
    assert loaded.merged is not None and loaded.merged.scale == 0.5
    model = loaded.merged.model
    assert not list(tuner_layers(model)) and list(tuner_layers(loaded.model))
    base_names = [n for n, _ in planner.base.model.named_modules()]
    assert [n for n, _ in model.named_modules()] == base_names  # the base's structure
    q = "model.layers.0.self_attn.q_proj.weight"
    assert model.state_dict()[q].data_ptr() != planner.base.model.state_dict()[q].data_ptr()
    embed = "model.embed_tokens.weight"  # not adapted: shared, no copy
    assert model.state_dict()[embed].data_ptr() == planner.base.model.state_dict()[embed].data_ptr()
    for key, value in planner.base.model.state_dict().items():
        assert torch.equal(value, before[key]), key
    assert (
        merged.generate(_request(duration=2, lm_seed=9)).codes
        == planner.generate(_request(duration=2, lm_seed=9)).codes
    )
    other = merged.adapter(runs["lm"].removeprefix("adapters/"))
    merged.generate(request.model_copy(update={"lm_adapter": other.name}))
    assert planner_module.MAX_MERGED == 2 and loaded.merged is not None
    third = PlannerLM(planner.base.model, planner.tokenizer, lm_size="0.6B", merge_adapters="on")
    names = ("band", runs["lm"].removeprefix("adapters/"), "band")
    first, second, last = (merged.load_adapter(name) for name in names)  # three objects
    for adapter in (first, second, last):  # three adapters: the oldest gives its copy up
        third.generate(_request(duration=1, lm_seed=1), adapter)
    assert first.merged is None and second.merged is not None and last.merged is not None
    with pytest.raises(InputError, match="merge_adapters"):
        PlannerLM(planner.base.model, planner.tokenizer, lm_size="0.6B", merge_adapters="yes")


def test_a_merged_lokr_adapter_decodes_like_the_unmerged_one(planner):
    """LM adapters default to LoKR: merging folds its Kronecker ΔW the same way."""
    from hotstep_ray.audition.planner import LoadedLm, merged_model, shared_copy
    from hotstep_ray.training import adapters

    model = shared_copy(planner.base.model)
    targets = adapters.LM_ATTENTION_TARGETS + adapters.MLP_TARGETS
    adapters.inject(model, adapters.AdapterSpec(kind="lokr", rank=4, alpha=8, targets=targets))
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for param in adapters.adapter_parameters(model).values():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    model.eval().requires_grad_(False)
    lokr = LoadedLm(name="lokr", model=model)
    merged = PlannerLM(planner.base.model, planner.tokenizer, lm_size="0.6B", merge_adapters="on")
    request = _request(duration=2, lm_seed=4)
    base = planner.generate(request)
    for scale in (1.0, 0.5):
        scaled = request.model_copy(update={"lm_adapter_scale": scale})
        want = planner.generate(scaled, lokr)
        assert want.codes != base.codes  # the adapter matters
        assert merged.generate(scaled, lokr).codes == want.codes
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        adapters.set_scale(model, 1.0)
        # W + ΔW rounded once per element (u = eps_f32 / 2) vs x W + x ΔW: through the 2-layer,
        # 32-wide tiny LM onto |logits| < 1 that is ~1e-6, while the adapter itself moves the
        # logits by O(1) (LoKR factors of 0.3 randn): a dropped or mis-scaled merge shows.
        torch.testing.assert_close(
            merged_model(model, 1.0)(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-4
        )
