"""The studio as a Ray Serve deployment: the FastAPI app of `app.py`, built in the replica.

One replica on purpose: the job map (live buffers, runner handles) lives in the replica's memory
and a new server marks its predecessor's running jobs failed, so two replicas over one storage
root would fight. SSE streams are long-lived requests, hence the high `max_ongoing_requests`.
The replica itself is light (it only orchestrates); jobs run in their own actors.

Serve binds 127.0.0.1:8000 unless `http_options` say otherwise (`serve_apps/studio.yaml` keeps it on
loopback); set `HOTSTEP_TOKEN` in the runtime env before exposing it.
"""

from __future__ import annotations

from typing import Any

from ray import serve
from ray.serve import Application

from hotstep_ray.studio.app import create_app
from hotstep_ray.studio.config import StudioConfig


@serve.deployment(
    name="Studio",
    num_replicas=1,
    max_ongoing_requests=256,
    ray_actor_options={"num_cpus": 0.25},
)
@serve.ingress()
class StudioDeployment:
    """Args are `StudioConfig` fields; unset ones come from the replica's `HOTSTEP_*` env."""

    def __init__(self, data: str, **overrides: Any) -> None:
        if "roots" in overrides:
            overrides["roots"] = tuple(overrides["roots"])
        self.config = StudioConfig.from_env(data, **overrides)

    def __serve_build_asgi_app__(self) -> Any:
        # Built in the replica (not at import), so restart recovery and the storage client run
        # where the server runs.
        return create_app(self.config)


def build_app(args: dict[str, Any]) -> Application:
    """Serve application builder: `serve run hotstep_ray.studio.serve:build_app data=./data`.
    Keys: data (required), roots (list or `os.pathsep` string), token, ray_address, checkpoints."""
    import os

    args = dict(args)
    data = args.pop("data", "") or os.environ.get("HOTSTEP_DATA", "./data")
    roots = args.get("roots")
    if isinstance(roots, str):
        args["roots"] = [r for r in roots.split(os.pathsep) if r]
    return StudioDeployment.bind(data, **args)
