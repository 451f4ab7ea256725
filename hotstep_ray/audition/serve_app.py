"""Ray Serve application for the audition: thin deployments over the plain classes.

    CodesDecoder  -> hotstep_ray.audition.decode.CodesDecoder       (fractional GPU)
    PlannerLM     -> hotstep_ray.audition.planner.PlannerLM         (@serve.multiplexed LM adapters)
    DitAudition   -> hotstep_ray.audition.dit_audition.DitAudition  (@serve.multiplexed DiT adapters)
    AuditionIngress (FastAPI): POST /codes-decode, /lm, /audition, /dit-audition;
                               GET /health, /adapters, /previews, /previews/{id}/{slot}, /docs

Input is validated in the ingress (codes, ranges, adapter ids) so bad requests get a 4xx naming the
problem and never reach a model replica. Bodies over the cap get 413, a POST without
Content-Length 411; with a token configured (default: $HOTSTEP_TOKEN at build time) every route
but /health and the docs needs `Authorization: Bearer <token>`.

The app is built from one `AuditionAppConfig` (`audition/options.py`, torch-free for the CLI).
`serve run serve_apps/audition.yaml` (from the repo root; `serve_apps/audition_app.py` binds this
module for Serve's import path), `hotstep-ray audition serve`, or the main job.

No `from __future__ import annotations` here: FastAPI reads the route annotations in the replica
as objects.
"""

import asyncio
import os
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from ray import serve
from ray.serve.handle import DeploymentHandle

from hotstep_ray.audition.errors import EngineSuspendedError, NotFoundError
from hotstep_ray.audition.http_api import error_response, guarded_api, remote
from hotstep_ray.audition.options import AuditionAppConfig

LM_ADAPTERS_PER_REPLICA = 4  # serve.multiplexed LRU size (a decorator constant)
DIT_ADAPTERS_PER_REPLICA = 2
MEDIA = {"wav": "audio/wav", "flac": "audio/flac"}


def _torch_setup(config: AuditionAppConfig) -> None:
    import torch

    if config.cpu_threads > 0 and not torch.cuda.is_available():
        torch.set_num_threads(config.cpu_threads)


# The decoder's WAV step writes a fresh 46 MB buffer per 240 s song; glibc backing its large
# allocations with transparent huge pages took that song's codes -> WAV from 136.7 to 116.7 ms
# on an H200 host (the WAV step alone 25.9 -> 13.6 ms). glibc reads it at process start.
DECODER_ENV = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}


