"""What this studio can do right now: checkpoints, label providers, GPUs, stages.

Every probe degrades on its own (the seed's rule): a missing checkpoints folder or a Ray that is not
connected is reported in its section, never as an error of the whole answer. Provider keys are
reported as present or absent only; their values never leave the process.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from hotstep_ray.studio import stages

PROVIDER_KEYS = {
    "genius": "GENIUS_ACCESS_TOKEN",
    "gemini": "GEMINI_API_KEY",
    "openai": "OPENAI_API_KEY",
}


def _key_present(name: str) -> bool:
    return bool(os.environ.get(name, "").strip())


def checkpoints(folder: str) -> dict[str, Any]:
    report: dict[str, Any] = {"dir": folder, "available": False, "components": []}
    if not folder or not Path(folder).is_dir():
        report["error"] = "no checkpoints folder (set HOTSTEP_CHECKPOINTS or --checkpoints)"
        return report
    from hotstep_ray.models.discovery import discover, missing_for_stages
    from hotstep_ray.models.errors import CheckpointError

    try:
        found = discover(folder)
    except CheckpointError as exc:
        report["error"] = str(exc)
        return report
    report["available"] = any(info.usable for info in found)
    report["components"] = [info.to_dict() for info in found]
    report["missingForStages"] = missing_for_stages(found)
    return report


def essentia_available() -> bool:
    if importlib.util.find_spec("essentia") is None:
        return False
    try:
        from hotstep_ray.labeling.analysis import essentia_available as probe
    except ImportError:
        return True  # importable; the labeling package decides how to use it
    return probe()


def providers() -> dict[str, Any]:
    llm = {name: {"configured": _key_present(PROVIDER_KEYS[name])} for name in ("gemini", "openai")}
    return {
        "essentia": {"available": essentia_available()},
        "genius": {"configured": _key_present(PROVIDER_KEYS["genius"])},
        "llm": {"configured": any(p["configured"] for p in llm.values()), "providers": llm},
    }


def gpus() -> dict[str, Any]:
    """GPUs and `VRAM_GB` from the Ray cluster this server joined (none when not joined)."""
    try:
        import ray
    except ImportError:
        return {"rayConnected": False, "total": 0, "available": 0, "nodes": []}
    if not ray.is_initialized():
        return {"rayConnected": False, "total": 0, "available": 0, "nodes": []}
    total = ray.cluster_resources()
    free = ray.available_resources()
    nodes = [
        {
            "nodeId": node["NodeID"],
            "address": node.get("NodeManagerAddress", ""),
            "gpus": node["Resources"].get("GPU", 0),
            "vramGb": node["Resources"].get("VRAM_GB", 0),
            "cpus": node["Resources"].get("CPU", 0),
        }
        for node in ray.nodes()
        if node.get("Alive")
    ]
    return {
        "rayConnected": True,
        "total": total.get("GPU", 0),
        "available": free.get("GPU", 0),
        "vramGb": total.get("VRAM_GB", 0),
        "nodes": nodes,
    }


def capabilities(checkpoints_dir: str) -> dict[str, Any]:
    return {
        "checkpoints": checkpoints(checkpoints_dir),
        "providers": providers(),
        "gpus": gpus(),
        "stages": stages.availability(),
    }
