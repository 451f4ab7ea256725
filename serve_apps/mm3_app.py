"""Ray Serve application for the MM3 audition: a thin deployment over `mm3.audition.Mm3Audition`.

    Mm3Audition (deployment)  -> hotstep_ray.mm3.audition.Mm3Audition  (composer LM + DiT + vocoder)
    Mm3Ingress (FastAPI):     POST /mm3/audition     same-seed A/B: base and an MM3 LoRA
                              GET  /mm3/previews/{id}/{slot}   slot = base | adapter (WAV)
                              GET  /mm3/adapters     MM3 runs under adapters/mm3-dit/
                              GET  /health, /docs

Requests are validated in the ingress (pydantic `Mm3AuditionRequest`: 422 naming the field); an
unknown adapter is a 404 from the replica. The replica renders one request at a time (the models
are resident; a second request queues). Previews are written by the ingress under
`<data>/previews/<id>/`. A bearer token (default $HOTSTEP_TOKEN at build time) guards every route
but /health and the docs.

`serve run serve_apps/mm3.yaml` (from the repo root), with `args.checkpoints` holding `mm3/`.

No `from __future__ import annotations` here: FastAPI reads the route annotations in the replica.
"""

import asyncio
import sys
from typing import Any

import ray.cloudpickle
from fastapi import FastAPI
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict
from ray import serve
from ray.serve.handle import DeploymentHandle

from hotstep_ray.audition.http_api import guarded_api, remote
from hotstep_ray.mm3.audition import Mm3AuditionRequest

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Mm3AppConfig(BaseModel):
    """Everything the app needs; `serve run` passes these as `args`."""

    model_config = ConfigDict(extra="forbid")

    checkpoints: str  # holds mm3/<name>/ (or is the MM3 folder); no ACE weights needed
    data: str  # storage root: adapters/mm3-dit/, previews/
    device: str = ""  # "": cuda when present
    dtype: str | None = None  # None: bfloat16 on cuda, float32 on cpu
    gpus: float = 1.0  # the full pipeline in bf16 is ~23 GB (mm3.md §1.4)
    replica_cpus: float = 1.0
    cpu_threads: int = 1  # torch threads per replica on CPU
    max_body_bytes: int = 256 * 1024
    token: str | None = None  # bearer token; None: $HOTSTEP_TOKEN when set


@serve.deployment(name="Mm3Audition", max_ongoing_requests=4)
class Mm3AuditionDeployment:
    def __init__(self, config: dict) -> None:
        import torch

        from hotstep_ray.core.storage import Storage
        from hotstep_ray.mm3.audition import Mm3Audition

        cfg = Mm3AppConfig(**config)
        if cfg.cpu_threads > 0 and not torch.cuda.is_available():
            torch.set_num_threads(cfg.cpu_threads)
        self.audition = Mm3Audition(
            cfg.checkpoints, Storage(cfg.data), device=cfg.device, dtype=cfg.dtype
        )

    async def generate(self, request: dict):
        from hotstep_ray.mm3.audition import Mm3AuditionRequest

        return await asyncio.to_thread(self.audition.generate, Mm3AuditionRequest(**request))


def make_api(config: Mm3AppConfig) -> FastAPI:
    """The FastAPI app with the body cap, the bearer token and the error mapping."""
    return guarded_api(
        title="hotstep-ray MM3 audition",
        description="Hear MiniMax-Music3 DiT LoRAs: base vs adapter, one seed.",
        token=config.token,
        max_body_bytes=config.max_body_bytes,
    )


def build_ingress(config: Mm3AppConfig):
    api = make_api(config)

    @serve.deployment(name="Mm3Ingress", max_ongoing_requests=64)
    @serve.ingress(api)
    class Mm3Ingress:
        def __init__(self, audition: DeploymentHandle, cfg: dict) -> None:
            from hotstep_ray.core.storage import Storage

            self.cfg = Mm3AppConfig(**cfg)
            self.audition = audition
            self.storage = Storage(self.cfg.data)

        @api.get("/health")
        async def health(self) -> dict:
            return {"status": "ok", "backend": "mm3"}

        @api.get("/mm3/adapters")
        async def adapters(self) -> list[dict]:
            from hotstep_ray.core import layout

            def runs() -> list[dict]:
                base = layout.mm3_dit_adapter_base()
                found = []
                for artist in self.storage.list(base):
                    for run in self.storage.list(artist):
                        if self.storage.exists(f"{run}/{layout.MM3_DIT_WEIGHTS}"):
                            found.append({"id": run, "artist": artist.rsplit("/", 1)[-1]})
                return found

            return await asyncio.to_thread(runs)

        @api.post("/mm3/audition")
        async def audition(self, body: Mm3AuditionRequest) -> dict:
            from hotstep_ray.mm3.audition import save_preview

            result = await remote(self.audition.generate.remote(body.model_dump()))
            await asyncio.to_thread(save_preview, self.storage, result)
            return result.to_json_dict()

        @api.get("/mm3/previews/{preview_id}/{slot}", response_class=Response)
        async def preview(self, preview_id: str, slot: str) -> Response:
            from hotstep_ray.mm3.audition import read_preview

            data = await asyncio.to_thread(read_preview, self.storage, preview_id, slot)
            return Response(data, media_type="audio/wav")

    return Mm3Ingress


def build_app(config: Mm3AppConfig | dict):
    """The bound application graph (deploy with `serve.run(build_app(cfg))`)."""
    cfg = config if isinstance(config, Mm3AppConfig) else Mm3AppConfig(**config)
    raw = cfg.model_dump()
    actor: dict[str, Any] = {"num_cpus": cfg.replica_cpus}
    if cfg.device != "cpu" and cfg.gpus > 0:
        import torch

        if torch.cuda.is_available():
            actor["num_gpus"] = cfg.gpus
    audition = Mm3AuditionDeployment.options(ray_actor_options=actor).bind(raw)
    return build_ingress(cfg).options(ray_actor_options={"num_cpus": 0}).bind(audition, raw)


def app_builder(args: dict) -> Any:
    """`serve run` entry point: `import_path: serve_apps.mm3_app:app_builder`."""
    return build_app(Mm3AppConfig(**args))
