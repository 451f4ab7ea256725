"""Audition previews over HTTP: the list (newest first, optionally one dataset's) and each
side's audio, which the page plays in `<audio>` players.

Audio is served with the bearer token in the `Authorization` header like every API route: the
page fetches it and plays a blob URL, so no token ever sits in a URL.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query
from fastapi.responses import Response

from hotstep_ray.core.errors import InputError
from hotstep_ray.studio.context import Studio
from hotstep_ray.studio.errors import NotFoundError

AUDIO_TYPES = {"wav": "audio/wav", "flac": "audio/flac"}
MAX_LIST = 100


def router(studio: Studio) -> APIRouter:
    from hotstep_ray.audition.ab import SLOTS, PreviewStore

    api = APIRouter()
    store = PreviewStore(studio.storage)

    @api.get("/previews")
    def list_previews(
        dataset_id: str = Query("", alias="datasetId"),
        limit: int = Query(20, ge=1, le=MAX_LIST),
    ) -> dict[str, Any]:
        previews = store.list(MAX_LIST)
        if dataset_id:
            previews = [p for p in previews if p.get("datasetId") == dataset_id]
        return {"previews": previews[:limit]}

    @api.get("/previews/{preview_id}/{slot}")
    def preview_audio(preview_id: str, slot: str) -> Response:
        if slot not in SLOTS:
            raise NotFoundError(f"preview slot {slot!r}: expected one of {', '.join(SLOTS)}")
        try:
            data, fmt = store.audio(preview_id, slot)
        except InputError as exc:  # a bad id or a missing side: both "not here"
            raise NotFoundError(str(exc)) from exc
        return Response(
            data,
            media_type=AUDIO_TYPES[fmt],
            headers={"Cache-Control": "private, max-age=3600"},
        )

    return api
