"""The studio's audition job: hear what a dataset's newest adapter does, as a preview with one
audio file per side (base, adapter) under `previews/<id>/`, which the page plays.

Two engines, the library's own plain classes, loaded in the job's runner and dropped after it:
- `dit` (default): text2music through the DiT (`audition.dit_audition.DitAudition`), the base DiT
  against the dataset's DiT adapter, one seed. The DiT is the one the tensor cache was made with,
  so the adapter always matches its base.
- `lm`: the pure-LM A/B of the seed (`audition.ab.run_ab`): the base LM against the dataset's LM
  adapter, each side's 5 Hz codes decoded to audio (`audition.decode.CodesDecoder`).

The caption defaults to a labeled sample's caption (what the adapter was trained on); the trigger
word is applied by the audition classes from the adapter's metadata, as the audition app does.
`preview.json` carries the dataset id, so `GET /previews?datasetId=` lists a dataset's previews.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import Field

from hotstep_ray.core import layout
from hotstep_ray.core.contracts import (
    AUDITION_DECODER_GPUS,
    AUDITION_DIT_GPUS,
    AUDITION_LM_GPUS,
    Options,
)
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.events import EventSink, LogEvent
from hotstep_ray.core.storage import Storage

DEFAULT_CAPTION = "a short instrumental"
PREVIEW_ROUTE = "/api/training/previews"  # + /<preview id>/<slot>: the studio's audio route


class AuditionJobOptions(Options):
    """`POST /datasets/{id}/audition`."""

    engine: Literal["dit", "lm"] = "dit"
    caption: str = Field(default="", max_length=4000)  # "" = a labeled sample's caption
    lyrics: str = Field(default="", max_length=20000)
    duration: float = Field(default=10.0, ge=1.0, le=600.0)  # seconds of audio per side
    seed: int | None = Field(default=None, ge=-1, le=2**63 - 1)  # None / -1: picked, recorded
    adapter: str = Field(default="", max_length=300)  # catalogue id; "" = the dataset slug's newest
    adapter_scale: float = Field(default=1.0, ge=0.0, le=2.0)
    base_side: bool = True  # dit: also render without the adapter (the A/B)
    steps: int | None = Field(default=None, ge=1, le=200)  # dit: sampler steps (turbo: fixed 8)
    variant_key: str = ""  # dit: the tensor-cache variant whose DiT renders; "" = newest
    format: Literal["wav", "flac"] = "wav"
    device: str = ""  # "" = cuda when present


def runner_actor_options(
    options: AuditionJobOptions, cluster_resources: Mapping[str, float]
) -> dict[str, Any]:
    """The job runner renders in its own process, and Ray hides every GPU from an actor that
    asks for none: on a cluster with GPUs it asks for the share the audition Serve replicas of
    the same engines take (dit: the DiT's; lm: the planner's plus the decoder's). A CPU cluster,
    or `device: cpu`, asks for none."""
    if options.device == "cpu" or not cluster_resources.get("GPU", 0):
        return {}
    if options.engine == "dit":
        return {"num_gpus": AUDITION_DIT_GPUS}
    return {"num_gpus": AUDITION_LM_GPUS + AUDITION_DECODER_GPUS}


def audition_dataset(
    storage: Storage,
    slug: str,
    options: AuditionJobOptions,
    *,
    checkpoints_dir: str,
    events: EventSink,
    dataset_id: str = "",
    phase: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run one audition of dataset `slug`; returns the preview (its `sides[].audioUrl` are
    studio routes)."""
    from hotstep_ray.audition.ab import PREVIEW_FILE, PreviewStore
    from hotstep_ray.dataset.store import load_dataset

    def set_phase(name: str) -> None:
        if phase is not None:
            phase(name)

    caption = options.caption or _sample_caption(load_dataset(storage, slug).samples)
    adapter = options.adapter or slug
    if options.engine == "dit":
        set_phase("audition-render")
        result, audio = _render_dit(storage, slug, options, caption, adapter, checkpoints_dir)
    else:
        set_phase("audition-lm-base")
        result, audio = _lm_ab(storage, options, caption, adapter, checkpoints_dir)
    set_phase("audition-writing")
    preview = result.to_json_dict()
    preview.update(datasetId=dataset_id, slug=slug, engine=options.engine, kind="ab")
    for side in preview["sides"]:
        if side.get("ok"):
            side["audioUrl"] = f"{PREVIEW_ROUTE}/{preview['previewId']}/{side['slot']}"
    PreviewStore(storage).write(preview["previewId"], preview, audio)
    for side in preview["sides"]:
        level = "info" if side["ok"] else "error"
        note = side.get("error") or f"{side['slot']} ready"
        events(LogEvent(level=level, message=f"audition {side['slot']}: {note}"))
    url = storage.url_of(f"{layout.preview_dir(preview['previewId'])}/{PREVIEW_FILE}")
    events(LogEvent(message=f"preview written: {url}"))
    if not any(side["ok"] for side in preview["sides"]):
        raise InputError(
            "every audition side failed: "
            + "; ".join(side.get("error", "") for side in preview["sides"])
        )
    return preview


def _sample_caption(samples: list[Any]) -> str:
    for sample in samples:
        if sample.caption and not sample.excluded:
            return sample.caption
    return DEFAULT_CAPTION


def _dit_name(storage: Storage, slug: str, variant_key: str, checkpoints_dir: str) -> str:
    """The DiT folder name the variant's tensors were made with (the adapter's base)."""
    from hotstep_ray.training.dit import resolve_dit_folder
    from hotstep_ray.training.dit_data import META_FILE, pick_variant

    variant = pick_variant(storage, slug, variant_key)
    meta_key = f"{layout.tensor_dir(slug, variant)}/{META_FILE}"
    meta = storage.read_json(meta_key) if storage.exists(meta_key) else {}
    return resolve_dit_folder(meta, variant, None, checkpoints_dir).name


def _render_dit(
    storage: Storage,
    slug: str,
    options: AuditionJobOptions,
    caption: str,
    adapter: str,
    checkpoints_dir: str,
) -> tuple[Any, dict[str, Any]]:
    from hotstep_ray.audition.dit_audition import DitAudition
    from hotstep_ray.audition.schemas import DitRequest

    engine = DitAudition.from_checkpoints(
        checkpoints_dir,
        data=storage,
        dit=_dit_name(storage, slug, options.variant_key, checkpoints_dir),
        device=options.device or None,
    )
    request = DitRequest(
        caption=caption,
        lyrics=options.lyrics,
        duration=options.duration,
        seed=options.seed,
        steps=options.steps,
        dit_adapter=adapter,
        dit_adapter_scale=options.adapter_scale,
        base_side=options.base_side,
        format=options.format,
    )
    return engine.render(request)


def _lm_ab(
    storage: Storage,
    options: AuditionJobOptions,
    caption: str,
    adapter: str,
    checkpoints_dir: str,
) -> tuple[Any, dict[str, Any]]:
    from hotstep_ray.audition.ab import run_ab
    from hotstep_ray.audition.decode import CodesDecoder
    from hotstep_ray.audition.planner import PlannerLM
    from hotstep_ray.audition.schemas import AuditionRequest

    device = options.device or None
    planner = PlannerLM.from_checkpoints(checkpoints_dir, data=storage, device=device)
    decoder = CodesDecoder.from_checkpoints(checkpoints_dir, device=device)
    request = AuditionRequest(
        caption=caption,
        lyrics=options.lyrics,
        duration=options.duration,
        seed=options.seed,
        lm_adapter=adapter,
        lm_adapter_scale=options.adapter_scale,
        format=options.format,
    )
    return run_ab(request, planner, decoder)  # no store: the job writes the preview itself
