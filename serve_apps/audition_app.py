"""Serve entry point of the audition app.

    serve run serve_apps/audition.yaml                   # from the repo root

The app lives in `hotstep_ray/audition/serve_app.py`; this file only binds it so `serve run` /
`serve build` have an import path (`serve_apps.audition_app:app_builder`).
"""

from __future__ import annotations

from hotstep_ray.audition.serve_app import AuditionAppConfig, app_builder

__all__ = ["AuditionAppConfig", "app_builder"]
