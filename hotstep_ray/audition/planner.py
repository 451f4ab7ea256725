"""The 5 Hz planner LM: caption/lyrics/metas -> (phase 1 CoT when metas are missing) -> codes.

Phase 2 is constrained: after the prompt's `</think>\\n\\n` only the 64,000 code tokens may be
emitted, exactly int(duration * 5) of them, then `<|im_end|>` is forced. Sampling follows the
request's temperature / top-p / top-k / CFG and one explicit `lm_seed` (a torch generator drives
phase 1 then phase 2), so a side is reproducible from its receipt.

`warm` builds and prepares (compiles/captures) the steppers a 30 s and a 240 s request would use,
so a Serve replica pays that at start, not in its first requests.

`generate_batch` decodes the phase 2 of several requests sharing a model and sampling params
together (rows [cond_1..cond_N, uncond_1..uncond_N], a generator per request): for throughput
(calibration), not for `/lm`, whose codes must match a single-request run (see `plan_batch`).

Adapters are loaded by catalogue id onto a *shared copy* of the base LM (new module objects, the
same weight tensors), so the base model never carries an adapter: a base request is
byte-identical to an adapterless run whatever adapters are cached. `adapter()` keeps an LRU of
loaded adapters (the plain-class form of `serve.multiplexed`); Serve calls `load_adapter`.

Merged adapters (`merge_adapters`, auto = with the captured engines on CUDA): a request on an
adapter decodes on `merged_model`, the adapter folded into fresh copies of the weights it adapts
at the request's scale and its layers unwrapped. That model has the base's module structure, so
the base's compiled step code serves it (no compile on an adapter's first request) and a step
runs no adapter GEMMs (1.7B, LoRA r16 on every projection, compiled, H200: 164.5 codes/s unmerged
against 276.4 for the base). Its cost: the adapted weights once more per adapter kept (LoRA on
every projection of the 1.7B: ~2.9 GiB, docs/BENCHMARKS.md), and its codes differ from the unmerged forward's by
the rounding of W + ΔW.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch

from hotstep_ray.audition import catalogue
from hotstep_ray.audition.checkpoints import pick
from hotstep_ray.audition.codes import CODE_HZ, NUM_CODES, codes_sha1
from hotstep_ray.audition.lm_decode import (
    CAPTURED,
    Sampling,
    Stepper,
    combine_cfg,
    combine_cfg_pairs,
    head_slice,
    resolve_mode,
    sample_token,
    static_bucket,
)
from hotstep_ray.audition.schemas import LmRequest, LmResult, TriggerInfo
from hotstep_ray.core import layout
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage
from hotstep_ray.models import prompts
from hotstep_ray.models.lm_tokenizer import (
    AUDIO_CODE_BASE_ID,
    IM_END_ID,
    PAD_ID,
    THINK_END_ID,
    load_tokenizer,
)
from hotstep_ray.models.text_models import load_lm

DEFAULT_DURATION_S = 30
_KEYSCALE = re.compile(r"^[A-G](#|b|♯|♭)? (major|minor)$")
_LANGUAGE = re.compile(r"^([a-z]{2,3}|unknown)$")
T = TypeVar("T")
SAMPLING_FIELDS = {f.name for f in dataclasses.fields(Sampling)}  # request fields the sampler reads
# `warm`: caption and lyrics tokens assumed on top of the phase-2 prompt's template and CoT (which
# `_warm_rows` renders exactly). With the LM tokenizer a 60-word caption (written twice: user turn
# and CoT) and a 4-minute song's lyrics (40 lines, ~1,850 characters) add ~530 to the ~70 of the
# template and CoT. Any prompt up to ~850 tokens puts 30 s (150 codes) in the 1024 bucket and
# 240 s (1,200 codes) in the 2048 one: those measured on an H200 for real 30 s and 240 s songs.
WARM_TEXT_TOKENS = 512
MAX_MERGED = 2  # adapters holding a merged copy at once (`PlannerLM._merged`)


def shared_copy(module: torch.nn.Module, share: Iterable[object] = ()) -> torch.nn.Module:
    """A deep copy whose parameters and buffers ARE the original's (no tensor memory): new
    module objects for an adapter to wrap, while the original stays untouched. Objects in
    `share` are shared too instead of copied."""
    memo = {id(t): t for t in itertools.chain(module.parameters(), module.buffers(), share)}
    return copy.deepcopy(module, memo)


def merged_model(adapted: torch.nn.Module, scale: float) -> torch.nn.Module:
    """`adapted` (a shared copy carrying an adapter) as a plain model: ΔW·scale added into fresh
    copies of the adapted layers' weights, each adapter layer replaced by its base layer. Every
    other tensor stays the base's; `adapted` and the base are left untouched."""
    from hotstep_ray.training import adapters

    model = shared_copy(adapted)
    layers = list(adapters.tuner_layers(model))
    for _, layer in layers:  # the copy's own weight tensors: peft merges in place
        base = layer.get_base_layer()
        base.weight = torch.nn.Parameter(base.weight.detach().clone(), requires_grad=False)
    adapters.set_scale(model, scale)
    adapters.merge(model)
    for path, layer in layers:
        parent, _, name = path.rpartition(".")
        setattr(model.get_submodule(parent), name, layer.get_base_layer())
    return model


