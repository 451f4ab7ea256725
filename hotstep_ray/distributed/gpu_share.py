"""GPU memory as a Ray resource, and how much of a GPU one training worker asks for.

Nodes declare their GPU memory as the custom resource `VRAM_GB` (decimal GB, 1e9 bytes: the
trainers' unit), the smallest visible card's GB rounded down times the number of cards
(`cluster/start-node.py` on machines you manage; `local_ray_resources` for the local Ray a driver
starts on a GPU machine). A trainer predicts the GB its worker needs and asks for that much.

A single-worker job also asks for only the share of a GPU its memory takes (`need / GB per card`,
rounded up to a hundredth): a DiT and an LM adapter run, each far smaller than an H200, then train
side by side on one card instead of one waiting for the other, while the GPU fraction still keeps
two jobs from promising one card more memory than it has. A data-parallel job (several workers)
asks for whole GPUs: two of its ranks must never land on one card.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from typing import Any

VRAM_RESOURCE = "VRAM_GB"
GB = 1e9
MIB = 1024 * 1024


def card_gb(card_mib: list[int]) -> int:
    """`VRAM_GB` of a node: decimal GB of its smallest card, rounded down, times its cards."""
    if not card_mib:
        return 0
    return math.floor(min(card_mib) * MIB / GB) * len(card_mib)


def local_card_mib(nvidia_smi: str | None = None) -> list[int]:
    """Total MiB of each GPU this machine's `nvidia-smi` lists and `CUDA_VISIBLE_DEVICES` (indices)
    leaves visible; [] without nvidia-smi, without a driver or with a value it cannot read."""
    binary = nvidia_smi or shutil.which("nvidia-smi")
    if not binary:
        return []
    command = [binary, "--query-gpu=index,memory.total", "--format=csv,noheader,nounits"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    cards: dict[str, int] = {}
    for line in done.stdout.splitlines() if done.returncode == 0 else []:
        index, _, mib = (field.strip() for field in line.partition(","))
        if mib.isdigit():
            cards[index] = int(mib)
    wanted = os.environ.get("CUDA_VISIBLE_DEVICES")
    if wanted is None:
        return list(cards.values())
    # UUIDs or "-1" select nothing we can size here: no declaration then, plain GPU placement
    return [cards[item.strip()] for item in wanted.split(",") if item.strip() in cards]


def local_ray_resources(nvidia_smi: str | None = None) -> dict[str, float]:
    """Custom resources for a local Ray started on this machine: its `VRAM_GB` when it has GPUs."""
    gb = card_gb(local_card_mib(nvidia_smi))
    return {VRAM_RESOURCE: float(gb)} if gb else {}


def smallest_card_gb(nodes: list[dict[str, Any]]) -> float | None:
    """GB per card of the smallest card among the alive GPU nodes that declare `VRAM_GB`
    (`ray.nodes()` entries); None when none does."""
    sizes = []
    for node in nodes:
        resources = node.get("Resources") or {}
        gpus, vram = resources.get("GPU", 0), resources.get(VRAM_RESOURCE, 0)
        if node.get("Alive") and gpus > 0 and vram > 0:
            sizes.append(vram / gpus)
    return min(sizes) if sizes else None


def gpu_worker_resources(need_gb: float, num_workers: int, nodes: list[dict[str, Any]]) -> dict:
    """`resources_per_worker` of a GPU training worker that needs `need_gb` of GPU memory: a whole
    GPU when no node declares `VRAM_GB`; else that memory as `VRAM_GB` and, for a one-worker job,
    the share of the smallest card it takes (module docstring)."""
    per_card = smallest_card_gb(nodes)
    if per_card is None:
        return {"GPU": 1}
    share = 1.0
    if num_workers == 1:
        share = min(1.0, math.ceil(100 * need_gb / per_card) / 100)
    return {"GPU": share, VRAM_RESOURCE: need_gb}
