"""Import the audition Serve application (`serve_apps/audition_app.py`) from the checkout.

`serve_apps/` sits next to the package in a source checkout (it is Serve's import path, not part
of the installed package), so the CLI's `audition serve` and the main job put the checkout root on
`sys.path` before importing it. `replica_codes_decoder` builds (and warms) a decoder replica's
CodesDecoder.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from hotstep_ray.core.errors import InputError

if TYPE_CHECKING:
    import torch

    from hotstep_ray.audition.decode import CodesDecoder

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]  # the checkout root: hotstep_ray/ and serve_apps/


def audition_app_module() -> ModuleType:
    if (REPO / "serve_apps" / "audition_app.py").is_file() and str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    try:
        from serve_apps import audition_app
    except ImportError as exc:
        raise InputError(
            "serve_apps/audition_app.py not found: run from a source checkout"
        ) from exc
    return audition_app


def replica_codes_decoder(
    checkpoints: str | Path,
    *,
    dit: str | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
) -> CodesDecoder:
    """The CodesDecoder of one Serve replica, its tile-window CUDA graph already captured
    (`CodesDecoder.warm`): the replica's first request does not pay the capture, and the
    largest graph sizes the shared graph pool before any shorter clip's graph."""
    from hotstep_ray.audition.decode import CodesDecoder

    decoder = CodesDecoder.from_checkpoints(checkpoints, dit=dit, device=device, dtype=dtype)
    seconds = decoder.warm()
    if seconds > 0:  # 0.0: nothing to capture (CPU, no CUDA graphs)
        import torch

        reserved = torch.cuda.memory_reserved(decoder.device) / 2**30
        log.info(
            "codes decoder warmed on %s in %.2f s (%.2f GiB reserved)",
            decoder.device,
            seconds,
            reserved,
        )
    return decoder
