"""The studio HTTP API: a FastAPI app over one storage root, mounted at `/api/training` (the
seed's prefix), the same app under uvicorn (`hotstep-ray studio serve`) or Ray Serve (`serve.py`).

Errors are `{"error": "<message>"}` (the seed's shape) with the status from `errors.STATUS_BY_ERROR`;
validation errors add `detail` (pydantic's list). Every route needs `Authorization: Bearer <token>`
when a token is configured; the SSE route also takes `?token=` because browsers' EventSource
cannot send headers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, Body, Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from hotstep_ray.core.errors import HotstepError, PathNotAllowedError, StorageError
from hotstep_ray.core.events import JobEvent
from hotstep_ray.core.storage import Storage, normalize_key
from hotstep_ray.studio import (
    adapter_runs,
    capabilities,
    datasets_api,
    make_job,
    page,
    previews_api,
    stages,
)
from hotstep_ray.studio.config import StudioConfig
from hotstep_ray.studio.context import Studio
from hotstep_ray.studio.errors import ConflictError, NotFoundError, status_of
from hotstep_ray.studio.records import result_key
from hotstep_ray.studio.security import BodyLimitMiddleware, PathGuard, token_matches
from hotstep_ray.studio.sse import KEEPALIVE_FRAME, SSE_HEADERS, sse_frame

log = logging.getLogger(__name__)
API_PREFIX = "/api/training"
SSE_POLL_S = 0.1
# Option fields that name a path: each must stay inside the allowed roots.
PATH_OPTIONS = ("output_path", "output_dir", "init_adapter")
# A model folder is a name under the checkpoints folder, or an absolute path inside it or an
# allowed root; a variant key is a bare name (it becomes a path segment of the tensor cache).
MODEL_OPTIONS = ("dit_model", "vae_model", "lm_model")
NAME_OPTIONS = ("variant_key",)


HEALTH_PATH = "/api/health"  # answered without a token: {"ok", "authorized"} (+ storage if so)


def create_app(config: StudioConfig) -> FastAPI:
    """The app for `config`. Creating it ends jobs a previous server left running."""
    studio = Studio.from_config(config)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        studio.jobs.shutdown()

    def require_token(request: Request) -> None:
        path = request.url.path
        # The page's own files hold no data (its API calls carry the token); health answers load
        # balancers' and proxies' probes, which carry no token, and tells the page whether its
        # token is right.
        if page.is_public(path) or path == HEALTH_PATH:
            return
        query = request.query_params.get("token") if path.endswith(("/events", "/stream")) else None
        if not token_matches(config.token, request.headers.get("authorization"), query):
            raise HTTPException(
                401, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"}
            )

    app = FastAPI(
        title="hotstep-ray studio",
        lifespan=lifespan,
        dependencies=[Depends(require_token)],
        docs_url="/api/docs",
        openapi_url="/api/openapi.json",
        redoc_url=None,
    )
    app.state.studio = studio
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.max_body_bytes)
    _install_error_handlers(app)
    app.include_router(datasets_api.router(studio), prefix=API_PREFIX)
    app.include_router(_jobs_router(studio, config.sse_keepalive_s), prefix=API_PREFIX)
    app.include_router(previews_api.router(studio), prefix=API_PREFIX)
    app.include_router(adapter_runs.router(studio), prefix=API_PREFIX)
    app.include_router(make_job.router(studio), prefix=API_PREFIX)
    app.include_router(page.router())

    @app.get(HEALTH_PATH)
    def health(request: Request) -> dict[str, Any]:
        authorized = token_matches(config.token, request.headers.get("authorization"), None)
        if not authorized:
            return {"ok": True, "authorized": False}
        return {"ok": True, "authorized": True, "storage": studio.storage.url}

    return app


def _error(status: int, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status_code=status)


def _validation_detail(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # pydantic's ctx may hold exception objects; keep the JSON-safe part.
    return [
        {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
        for e in errors
    ]


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(HotstepError)
    async def hotstep_error(_: Request, exc: HotstepError) -> JSONResponse:
        return _error(status_of(exc), str(exc))

    @app.exception_handler(RequestValidationError)
    async def request_invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        detail = _validation_detail(list(exc.errors()))
        first = detail[0] if detail else {"loc": [], "msg": "invalid request"}
        where = ".".join(str(p) for p in first["loc"] if p != "body")
        return _error(422, f"{where}: {first['msg']}" if where else first["msg"], detail=detail)

    @app.exception_handler(ValidationError)
    async def options_invalid(_: Request, exc: ValidationError) -> JSONResponse:
        detail = _validation_detail(list(exc.errors()))
        first = detail[0] if detail else {"loc": [], "msg": "invalid options"}
        where = ".".join(str(p) for p in first["loc"])
        return _error(422, f"{where}: {first['msg']}" if where else first["msg"], detail=detail)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        # A bug, not bad input: still JSON in the seed's shape, and logged with its traceback.
        log.exception("unhandled error")
        return _error(500, f"internal error: {type(exc).__name__}: {exc}")

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, exc: HTTPException) -> JSONResponse:
        response = _error(exc.status_code, str(exc.detail))
        for name, value in (exc.headers or {}).items():
            response.headers[name] = value
        return response


def _check_option_paths(studio: Studio, options: Any) -> None:
    """Absolute paths and URLs in options must lie in the allowed roots; relative ones (storage
    keys) must not climb out with `..`."""
    for name in PATH_OPTIONS:
        value = getattr(options, name, None)
        if not isinstance(value, str) or not value or value == "latest":
            continue
        if value.startswith(("/", "~")) or "://" in value:
            studio.guard.check(value, name)
        else:
            try:
                normalize_key(value)
            except StorageError as exc:  # a key climbing out of the root: a path refusal
                raise PathNotAllowedError(f"{name}: {exc}") from exc
    for name in MODEL_OPTIONS:
        value = getattr(options, name, None)
        if isinstance(value, str) and value:
            _check_model_path(studio, name, value)
    for name in NAME_OPTIONS:
        value = getattr(options, name, None)
        if (
            isinstance(value, str)
            and value
            and (value in (".", "..") or any(c in value for c in "/\\\x00"))
        ):
            raise PathNotAllowedError(f"{name} must be a plain name, got {value!r}")


def _check_model_path(studio: Studio, name: str, value: str) -> None:
    """`value` names a model folder: a plain name (looked up under the checkpoints folder) or an
    absolute path inside the checkpoints folder or an allowed root. Anything else is refused
    before a job starts, so a token holder cannot make the server load files from elsewhere."""
    parts = value.replace("\\", "/").split("/")
    if ".." in parts or "\x00" in value:
        raise PathNotAllowedError(f"{name} may not contain '..': {value}")
    if len(parts) == 1 and "://" not in value and not value.startswith("~"):
        return  # a folder name under the checkpoints folder
    allowed = PathGuard((*studio.guard.roots, studio.checkpoints_dir or ""))
    if not value.startswith(("/", "~")) and "://" not in value:
        raise PathNotAllowedError(
            f"{name} must be a folder name or an absolute path in the allowed roots, got {value!r}"
        )
    allowed.check(value, name)


def _jobs_router(studio: Studio, keepalive_s: float) -> APIRouter:
    api = APIRouter()
    jobs = studio.jobs

    @api.get("/capabilities")
    def get_capabilities() -> dict[str, Any]:
        return capabilities.capabilities(studio.checkpoints_dir)

    @api.post("/datasets/{dataset_id}/{kind}", status_code=202)
    def start_job(
        dataset_id: str, kind: str, body: dict[str, Any] | None = Body(default=None)
    ) -> JSONResponse:
        if kind not in stages.STAGE_ROUTE_KINDS:
            raise NotFoundError(f"no route for {kind!r}")
        summary = datasets_api.find_dataset(studio, dataset_id)
        stages.resolve(kind)  # 501 before anything else: the client cannot fix that
        options = stages.parse_options(kind, body)
        _check_option_paths(studio, options)
        running = jobs.active_job_for(summary.id)
        if running:
            raise ConflictError(f"a job is already running for this dataset ({running})")
        skipped = stages.precheck(kind, studio.storage, summary, options, studio.checkpoints_dir)
        if skipped is not None:
            return JSONResponse(skipped, status_code=200)
        job = jobs.submit(kind, summary, options)
        return JSONResponse({"jobId": job.id, "job": job.to_json_dict()}, status_code=202)

    @api.get("/jobs")
    def list_jobs(dataset_id: str = Query("", alias="datasetId")) -> dict[str, Any]:
        return {"jobs": [s.to_json_dict() for s in jobs.list(dataset_id)]}

    @api.get("/jobs/{job_id}")
    def get_job(job_id: str) -> dict[str, Any]:
        return jobs.get(job_id).to_json_dict()

    @api.get("/jobs/{job_id}/result")
    def get_result(job_id: str) -> Any:
        jobs.get(job_id)
        if not studio.storage.exists(result_key(job_id)):
            raise NotFoundError(f"job {job_id} has no result (yet)")
        return studio.storage.read_json(result_key(job_id))

    @api.delete("/jobs/{job_id}")
    def delete_job(job_id: str) -> dict[str, Any]:
        return {"ok": True, "job": jobs.cancel(job_id).to_json_dict()}

    @api.post("/jobs/{job_id}/cancel")
    def cancel_job(job_id: str) -> dict[str, Any]:
        return {"ok": True, "job": jobs.cancel(job_id).to_json_dict()}

    async def stream_events(job_id: str, request: Request) -> StreamingResponse:
        stream = await asyncio.to_thread(jobs.stream, job_id)

        async def frames() -> AsyncIterator[str]:
            clock = asyncio.get_running_loop().time
            events, seq = stream.buffer.snapshot()
            if not any(getattr(e, "type", "") == "job" for e in events):
                yield sse_frame(JobEvent(job=stream.summary))  # the seed's first frame
            for event in events:
                yield sse_frame(event)
            last_sent = clock()
            while True:
                # `finished` is read before draining, so a status that lands in between is
                # still sent before the stream closes.
                finished = stream.finished()
                events, seq = stream.buffer.since(seq)
                for event in events:
                    yield sse_frame(event)
                if events:
                    last_sent = clock()
                if finished or await request.is_disconnected():
                    return
                if clock() - last_sent >= keepalive_s:
                    yield KEEPALIVE_FRAME  # a comment: keeps proxies from closing a quiet stream
                    last_sent = clock()
                await asyncio.sleep(min(SSE_POLL_S, keepalive_s))
                await asyncio.to_thread(stream.refresh)

        return StreamingResponse(frames(), media_type="text/event-stream", headers=SSE_HEADERS)

    api.add_api_route("/jobs/{job_id}/events", stream_events, methods=["GET"])
    api.add_api_route("/jobs/{job_id}/stream", stream_events, methods=["GET"])  # the seed's name
    return api


def storage_of(app: FastAPI) -> Storage:
    """The storage root an app serves (tests, the CLI)."""
    return app.state.studio.storage
