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


def test_decoder_replicas_start_with_huge_pages_for_large_allocations(monkeypatch):
    from hotstep_ray.audition import serve_app as audition_app

    config = yaml.safe_load((REPO / "serve_apps" / "audition.yaml").read_text())
    (app,) = config["applications"]
    (decoder,) = [d for d in app["deployments"] if d["name"] == "CodesDecoder"]
    env = decoder["ray_actor_options"]["runtime_env"]["env_vars"]
    assert env == audition_app.DECODER_ENV == {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    cpu = audition_app.AuditionAppConfig(checkpoints="c", data="d", device="cpu")
    assert audition_app._actor_options(cpu, 0.25, env) == {"num_cpus": cpu.replica_cpus}
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    cfg = audition_app.AuditionAppConfig(checkpoints="c", data="d")
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    options = audition_app._actor_options(cfg, 0.25, audition_app.DECODER_ENV)
    assert options == {
        "num_cpus": cfg.replica_cpus,
        "num_gpus": 0.25,
        "runtime_env": {"env_vars": env},
    }
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2")  # the user's own wins
    assert "runtime_env" not in audition_app._actor_options(cfg, 0.25, audition_app.DECODER_ENV)
    assert "runtime_env" not in audition_app._actor_options(cfg, 0.5)  # other replicas: none
