"""The pure-LM A/B: two `/lm` runs with one seed (base, then adapter), each decoded to audio.

Each side's request is built fresh from the A/B request (never from the other side's echo) and
differs only in `lm_adapter`/`lm_adapter_scale`; the trigger is resolved once and the tagged
caption goes to both sides, so the base side is exactly an adapterless `/lm` run of that caption.
`codesSha1` per side is the determinism receipt; equal receipts mean the adapter changed nothing.
A failing side never sinks the other.

Previews: `previews/<id>/{base,adapter}.<fmt>` then `preview.json` LAST (the completeness mark,
written even when both sides failed). Retention keeps the newest 40 complete previews and at most
1 GB, pruned on every write and list.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from hotstep_ray.audition import catalogue
from hotstep_ray.audition.codes import DecodeResult
from hotstep_ray.audition.errors import NotFoundError
from hotstep_ray.audition.schemas import (
    AuditionRequest,
    AuditionResult,
    LmRequest,
    LmResult,
    LmSampling,
    Metas,
    SideResult,
    TriggerInfo,
)
from hotstep_ray.core import layout
from hotstep_ray.core.storage import Storage

MAX_PREVIEWS = 40
MAX_PREVIEW_BYTES = 1 << 30
PREVIEW_FILE = "preview.json"
SLOTS = ("base", "adapter", "base-render", "adapter-render")
_STALE_INCOMPLETE_S = 3600  # a folder without preview.json this old is a crashed write

Generate = Callable[[LmRequest], Awaitable[LmResult]]
Decode = Callable[[list[int], str], Awaitable[DecodeResult]]
Resolve = Callable[[str, TriggerInfo | None], Awaitable[TriggerInfo]]


class PreviewStore:
    """`previews/` under a storage root, with the retention cap."""

    def __init__(
        self, storage: Storage, max_runs: int = MAX_PREVIEWS, max_bytes: int = MAX_PREVIEW_BYTES
    ) -> None:
        self.storage, self.max_runs, self.max_bytes = storage, max_runs, max_bytes

    def write(self, preview_id: str, meta: dict[str, Any], audio: dict[str, DecodeResult]) -> None:
        """Audio files first, `preview.json` last, then prune."""
        folder = layout.preview_dir(preview_id)
        for slot, decoded in audio.items():
            self.storage.write_bytes(f"{folder}/{slot}.{decoded.format}", decoded.audio)
        self.storage.write_json(f"{folder}/{PREVIEW_FILE}", meta)
        self.prune()

    def label(self, preview_id: str, **fields: Any) -> dict[str, Any]:
        """Add `fields` (the dataset it auditions, say) to a written preview's `preview.json`,
        replaced in one atomic write; returns the new meta."""
        key = f"{layout.preview_dir(preview_id)}/{PREVIEW_FILE}"
        meta = {**self.storage.read_json(key), **fields}
        self.storage.write_json(key, meta)
        return meta

    def _complete(self) -> list[tuple[int, str, int]]:
        """(mtime ns, folder key, bytes) of complete previews; stale incomplete ones deleted."""
        found = []
        now = time.time_ns()
        for key in self.storage.list("previews"):
            if not self.storage.is_dir(key):
                continue
            marker = f"{key}/{PREVIEW_FILE}"
            if not self.storage.exists(marker):
                if now - self.storage.mtime_ns(key) > _STALE_INCOMPLETE_S * 1e9:
                    self.storage.delete(key, recursive=True)
                continue
            size = sum(self.storage.size(k) for k in self.storage.walk_files(key))
            found.append((self.storage.mtime_ns(marker), key, size))
        return sorted(found, reverse=True)

    def prune(self) -> list[str]:
        """Delete all but the newest `max_runs` previews within `max_bytes`; returns deleted ids."""
        deleted, total = [], 0
        for index, (_, key, size) in enumerate(self._complete()):
            total += size
            if index >= self.max_runs or total > self.max_bytes:
                self.storage.delete(key, recursive=True)
                deleted.append(key.rsplit("/", 1)[-1])
        return deleted

    def list(self, limit: int = 20) -> list[dict[str, Any]]:
        self.prune()
        out = []
        for _, key, _ in self._complete()[:limit]:
            out.append(self.storage.read_json(f"{key}/{PREVIEW_FILE}"))
        return out

    def audio(self, preview_id: str, slot: str) -> tuple[bytes, str]:
        """(bytes, format) of one side's audio."""
        if slot not in SLOTS:
            raise NotFoundError(f"preview slot {slot!r}: expected one of {SLOTS}")
        folder = layout.preview_dir(preview_id)
        for fmt in ("wav", "flac"):
            key = f"{folder}/{slot}.{fmt}"
            if self.storage.exists(key):
                return self.storage.read_bytes(key), fmt
        raise NotFoundError(f"preview {preview_id!r} has no {slot} audio")


