"""Serve entry point of the studio HTTP API.

    serve run serve_apps.studio_app:app                 # storage root from $HOTSTEP_DATA (./data)
    serve run serve_apps/studio.yaml                    # the same, with the settings in YAML
    serve run hotstep_ray.studio.serve:build_app data=s3://bucket/prefix

The app lives in `hotstep_ray/studio/` (`serve.py` wraps `app.create_app`); this file only binds it
so `serve run` / `serve build` have an import path. Settings come from `HOTSTEP_*` env vars in the
replica (see `hotstep_ray/studio/config.py`); Serve listens on 127.0.0.1:8000 unless told otherwise.
"""

from __future__ import annotations

import os

from hotstep_ray.studio.serve import build_app

app = build_app({"data": os.environ.get("HOTSTEP_DATA", "./data")})
