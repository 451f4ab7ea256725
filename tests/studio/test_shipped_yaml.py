"""Every YAML file we ship parses, and the cluster/Serve configs carry what the rest relies on:
head without GPUs, CPU workers, GPU groups of 24/48/80 GB each advertising VRAM_GB, token auth,
the pinned install, and a RayJob entrypoint that is a hotstep-ray command."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
SKIP = {".venv", ".git", "fixtures", "node_modules", "data"}


def _shipped_yaml() -> list[Path]:
    return sorted(
        p
        for p in REPO.rglob("*.y*ml")
        if p.suffix in (".yaml", ".yml") and not SKIP & set(p.relative_to(REPO).parts)
    )


def _load(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((REPO / name).read_text()) if d is not None]


def test_every_shipped_yaml_parses():
    files = _shipped_yaml()
    names = {str(p.relative_to(REPO)) for p in files}
    assert {"cluster/launcher-aws.yaml", "cluster/kuberay-raycluster.yaml"} <= names
    for path in files:
        assert list(yaml.safe_load_all(path.read_text())), path


def test_launcher_node_types():
    (config,) = _load("cluster/launcher-aws.yaml")
    types = config["available_node_types"]
    head = types[config["head_node_type"]]["resources"]
    assert head.get("GPU", 0) == 0
    assert any("GPU" not in t["resources"] and t["resources"]["CPU"] > 0 for t in types.values())
    gpu = {n: t["resources"] for n, t in types.items() if t["resources"].get("GPU")}
    assert sorted(r["VRAM_GB"] for r in gpu.values()) == [24, 48, 80]
    for node_type in types.values():
        assert node_type["max_workers"] >= node_type["min_workers"] >= 0
        assert "InstanceType" in node_type["node_config"]
    setup = "\n".join(config["setup_commands"])
    assert "requirements.txt -c constraints.txt" in setup and "HOTSTEP_DATA=s3://" in setup
    start = "\n".join(config["head_start_ray_commands"] + config["worker_start_ray_commands"])
    assert start.count("RAY_AUTH_MODE=token") == 2
    assert config["file_mounts"]["~/.ray/auth_token"]


def _vram(group: dict) -> int | None:
    raw = group["rayStartParams"].get("resources")
    if raw is None:
        return None
    return json.loads(json.loads(raw))["VRAM_GB"]  # KubeRay wants a quoted JSON string


def test_kuberay_raycluster_groups():
    (cluster,) = _load("cluster/kuberay-raycluster.yaml")
    assert cluster["kind"] == "RayCluster" and cluster["spec"]["rayVersion"] == "2.60.0"
    spec = cluster["spec"]
    assert spec["authOptions"] == {"mode": "token"}
    assert spec["headGroupSpec"]["rayStartParams"]["num-gpus"] == "0"
    groups = {g["groupName"]: g for g in spec["workerGroupSpecs"]}
    assert _vram(groups["cpu"]) is None
    gpu_groups = [g for g in groups.values() if _vram(g)]
    assert sorted(_vram(g) for g in gpu_groups) == [24, 48, 80]
    for group in gpu_groups:
        (container,) = group["template"]["spec"]["containers"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert group["rayStartParams"]["num-gpus"] == "1"


def test_kuberay_rayjobs():
    jobs = _load("cluster/kuberay-rayjob.yaml")
    assert jobs and all(j["kind"] == "RayJob" for j in jobs)
    for job in jobs:
        spec = job["spec"]
        assert spec["entrypoint"].startswith("hotstep-ray ") and "s3://" in spec["entrypoint"]
        assert ("rayClusterSpec" in spec) != ("clusterSelector" in spec)
        if "rayClusterSpec" in spec:
            assert spec["rayClusterSpec"]["authOptions"] == {"mode": "token"}
            assert spec["shutdownAfterJobFinishes"] is True
    assert any(j["spec"]["entrypoint"].startswith("hotstep-ray demo") for j in jobs)


def test_serve_config_points_at_the_studio_builder():
    (config,) = _load("serve_apps/studio.yaml")
    assert config["http_options"]["host"] == "127.0.0.1"
    (application,) = config["applications"]
    module, attr = application["import_path"].split(":")
    import importlib

    assert callable(getattr(importlib.import_module(module), attr))
    (deployment,) = application["deployments"]
    assert deployment["name"] == "Studio" and deployment["num_replicas"] == 1