def side_request(request: AuditionRequest, caption: str, seed: int, adapter: str, scale: float):
    """A fresh `/lm` request for one side: only the adapter and its scale differ. The metas and
    sampling options carry over field for field (both requests are `Metas` + `LmSampling`)."""
    carried = {*Metas.model_fields, *LmSampling.model_fields, "lyrics", "duration"}
    return LmRequest(
        **request.model_dump(include=carried),
        caption=caption,
        lm_seed=seed,
        lm_adapter=adapter,
        lm_adapter_scale=scale,
        use_trigger=False,  # the caption already carries the resolved trigger
    )


async def run_ab_async(
    request: AuditionRequest,
    generate: Generate,
    decode: Decode,
    resolve_trigger: Resolve,
    store: PreviewStore | None,
    lm_size: str,
) -> tuple[AuditionResult, dict[str, DecodeResult]]:
    """The A/B, sides in order base then adapter. `resolve_trigger(adapter_id, override)`
    raises NotFoundError for an unknown adapter before anything runs."""
    seed = request.seed if request.seed is not None and request.seed >= 0 else None
    seed = int(uuid.uuid4().int % (2**31)) if seed is None else seed
    override = (
        TriggerInfo(word=request.trigger, placement=request.trigger_position)
        if request.trigger
        else None
    )
    trigger = None
    if request.lm_adapter:
        trigger = await resolve_trigger(request.lm_adapter, override)
    elif override is not None:
        trigger = override.model_copy(update={"source": "override"})
    caption = catalogue.apply_triggers(request.caption, [trigger] if trigger else [])
    sides = [("base", "", 1.0)]
    if request.lm_adapter:
        sides.append(("adapter", request.lm_adapter, request.lm_adapter_scale))

    preview_id = uuid.uuid4().hex
    results: list[SideResult] = []
    audio: dict[str, DecodeResult] = {}
    for slot, adapter, scale in sides:
        side = SideResult(slot=slot, lm_adapter=adapter, lm_adapter_scale=scale, ok=False)
        try:
            planned = await generate(side_request(request, caption, seed, adapter, scale))
            side.codes_count, side.codes_sha1 = planned.codes_count, planned.codes_sha1
            side.duration, side.lm_ms = planned.duration, planned.lm_ms
            side.bpm, side.keyscale = planned.bpm, planned.keyscale
            side.timesignature = planned.timesignature
            decoded = await decode(planned.codes, request.format)
            side.decode_ms = decoded.decode_ms
            audio[slot] = decoded
            side.audio_url = f"/previews/{preview_id}/{slot}"
            side.ok = True
        except Exception as exc:  # a failing side is reported, never sinks the other
            side.error = str(exc) or type(exc).__name__
        results.append(side)

    identical = len(results) == 2 and all(s.ok for s in results)
    identical = identical and results[0].codes_sha1 == results[1].codes_sha1
    result = AuditionResult(
        preview_id=preview_id,
        created_at=int(time.time() * 1000),
        seed=seed,
        caption=caption,
        caption_input=request.caption,
        lyrics=request.lyrics,
        duration=request.duration,
        lm_size=lm_size,
        trigger=trigger,
        sides=results,
        identical=identical,
        warning="adapter had no effect: both sides produced the same codes" if identical else "",
    )
    if store is not None:
        store.write(preview_id, result.to_json_dict(), audio)
    return result, audio


def run_ab(
    request: AuditionRequest,
    planner: Any,
    decoder: Any,
    store: PreviewStore | None = None,
) -> tuple[AuditionResult, dict[str, DecodeResult]]:
    """The A/B on plain classes (a `PlannerLM` and a `CodesDecoder`), synchronously."""

    async def generate(req: LmRequest) -> LmResult:
        return planner.generate(req)

    async def decode(codes: list[int], fmt: str) -> DecodeResult:
        return decoder.decode(codes, fmt)

    async def resolve(adapter_id: str, override: TriggerInfo | None) -> TriggerInfo:
        loaded = planner.adapter(adapter_id)  # NotFoundError before any side runs
        return catalogue.resolve_trigger(planner.storage, loaded.key, override)

    return asyncio.run(run_ab_async(request, generate, decode, resolve, store, planner.lm_size))
