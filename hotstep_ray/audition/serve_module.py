"""Import the audition Serve application (`serve_apps/audition_app.py`) from the checkout.

`serve_apps/` sits next to the package in a source checkout (it is Serve's import path, not part
of the installed package), so the CLI's `audition serve` and the main job put the checkout root on
`sys.path` before importing it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

from hotstep_ray.core.errors import InputError

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
