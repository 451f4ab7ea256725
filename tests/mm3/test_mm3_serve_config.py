"""serve_apps/mm3.yaml names the app's builder, its deployments and valid args (no Ray)."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def test_mm3_yaml_matches_the_app():
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from serve_apps import mm3_app

    (app,) = yaml.safe_load((REPO / "serve_apps" / "mm3.yaml").read_text())["applications"]
    module, builder = app["import_path"].split(":")
    assert module == "serve_apps.mm3_app" and callable(getattr(mm3_app, builder))
    config = mm3_app.Mm3AppConfig(**app["args"])  # extra="forbid": a stale key fails here
    assert config.checkpoints == "./checkpoints"
    names = {d["name"] for d in app["deployments"]}
    assert names == {"Mm3Audition", "Mm3Ingress"}
    assert mm3_app.Mm3AuditionDeployment.name == "Mm3Audition"