class AdapterCache(Generic[T]):
    """The `size` most recently used adapters, loaded on first use (the plain-class form of
    `serve.multiplexed`, shared by the planner LM and the DiT audition)."""

    def __init__(self, load: Callable[[str], T], size: int) -> None:
        self.load, self.size = load, size
        self._loaded: OrderedDict[str, T] = OrderedDict()
        self._lock = threading.RLock()

    def get(self, adapter_id: str) -> T:
        with self._lock:
            if adapter_id in self._loaded:
                self._loaded.move_to_end(adapter_id)
                return self._loaded[adapter_id]
            loaded = self._loaded[adapter_id] = self.load(adapter_id)
            while len(self._loaded) > self.size:
                self._loaded.popitem(last=False)
            return loaded

    @property
    def ids(self) -> list[str]:
        """Oldest first."""
        return list(self._loaded)


@dataclass
class LoadedLm:
    """The base LM or one adapter on a shared copy, with its step engines (per row count) and,
    with merged adapters, its merged copy."""

    name: str  # "" = base
    model: torch.nn.Module
    key: str = ""  # storage key of the adapter folder
    trigger: TriggerInfo | None = None
    steppers: dict[tuple[int, int], Stepper] = field(default_factory=dict)
    # The adapter scale the steppers were built at: a captured CUDA graph bakes peft's α/r·scale
    # into its kernels (a compiled step into its code), so an engine built at one scale must not
    # serve another.
    scale: float = 1.0
    merged: LoadedLm | None = None  # `merged_model` at `merged.scale` (merge_adapters on)


@dataclass
class Plan:
    """What one `/lm` run produced (LmResult plus the raw phase-2 token ids)."""

    result: LmResult
    token_ids: list[int]  # phase 2 output: the code tokens then <|im_end|>


@dataclass
class _Job:
    """One request ready for phase 2 (`PlannerLM._prepare`): what `_finish` reports."""

    request: LmRequest
    loaded: LoadedLm
    scale: float
    seed: int
    gen: torch.Generator
    params: Sampling
    trigger: TriggerInfo | None
    caption: str
    phase1: bool
    meta: dict[str, Any]
    cot: str
    count: int  # codes to emit
    rows: list[list[int]]  # phase-2 prompts: [cond] or [cond, uncond]


def validate_phase1(meta: dict[str, Any]) -> dict[str, Any]:
    """Keep only well-formed planned metas (bpm 30-300, duration 10-600 s, "X major|minor",
    time signature 2/3/4/6, a language code); the rest is dropped, never guessed."""
    out: dict[str, Any] = {}
    if isinstance(meta.get("bpm"), int) and 30 <= meta["bpm"] <= 300:
        out["bpm"] = meta["bpm"]
    if isinstance(meta.get("duration"), int) and 10 <= meta["duration"] <= 600:
        out["duration"] = meta["duration"]
    keyscale = str(meta.get("keyscale", "")).strip()
    if _KEYSCALE.match(keyscale):
        out["keyscale"] = keyscale
    signature = str(meta.get("timesignature", "")).strip().split("/")[0]
    if signature in ("2", "3", "4", "6"):
        out["timesignature"] = signature
    language = str(meta.get("language", "")).strip().lower()
    if _LANGUAGE.match(language):
        out["language"] = language
    return out


