"""Every YAML file we ship parses, and the cluster/Serve configs carry what the rest relies on:
head without GPUs, CPU workers, GPU groups of 24/48/80 GB each advertising VRAM_GB, token auth,
the pinned install, checkpoints on every pod that loads models, RayJob entrypoints that are
hotstep-ray commands (demo, preprocess, both trainers), and a RayService whose Serve config is the
studio and audition apps of serve_apps/ behind a token."""

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
    assert {
        "cluster/launcher-aws.yaml",
        "cluster/kuberay-raycluster.yaml",
        "cluster/kuberay-rayjob.yaml",
        "cluster/kuberay-rayservice.yaml",
    } <= names
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
    assert "/opt/checkpoints/" in setup and "HOTSTEP_CHECKPOINTS=/opt/checkpoints" in setup


def _vram(group: dict) -> int | None:
    raw = group["rayStartParams"].get("resources")
    if raw is None:
        return None
    return json.loads(json.loads(raw))["VRAM_GB"]  # KubeRay wants a quoted JSON string


def _env(container: dict) -> dict[str, str]:
    return {
        e["name"]: e.get("value") or e["valueFrom"]["secretKeyRef"]["name"]
        for e in container["env"]
    }


def _holds_checkpoints(pod: dict) -> None:
    """The pod syncs the checkpoints from S3 into a volume its Ray container mounts where
    HOTSTEP_CHECKPOINTS points (stages load models from local paths)."""
    (sync,) = pod["initContainers"]
    (container,) = pod["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert {v["name"] for v in pod["volumes"]} == set(mounts) == {"models"}
    assert {m["mountPath"] for m in sync["volumeMounts"]} == {mounts["models"]}
    assert _env(container)["HOTSTEP_CHECKPOINTS"].startswith(mounts["models"] + "/")
    assert _env(sync)["HOTSTEP_CHECKPOINTS_URL"].startswith("s3://")
    assert "HOTSTEP_CHECKPOINTS_URL" in " ".join(sync["command"])


def _check_cluster_spec(spec: dict, vram: list[int]) -> dict[str, dict]:
    """Token auth, a GPU-free head, and GPU groups advertising `vram` VRAM_GB; groups by name."""
    assert spec["rayVersion"] == "2.60.0" and spec["authOptions"] == {"mode": "token"}
    head = spec["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    _holds_checkpoints(head["template"]["spec"])
    groups = {g["groupName"]: g for g in spec["workerGroupSpecs"]}
    gpu_groups = [g for g in groups.values() if _vram(g)]
    assert sorted(_vram(g) for g in gpu_groups) == vram
    for group in gpu_groups:
        (container,) = group["template"]["spec"]["containers"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert group["rayStartParams"]["num-gpus"] == "1"
        assert group["maxReplicas"] >= group["minReplicas"] >= 0
        _holds_checkpoints(group["template"]["spec"])
    return groups


def test_kuberay_raycluster_groups():
    (cluster,) = _load("cluster/kuberay-raycluster.yaml")
    assert cluster["kind"] == "RayCluster" and cluster["metadata"]["name"] == "hotstep"
    groups = _check_cluster_spec(cluster["spec"], [24, 48, 80])
    assert _vram(groups["cpu"]) is None
    (cpu,) = groups["cpu"]["template"]["spec"]["containers"]
    assert "nvidia.com/gpu" not in cpu["resources"]["limits"]


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
    commands = {" ".join(j["spec"]["entrypoint"].split()[:3]) for j in jobs}
    assert {
        "hotstep-ray demo --data",
        "hotstep-ray preprocess run",
        "hotstep-ray train-dit run",
    } <= (commands)
    (cluster,) = _load("cluster/kuberay-raycluster.yaml")
    for job in jobs:
        spec = job["spec"]
        if "clusterSelector" in spec:  # runs on the long-lived RayCluster, where the models are
            assert spec["clusterSelector"] == {"ray.io/cluster": cluster["metadata"]["name"]}
            assert "--checkpoints /models/checkpoints" in spec["entrypoint"]
            assert " --ray" in spec["entrypoint"]
            assert spec["entrypointNumCpus"] >= 1


def _serve_app(applications: list[dict], name: str) -> dict:
    """The named application, after checking its import path resolves (from the repo root, as
    Serve resolves it in the image)."""
    import importlib
    import sys

    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    (app,) = [a for a in applications if a["name"] == name]
    module, attr = app["import_path"].split(":")
    assert callable(getattr(importlib.import_module(module), attr)), app["import_path"]
    return app


def _start_replicas(deployment: dict) -> int:
    autoscaling = deployment.get("autoscaling_config") or {}
    if "initial_replicas" in autoscaling:
        return autoscaling["initial_replicas"]
    return autoscaling.get("min_replicas", deployment.get("num_replicas", 1))


def test_kuberay_rayservice_serves_studio_and_audition():
    (service,) = _load("cluster/kuberay-rayservice.yaml")
    assert service["kind"] == "RayService" and service["apiVersion"] == "ray.io/v1"
    spec = service["spec"]
    groups = _check_cluster_spec(spec["rayClusterConfig"], [24])
    serve = yaml.safe_load(spec["serveConfigV2"])  # KubeRay takes it as a YAML string
    applications = serve["applications"]
    assert sorted(a["route_prefix"] for a in applications) == ["/", "/audition"]
    studio = _serve_app(applications, "studio")
    assert studio["args"]["data"].startswith("s3://")
    assert [d["num_replicas"] for d in studio["deployments"]] == [1]  # one on purpose
    audition = _serve_app(applications, "audition")
    assert audition["args"]["data"] == studio["args"]["data"]
    # the audition config's fields are the app's own (it forbids unknown ones)
    from hotstep_ray.audition.serve_app import AuditionAppConfig

    AuditionAppConfig(**audition["args"])
    shipped = {
        d["name"] for d in _load("serve_apps/audition.yaml")[0]["applications"][0]["deployments"]
    }
    assert {d["name"] for d in audition["deployments"]} == shipped
    # the GPU fractions of the replicas it starts with fit the GPU pods that are always up
    wanted = sum(
        d["ray_actor_options"].get("num_gpus", 0) * _start_replicas(d)
        for d in audition["deployments"]
    )
    always_up = sum(g["minReplicas"] for g in groups.values() if _vram(g))
    assert 0 < wanted <= always_up
    # exposed beyond loopback, so every pod carries the apps' bearer token from a Secret
    assert serve["http_options"]["host"] == "0.0.0.0"
    cluster = spec["rayClusterConfig"]
    pods = [cluster["headGroupSpec"]] + cluster["workerGroupSpecs"]
    for pod in pods:
        (container,) = pod["template"]["spec"]["containers"]
        assert _env(container)["HOTSTEP_TOKEN"] == "hotstep-http"


def test_serve_config_points_at_the_studio_builder():
    (config,) = _load("serve_apps/studio.yaml")
    assert config["http_options"]["host"] == "127.0.0.1"
    (application,) = config["applications"]
    module, attr = application["import_path"].split(":")
    import importlib

    assert callable(getattr(importlib.import_module(module), attr))
    (deployment,) = application["deployments"]
    assert deployment["name"] == "Studio" and deployment["num_replicas"] == 1


def test_shipped_audition_gpu_shares_are_the_ones_defined_in_contracts():
    """YAML cannot import the constants: each shipped audition Serve config is checked against
    them, so the shares stay defined once (`core.contracts`) for the Serve app's defaults, the
    YAMLs and the studio's audition job."""
    from hotstep_ray.core.contracts import (
        AUDITION_DECODER_GPUS,
        AUDITION_DIT_GPUS,
        AUDITION_LM_GPUS,
    )

    wanted = {
        "CodesDecoder": AUDITION_DECODER_GPUS,
        "PlannerLM": AUDITION_LM_GPUS,
        "DitAudition": AUDITION_DIT_GPUS,
        "AuditionIngress": 0,
    }
    (service,) = _load("cluster/kuberay-rayservice.yaml")
    in_cluster = yaml.safe_load(service["spec"]["serveConfigV2"])["applications"]
    local = _load("serve_apps/audition.yaml")[0]["applications"]
    for applications in (in_cluster, local):
        (audition,) = [a for a in applications if a["name"] == "audition"]
        shares = {
            d["name"]: d["ray_actor_options"].get("num_gpus", 0) for d in audition["deployments"]
        }
        assert shares == wanted