def _actor_options(
    config: AuditionAppConfig, gpus: float, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Replica options: CPUs, and where there is a GPU its share plus `env` for the worker
    process (leaving out what the user's environment already sets)."""
    options: dict[str, Any] = {"num_cpus": config.replica_cpus}
    if config.device != "cpu" and gpus > 0:
        import torch

        if torch.cuda.is_available():
            options["num_gpus"] = gpus
            own = {k: v for k, v in (env or {}).items() if k not in os.environ}
            if own:
                options["runtime_env"] = {"env_vars": own}
    return options


@serve.deployment(name="CodesDecoder", max_ongoing_requests=16)
class DecoderDeployment:
    def __init__(self, config: dict) -> None:
        from hotstep_ray.audition.decode import replica_codes_decoder

        cfg = AuditionAppConfig(**config)
        _torch_setup(cfg)
        # built and warmed: the tile window's CUDA graph is captured before the first request
        self.decoder = replica_codes_decoder(
            cfg.checkpoints, dit=cfg.dit, device=cfg.device, dtype=cfg.dtype
        )

    async def decode(self, codes: list[int], fmt: str):
        return await asyncio.to_thread(self.decoder.decode, codes, fmt)


@serve.deployment(name="PlannerLM", max_ongoing_requests=8)
class PlannerDeployment:
    def __init__(self, config: dict) -> None:
        import logging

        from hotstep_ray.audition.lm_decode import CAPTURED
        from hotstep_ray.audition.planner import PlannerLM

        cfg = AuditionAppConfig(**config)
        _torch_setup(cfg)
        self.planner = PlannerLM.from_checkpoints(
            cfg.checkpoints,
            data=cfg.data,
            lm=cfg.lm,
            device=cfg.device,
            dtype=cfg.dtype,
            decode_mode=cfg.decode_mode,
            merge_adapters=cfg.merge_adapters,
        )
        if cfg.warm_planner and self.planner.decode_mode in CAPTURED:
            # the replica pays the compile/capture at start, not its first requests (1.7B,
            # "compiled", H200: 42.9 s in the first 30 s song, 33.8 s more in the first 240 s)
            report = self.planner.warm()
            logging.getLogger("ray.serve").info(
                "planner LM (%s) warmed, seconds per (rows, bucket): %s",
                self.planner.decode_mode,
                report,
            )

    @serve.multiplexed(max_num_models_per_replica=LM_ADAPTERS_PER_REPLICA)
    async def get_adapter(self, adapter_id: str):
        return await asyncio.to_thread(self.planner.load_adapter, adapter_id)

    async def generate(self, request: dict):
        from hotstep_ray.audition.schemas import LmRequest

        adapter_id = serve.get_multiplexed_model_id()
        loaded = await self.get_adapter(adapter_id) if adapter_id else None
        return await asyncio.to_thread(self.planner.generate, LmRequest(**request), loaded)


@serve.deployment(name="DitAudition", max_ongoing_requests=4)
class DitDeployment:
    def __init__(self, config: dict) -> None:
        from hotstep_ray.audition.dit_audition import DitAudition

        cfg = AuditionAppConfig(**config)
        _torch_setup(cfg)
        self.dit = DitAudition.from_checkpoints(
            cfg.checkpoints, data=cfg.data, dit=cfg.dit, device=cfg.device, dtype=cfg.dtype
        )

    @serve.multiplexed(max_num_models_per_replica=DIT_ADAPTERS_PER_REPLICA)
    async def get_adapter(self, adapter_id: str):
        return await asyncio.to_thread(self.dit.load_adapter, adapter_id)

    async def render(self, request: dict):
        from hotstep_ray.audition.schemas import DitRequest

        adapter_id = serve.get_multiplexed_model_id()
        loaded = await self.get_adapter(adapter_id) if adapter_id else None
        return await asyncio.to_thread(self.dit.render, DitRequest(**request), loaded)


def make_api(config: AuditionAppConfig) -> FastAPI:
    """The FastAPI app with the body cap, the bearer token and the error mapping."""
    return guarded_api(
        title="hotstep-ray audition",
        description="Hear ACE-Step 1.5 adapters: codes -> audio, LM A/B, DiT audition.",
        token=config.token,
        max_body_bytes=config.max_body_bytes,
    )


def build_ingress(config: AuditionAppConfig):
    """The ingress deployment class, bound to a fresh FastAPI app."""
    from hotstep_ray.audition import catalogue
    from hotstep_ray.audition.ab import PreviewStore, run_ab_async
    from hotstep_ray.audition.codes import parse_codes, validate_codes
    from hotstep_ray.audition.schemas import (
        AuditionRequest,
        DecodeRequest,
        DitRequest,
        LmRequest,
        TriggerInfo,
    )

    api = make_api(config)

    @serve.deployment(name="AuditionIngress", max_ongoing_requests=128)
    @serve.ingress(api)
    class AuditionIngress:
        def __init__(self, decoder: DeploymentHandle, planner: DeploymentHandle, dit, cfg: dict):
            from hotstep_ray.audition.checkpoints import pick
            from hotstep_ray.core.storage import Storage

            self.cfg = AuditionAppConfig(**cfg)
            self.decoder, self.planner, self.dit = decoder, planner, dit
            self.storage = Storage(self.cfg.data)
            self.store = PreviewStore(self.storage)
            self.lm_size = pick(self.cfg.checkpoints, "lm", self.cfg.lm).variant
            self.dit_name = pick(self.cfg.checkpoints, "dit", self.cfg.dit).name

        def _lm_id(self, adapter: str) -> str:
            if not adapter:
                return ""
            key = catalogue.resolve_lm_adapter(self.storage, adapter, self.lm_size)
            return key.removeprefix(f"{catalogue.ROOT}/")

        async def _generate(self, request: LmRequest):
            model_id = self._lm_id(request.lm_adapter)
            handle = self.planner.options(multiplexed_model_id=model_id)
            return await remote(handle.generate.remote(request.model_dump()))

        async def _decode(self, codes: list[int], fmt: str):
            return await remote(self.decoder.decode.remote(codes, fmt))

        @api.get("/health")
        async def health(self) -> dict:
            return {"status": "ok", "lmSize": self.lm_size, "dit": self.dit_name}

        @api.get("/adapters")
        async def adapters(self, kind: str | None = None) -> list[dict]:
            entries = await asyncio.to_thread(catalogue.list_adapters, self.storage)
            return [e.to_json_dict() for e in entries if kind is None or e.kind == kind]

        @api.post("/codes-decode", response_class=Response)
        async def codes_decode(self, body: DecodeRequest) -> Response:
            codes = parse_codes(body.audio_codes)
            validate_codes(codes)
            result = await self._decode(codes, body.format)
            headers = {
                "X-Codes-Count": str(result.codes_count),
                "X-Codes-Sha1": result.codes_sha1,
                "X-Duration-S": f"{result.duration_s:g}",
                "X-Decode-Ms": f"{result.decode_ms:.3f}",
            }
            return Response(result.audio, media_type=MEDIA[result.format], headers=headers)

        @api.post("/lm")
        async def lm(self, body: LmRequest) -> dict:
            return (await self._generate(body)).to_json_dict()

        @api.post("/audition")
        async def audition(self, body: AuditionRequest) -> dict:
            async def resolve(adapter_id: str, override: TriggerInfo | None) -> TriggerInfo:
                key = f"{catalogue.ROOT}/{self._lm_id(adapter_id)}"
                return catalogue.resolve_trigger(self.storage, key, override)

            result, _ = await run_ab_async(
                body, self._generate, self._decode, resolve, self.store, self.lm_size
            )
            return result.to_json_dict()

        @api.post("/dit-audition")
        async def dit_audition(self, body: DitRequest) -> dict:
            if self.dit is None:
                raise NotFoundError("DiT audition is not enabled in this app")
            if body.audio_codes is not None:
                validate_codes(parse_codes(body.audio_codes))
            model_id = ""
            if body.dit_adapter:
                key = catalogue.resolve_dit_adapter(self.storage, body.dit_adapter, self.dit_name)
                model_id = key.removeprefix(f"{catalogue.ROOT}/")
            handle = self.dit.options(multiplexed_model_id=model_id)
            result, audio = await remote(handle.render.remote(body.model_dump()))
            await asyncio.to_thread(
                self.store.write, result.preview_id, result.to_json_dict(), audio
            )
            return result.to_json_dict()

        @api.get("/previews")
        async def previews(self, limit: int = 20) -> list[dict]:
            return await asyncio.to_thread(self.store.list, max(1, min(limit, 40)))

        @api.get("/previews/{preview_id}/{slot}", response_class=Response)
        async def preview_audio(self, preview_id: str, slot: str) -> Response:
            data, fmt = await asyncio.to_thread(self.store.audio, preview_id, slot)
            return Response(data, media_type=MEDIA[fmt])

    return AuditionIngress


def build_app(config: AuditionAppConfig | dict):
    """The bound application graph (deploy with `serve.run(build_app(cfg))`)."""
    cfg = config if isinstance(config, AuditionAppConfig) else AuditionAppConfig(**config)
    raw = cfg.model_dump()
    decoder = DecoderDeployment.options(
        ray_actor_options=_actor_options(cfg, cfg.decoder_gpus, DECODER_ENV)
    ).bind(raw)
    planner = PlannerDeployment.options(ray_actor_options=_actor_options(cfg, cfg.lm_gpus)).bind(
        raw
    )
    dit = None
    if cfg.enable_dit:
        dit = DitDeployment.options(ray_actor_options=_actor_options(cfg, cfg.dit_gpus)).bind(raw)
    ingress = build_ingress(cfg).options(ray_actor_options={"num_cpus": 0})
    return ingress.bind(decoder, planner, dit, raw)


def build_suspended_app(config: AuditionAppConfig | dict):
    """What serves the routes while a training job holds the GPU: 503 everywhere but /health."""
    cfg = config if isinstance(config, AuditionAppConfig) else AuditionAppConfig(**config)
    api = make_api(cfg)

    @serve.deployment(name="AuditionSuspended", ray_actor_options={"num_cpus": 0})
    @serve.ingress(api)
    class AuditionSuspended:
        @api.get("/health")
        async def health(self) -> dict:
            return {"status": "suspended"}

        @api.api_route("/{path:path}", methods=["GET", "POST"])
        async def suspended(self, path: str) -> JSONResponse:
            return error_response(
                EngineSuspendedError("audition engine released for a training job")
            )

    return AuditionSuspended.bind()


def app_builder(args: dict) -> Any:
    """`serve run` entry point (`serve_apps/audition.yaml`: `serve_apps.audition_app:app_builder`)."""
    return build_app(AuditionAppConfig(**args))