class PlannerLM:
    """The plain class behind `POST /lm`. One generation at a time per instance (a lock)."""

    def __init__(
        self,
        lm: torch.nn.Module,
        tokenizer: Any,
        *,
        lm_size: str,
        storage: Storage | None = None,
        decode_mode: str = "auto",
        max_adapters: int = 4,
        compile_mode: str | None = None,
        merge_adapters: str = "auto",
    ) -> None:
        """`decode_mode`: auto (CUDA graphs on CUDA, eager on the CPU), eager, static, graph,
        compiled (Inductor step in a CUDA graph; `compile_mode` is its Inductor mode).
        `merge_adapters`: on | off | auto (on with the captured engines, graph and compiled)."""
        if merge_adapters not in ("auto", "on", "off"):
            raise InputError(f"merge_adapters must be auto, on or off, not {merge_adapters!r}")
        self.base = LoadedLm(name="", model=lm.eval().requires_grad_(False))
        self.tokenizer, self.lm_size, self.storage = tokenizer, lm_size, storage
        self.device = next(lm.parameters()).device
        self.decode_mode, self.max_adapters = resolve_mode(decode_mode, self.device), max_adapters
        self.compile_mode = compile_mode
        self.merge_adapters = merge_adapters == "on" or (
            merge_adapters == "auto" and self.decode_mode in CAPTURED
        )
        self._adapters = AdapterCache(self.load_adapter, max_adapters)
        self._merged_lru: OrderedDict[int, LoadedLm] = OrderedDict()
        self._lock = threading.RLock()

    @classmethod
    def from_checkpoints(
        cls,
        checkpoints: str | Path,
        *,
        data: str | Storage | None = None,
        lm: str | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | str | None = None,
        **options: Any,
    ) -> PlannerLM:
        info = pick(checkpoints, "lm", lm)
        if info.variant not in layout.LM_SIZE_FOLDERS:
            raise InputError(f"{info.path}: cannot tell the LM size (0.6B, 1.7B or 4B)")
        storage = Storage(data) if isinstance(data, str) else data
        return cls(
            load_lm(info.path, device, dtype),
            load_tokenizer(info.path),
            lm_size=info.variant,
            storage=storage,
            **options,
        )

    # -- adapters -----------------------------------------------------------------------------
    def load_adapter(self, adapter_id: str) -> LoadedLm:
        """Load an LM adapter by catalogue id (uncached). NotFoundError / InputError on a bad id."""
        from hotstep_ray.training.export import load_exported

        if self.storage is None:
            raise InputError("this planner has no storage root: adapters cannot be loaded")
        key = catalogue.resolve_lm_adapter(self.storage, adapter_id, self.lm_size)
        model = shared_copy(self.base.model)
        load_exported(model, self.storage, key)
        model.eval().requires_grad_(False)
        trigger = catalogue.resolve_trigger(self.storage, key)
        return LoadedLm(name=adapter_id, model=model, key=key, trigger=trigger)

    def adapter(self, adapter_id: str) -> LoadedLm:
        """Cached `load_adapter`: the `max_adapters` most recently used stay loaded."""
        return self._adapters.get(adapter_id)

    @property
    def cached_adapters(self) -> list[str]:
        return self._adapters.ids

    # -- generation ---------------------------------------------------------------------------
    def _stepper_key(self, prompts_ids: list[list[int]], new: int) -> tuple[int, int]:
        """(rows, static cache bucket); the bucket is 0 for eager steppers."""
        size = 0
        if self.decode_mode != "eager":
            size = static_bucket(max(len(r) for r in prompts_ids) + new + 1)
        return len(prompts_ids), size

    def _stepper(self, loaded: LoadedLm, prompts_ids: list[list[int]], new: int) -> Stepper:
        """The step engine for these rows: eager steppers grow; static ones are kept per
        (rows, cache bucket), so a request's numerics never depend on earlier requests."""
        key = self._stepper_key(prompts_ids, new)
        if key not in loaded.steppers:
            loaded.steppers[key] = Stepper(
                loaded.model, self.decode_mode, max_len=key[1], compile_mode=self.compile_mode
            )
        return loaded.steppers[key]

    @torch.no_grad()
    def warm(
        self, seconds: Iterable[float] = (30.0, 240.0), cfg: bool = True
    ) -> dict[tuple[int, int], float]:
        """Build and prepare (`Stepper.prepare`: allocate, compile, capture) the base LM's phase-2
        steppers that a request of each duration would use: 2 rows with CFG (cond, uncond), 1
        without, in the bucket of a typical prompt (`WARM_TEXT_TOKENS`). A request landing
        there then only prefills and replays. Phase 1 (the CoT, 384 tokens by default) of a
        typical prompt lands in the 30 s bucket; batches (2N rows) and adapters are not warmed.

        Nothing a request computes changes (a prepared stepper is left as a fresh one, no
        generator is drawn from). Returns the seconds spent per stepper key (rows, bucket); {}
        for the eager engine, which has nothing to prepare."""
        report: dict[tuple[int, int], float] = {}
        if self.decode_mode == "eager":
            return report
        with self._lock:
            for duration in seconds:
                rows = self._warm_rows(duration, cfg)
                key = self._stepper_key(rows, _code_count(duration))
                if key in report:
                    continue
                start = time.perf_counter()
                self._stepper(self.base, rows, _code_count(duration)).prepare(len(rows))
                report[key] = round(time.perf_counter() - start, 3)
        return report

    def _warm_rows(self, seconds: float, cfg: bool) -> list[list[int]]:
        """Stand-ins for the phase-2 prompts of a typical request of `seconds`: the cond prompt
        rendered with every meta set, an empty caption and no lyrics, then `WARM_TEXT_TOKENS` pad
        ids for them; the uncond prompt as rendered. Only their count and lengths are used."""
        meta = {"bpm": 120, "keyscale": "C major", "timesignature": "4", "language": "en"}
        cot = prompts.format_cot({**meta, "duration": int(seconds), "caption": ""})
        frame = self._ids(prompts.build_lm_phase2_prompt(self.tokenizer, "", "", cot))
        rows = [frame + [PAD_ID] * WARM_TEXT_TOKENS]
        if cfg:
            rows.append(self._ids(prompts.build_lm_phase2_uncond_prompt(self.tokenizer)))
        return rows

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _phase1(
        self,
        loaded: LoadedLm,
        caption: str,
        lyrics: str,
        params: Sampling,
        negative: str,
        max_tokens: int,
        gen: torch.Generator,
    ) -> dict[str, Any]:
        """Free CoT over text ids only, stopped at `</think>` (or forced there)."""
        rows = [self._ids(prompts.build_lm_phase1_prompt(self.tokenizer, caption, lyrics))]
        if params.uses_cfg:
            uncond = prompts.build_lm_phase1_uncond_prompt(self.tokenizer, lyrics, negative)
            rows.append(self._ids(uncond))
        stepper = self._stepper(loaded, rows, max_tokens)
        h = stepper.start(rows, max_tokens)
        head = head_slice(loaded.model, 0, AUDIO_CODE_BASE_ID)
        emitted: list[int] = []
        for _ in range(max_tokens):
            token = sample_token(combine_cfg(head(h).float(), params.cfg_scale), params, gen)
            emitted.append(int(token))
            if emitted[-1] in (THINK_END_ID, IM_END_ID):
                break
            h = stepper.step(token)
        text = self.tokenizer.decode(emitted, skip_special_tokens=False)
        return validate_phase1(prompts.parse_lm_output(text)[0])

    def _phase2(
        self,
        loaded: LoadedLm,
        rows: list[list[int]],
        count: int,
        params: Sampling,
        gen: torch.Generator,
    ) -> list[int]:
        """Exactly `count` codes (slice indices 0..63999), sampled under CFG."""
        stepper = self._stepper(loaded, rows, count)
        h = stepper.start(rows, count)
        head = head_slice(loaded.model, AUDIO_CODE_BASE_ID, AUDIO_CODE_BASE_ID + NUM_CODES)
        out = torch.empty(count, dtype=torch.long, device=self.device)
        penalise = params.rep_penalty != 1.0
        for k in range(count):
            recent = out[max(0, k - params.rep_window) : k] if penalise else None
            out[k] = sample_token(
                combine_cfg(head(h).float(), params.cfg_scale), params, gen, recent
            )
            if k + 1 < count:
                h = stepper.step(out[k] + AUDIO_CODE_BASE_ID)
        return out.tolist()

    def _phase2_batch(self, loaded: LoadedLm, jobs: list[_Job]) -> list[list[int]]:
        """Phase 2 of N requests sharing `loaded` and their sampling params, decoded together
        over rows [cond_1..cond_N, uncond_1..uncond_N] (N rows without CFG; `Stepper.start`
        left-pads them). Pair i's logits mix rows (i, N + i); request i samples from its own
        generator and its own recent codes, and both its rows receive its token. Every row
        steps until the longest request is done: one that needs fewer codes stops sampling
        (its generator is not read again) and its rows are fed code 0, their outputs ignored."""
        n, params = len(jobs), jobs[0].params
        rows = [job.rows[0] for job in jobs]
        if params.uses_cfg:
            rows += [job.rows[1] for job in jobs]
        longest = max(job.count for job in jobs)
        stepper = self._stepper(loaded, rows, longest)
        h = stepper.start(rows, longest)
        head = head_slice(loaded.model, AUDIO_CODE_BASE_ID, AUDIO_CODE_BASE_ID + NUM_CODES)
        out = torch.zeros(n, longest, dtype=torch.long, device=self.device)  # 0: done rows
        penalise = params.rep_penalty != 1.0
        for k in range(longest):
            mixed = combine_cfg_pairs(head(h).float(), n, params.cfg_scale)  # [N, V]
            window = slice(max(0, k - params.rep_window), k)
            for i, job in enumerate(jobs):  # N small launches, no host sync
                if k >= job.count:
                    continue
                recent = out[i, window] if penalise else None
                out[i, k] = sample_token(mixed[i], params, job.gen, recent)
            if k + 1 < longest:
                tokens = out[:, k] + AUDIO_CODE_BASE_ID
                h = stepper.step(torch.cat([tokens, tokens]) if params.uses_cfg else tokens)
        return [row[: job.count] for row, job in zip(out.tolist(), jobs, strict=True)]

    def plan(self, request: LmRequest, adapter: LoadedLm | None = None) -> Plan:
        """Run one request. `adapter` (from `load_adapter`) wins over `request.lm_adapter`."""
        with self._lock:
            if adapter is None and request.lm_adapter:
                adapter = self.adapter(request.lm_adapter)
            return self._plan(request, adapter)

    def generate(self, request: LmRequest, adapter: LoadedLm | None = None) -> LmResult:
        return self.plan(request, adapter).result

    def plan_batch(self, requests: list[LmRequest], adapter: LoadedLm | None = None) -> list[Plan]:
        """Run several requests, their phase 2 decoded together (`_phase2_batch`) when they can
        share one batch (`batchable`), else one after the other through `plan`. Each result
        carries its own seed, codes and receipt, and the same fields `plan` gives.

        Phase 1 (the CoT of a request with metas missing) still runs per request, from the
        request's own generator, before the batch; phase 2 then continues from that generator,
        as `plan` does. One request alone gives exactly `plan`'s codes. Several do not in general
        (the same seeds, but GEMMs of other shapes and more padding: float rounding differs, and
        a sampled race or a near-tie can then flip): reproducible per batch composition, not
        byte-identical to single-request runs.

        Timing: `lm_ms` is the request's own preparation (prompts, phase 1) plus its share of the
        batched phase 2's wall clock in proportion to its codes, so the results' `lm_ms` add up
        to the call's wall clock and `codes_per_s` is about the batch's aggregate rate."""
        requests = list(requests)
        with self._lock:
            if not self.batchable(requests, adapter):
                return [self.plan(request, adapter) for request in requests]
            if adapter is None and requests[0].lm_adapter:
                adapter = self.adapter(requests[0].lm_adapter)
            return self._plan_batch(requests, adapter)

    def generate_batch(
        self, requests: list[LmRequest], adapter: LoadedLm | None = None
    ) -> list[LmResult]:
        """`generate` for several requests at once: see `plan_batch`."""
        return [plan.result for plan in self.plan_batch(requests, adapter)]

    @staticmethod
    def batchable(requests: list[LmRequest], adapter: LoadedLm | None = None) -> bool:
        """Whether these requests can decode as one batch: the same model (the given `adapter`,
        else the same `lm_adapter`), the same `lm_adapter_scale` where an adapter applies, and
        the same sampling params (temperature, top-p/k, CFG, repetition penalty). Seeds,
        captions, lyrics, metas, durations and negative prompts may differ."""
        if not requests:
            return False
        first = requests[0]
        adapted = adapter is not None or bool(first.lm_adapter)
        params = _sampling(first)
        for request in requests[1:]:
            if adapter is None and request.lm_adapter != first.lm_adapter:
                return False
            if adapted and request.lm_adapter_scale != first.lm_adapter_scale:
                return False
            if _sampling(request) != params:
                return False
        return True

    def _use(self, request: LmRequest, adapter: LoadedLm | None) -> tuple[LoadedLm, float]:
        """The model a request runs on and its adapter scale: the adapter's merged copy at that
        scale (merge_adapters on), else the adapter with the scale set on its layers."""
        loaded = adapter or self.base
        scale = request.lm_adapter_scale if adapter else 1.0
        if adapter is not None and self.merge_adapters:
            return self._merged(adapter, scale), scale
        if adapter is not None:
            from hotstep_ray.training.adapters import set_scale

            set_scale(adapter.model, scale)
            if scale != adapter.scale:  # graphs replay the captured scale: rebuild the engines
                adapter.steppers.clear()
                adapter.scale = scale
        return loaded, scale

    def _merged(self, adapter: LoadedLm, scale: float) -> LoadedLm:
        """`adapter` merged at `scale`, built on first use. At most `MAX_MERGED` adapters keep a
        merged copy (the least recently used gives its copy up before a new one is built), so
        memory stays bounded by what an A/B of two adapters needs whatever the adapter cache
        holds (an adapter object the cache has since dropped still counts towards the bound)."""
        key = id(adapter)
        self._merged_lru.pop(key, None)
        while len(self._merged_lru) >= MAX_MERGED:  # room first, then the new copy
            _, oldest = self._merged_lru.popitem(last=False)
            oldest.merged = None
        if adapter.merged is None or adapter.merged.scale != scale:
            adapter.merged = None  # the old copy's memory first
            adapter.merged = LoadedLm(
                name=adapter.name,
                model=merged_model(adapter.model, scale),
                key=adapter.key,
                trigger=adapter.trigger,
                scale=scale,
            )
        self._merged_lru[key] = adapter
        return adapter.merged

    def _prepare(self, request: LmRequest, loaded: LoadedLm, scale: float) -> _Job:
        """Seed, sampling, trigger, phase 1 when metas are missing, the phase-2 prompts.
        `loaded`: what `_use` chose (the base, the adapter or its merged copy): both phases run
        on it."""
        adapted = loaded is not self.base
        seed = request.lm_seed if request.lm_seed is not None and request.lm_seed >= 0 else None
        seed = secrets.randbits(31) if seed is None else seed
        gen = torch.Generator(device=self.device).manual_seed(seed)
        params = _sampling(request)

        trigger = None
        if request.use_trigger and (adapted or request.trigger):
            override = TriggerInfo(word=request.trigger or "", placement=request.trigger_position)
            if adapted and self.storage is not None:
                trigger = catalogue.resolve_trigger(self.storage, loaded.key, override)
            else:
                trigger = override.model_copy(update={"source": "override"})
        caption = catalogue.apply_triggers(request.caption, [trigger] if trigger else [])

        user = prompts.lm_user_metadata(
            request.bpm, request.keyscale, request.timesignature, request.duration
        )
        planned: dict[str, Any] = {}
        phase1 = not prompts.has_all_metas(user)
        if phase1:
            planned = self._phase1(
                loaded,
                caption,
                request.lyrics,
                params,
                request.negative_prompt,
                request.max_cot_tokens,
                gen,
            )
        meta = {**planned, **{k: v for k, v in user.items() if k != "duration"}}
        duration = request.duration or planned.get("duration") or DEFAULT_DURATION_S
        count = _code_count(duration)
        meta["duration"] = int(duration) if float(duration).is_integer() else duration
        meta["caption"] = caption
        meta["language"] = request.language or planned.get("language") or "en"
        cot = prompts.format_cot(meta)

        rows = [
            self._ids(prompts.build_lm_phase2_prompt(self.tokenizer, caption, request.lyrics, cot))
        ]
        if params.uses_cfg:
            uncond = prompts.build_lm_phase2_uncond_prompt(
                self.tokenizer, negative_prompt=request.negative_prompt
            )
            rows.append(self._ids(uncond))
        return _Job(
            request, loaded, scale, seed, gen, params, trigger, caption, phase1, meta, cot, count,
            rows,
        )  # fmt: skip

    def _finish(self, job: _Job, codes: list[int], elapsed: float) -> Plan:
        request, meta = job.request, job.meta
        result = LmResult(
            codes=codes,
            codes_count=len(codes),
            codes_sha1=codes_sha1(codes),
            duration=round(len(codes) / CODE_HZ, 1),
            caption=job.caption,
            lyrics=request.lyrics,
            bpm=meta.get("bpm"),
            keyscale=meta.get("keyscale"),
            timesignature=meta.get("timesignature"),
            language=meta.get("language"),
            cot=job.cot,
            phase1=job.phase1,
            lm_seed=job.seed,
            lm_adapter=job.loaded.name,
            lm_adapter_scale=job.scale,
            lm_size=self.lm_size,
            trigger=job.trigger,
            lm_ms=round(elapsed * 1000.0, 3),
            codes_per_s=round(len(codes) / max(elapsed, 1e-9), 2),
        )
        return Plan(result, [AUDIO_CODE_BASE_ID + c for c in codes] + [IM_END_ID])

    @torch.no_grad()
    def _plan(self, request: LmRequest, adapter: LoadedLm | None) -> Plan:
        start = time.perf_counter()
        loaded, scale = self._use(request, adapter)
        job = self._prepare(request, loaded, scale)
        codes = self._phase2(loaded, job.rows, job.count, job.params, job.gen)
        return self._finish(job, codes, time.perf_counter() - start)

    @torch.no_grad()
    def _plan_batch(self, requests: list[LmRequest], adapter: LoadedLm | None) -> list[Plan]:
        loaded, scale = self._use(requests[0], adapter)
        jobs, prepared_s = [], []
        for request in requests:
            start = time.perf_counter()
            jobs.append(self._prepare(request, loaded, scale))
            prepared_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        codes = self._phase2_batch(loaded, jobs)
        batch_s = time.perf_counter() - start
        total = sum(job.count for job in jobs)
        return [
            self._finish(job, out, own + batch_s * job.count / total)
            for job, out, own in zip(jobs, codes, prepared_s, strict=True)
        ]


def _code_count(duration: float) -> int:
    """Codes phase 2 emits for `duration` seconds (at least one)."""
    return max(1, int(duration * CODE_HZ))


def _sampling(request: LmRequest) -> Sampling:
    return Sampling(**request.model_dump(include=SAMPLING_FIELDS))
