"""Studio settings: one frozen object built from flags or the environment.

Everything the HTTP layer may touch is named here: the storage root, the extra roots a request may
name (song folders), the bearer token, the request size cap. A Serve replica builds its own from
the same values (`serve.py`), so the CLI server and the Serve app behave the same.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from hotstep_ray.studio.sse import SSE_KEEPALIVE_S

TOKEN_ENV = "HOTSTEP_TOKEN"
ROOTS_ENV = "HOTSTEP_STUDIO_ROOTS"  # os.pathsep-separated folders/URLs requests may name
CHECKPOINTS_ENV = "HOTSTEP_CHECKPOINTS"
DEFAULT_HOST = "127.0.0.1"  # loopback unless the operator says otherwise
DEFAULT_PORT = 8765
DEFAULT_MAX_BODY_BYTES = 1 << 20  # 1 MiB: the largest legitimate body is a bulk edit or lyrics


@dataclass(frozen=True)
class StudioConfig:
    """Args:
    data: storage root (a folder or `s3://bucket/prefix`).
    roots: extra folders/URLs a request may name (source folders, build outputs); the
        storage root is always allowed.
    token: bearer token every route requires; "" = no auth (loopback only is the default).
    ray_address: Ray to join for jobs ("" = the running one, `$RAY_ADDRESS`, or a local one).
    checkpoints: the `checkpoints/` folder capabilities report on ("" = `<data>/checkpoints`).
    storage_options: fsspec options for `data` (e.g. an S3 endpoint in tests).
    sse_keepalive_s: seconds of silence after which an event stream sends a keep-alive comment.
    """

    data: str
    roots: tuple[str, ...] = ()
    token: str = ""
    ray_address: str = ""
    checkpoints: str = ""
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    storage_options: dict[str, Any] = field(default_factory=dict)
    sse_keepalive_s: float = SSE_KEEPALIVE_S

    @classmethod
    def from_env(cls, data: str, **overrides: Any) -> StudioConfig:
        """Config from `HOTSTEP_*` environment variables; keyword arguments win."""
        env_roots = tuple(p for p in os.environ.get(ROOTS_ENV, "").split(os.pathsep) if p)
        values: dict[str, Any] = {
            "roots": env_roots,
            "token": os.environ.get(TOKEN_ENV, ""),
            "ray_address": os.environ.get("RAY_ADDRESS", ""),
            "checkpoints": os.environ.get(CHECKPOINTS_ENV, ""),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(data=data, **values)
