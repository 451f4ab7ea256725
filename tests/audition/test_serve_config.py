"""The shipped Serve config loads: import path, args, deployment names."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def test_audition_yaml_matches_the_app():
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from serve_apps import audition_app

    config = yaml.safe_load((REPO / "serve_apps" / "audition.yaml").read_text())
    assert config["http_options"]["host"] == "127.0.0.1"
    (app,) = config["applications"]
    module, _, attr = app["import_path"].partition(":")
    assert module == "serve_apps.audition_app" and callable(getattr(audition_app, attr))
    audition_app.AuditionAppConfig(**app["args"])  # every arg is a known field
    names = {d["name"] for d in app["deployments"]}
    assert names == {"CodesDecoder", "PlannerLM", "DitAudition", "AuditionIngress"}
    for deployment in app["deployments"]:
        scaling = deployment.get("autoscaling_config")
        if scaling:
            assert scaling["max_replicas"] > scaling["min_replicas"]
    defaults = audition_app.AuditionAppConfig(checkpoints="c", data="d")
    assert defaults.token is None and defaults.max_body_bytes == 1 << 20
