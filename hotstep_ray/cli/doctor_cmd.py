"""`hotstep-ray doctor`: is this machine ready? One row per check, each with how to fix it.

    hotstep-ray doctor [--data DIR] [--checkpoints DIR]

ok = ready; warn = works, with less (no GPU, no provider key, no real weights); fail = a stage
cannot run. Exit code 1 when anything fails. Provider keys are reported as set or not: their
values are never read beyond that, let alone printed.
"""

from __future__ import annotations

import importlib
import io
import os
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import typer
from rich.markup import escape
from rich.table import Table

from hotstep_ray.cli.common import EXIT_FAILURE, console

Status = Literal["ok", "warn", "fail"]
MIN_PYTHON = (3, 11)
# Which feature each key turns on (labeling/genius.py, labeling/captions.py).
PROVIDER_KEYS = {
    "GENIUS_ACCESS_TOKEN": "Genius lyrics lookup",
    "GEMINI_API_KEY": "Gemini audio captions",
    "OPENAI_API_KEY": "OpenAI-compatible audio captions",
}
INSTALL = "make install (or: .venv/bin/pip install -r requirements.txt -c constraints.txt)"


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""


def check_python() -> list[Check]:
    version = ".".join(map(str, sys.version_info[:3]))
    if sys.version_info[:2] >= MIN_PYTHON:
        return [Check("python", "ok", f"{version} ({sys.executable})")]
    need = ".".join(map(str, MIN_PYTHON))
    return [Check("python", "fail", version, f"use Python {need}+ (make finds python3.11)")]


def check_torch() -> list[Check]:
    try:
        import torch
    except ImportError as exc:
        return [Check("torch", "fail", f"not importable: {exc}", INSTALL)]
    rows = [Check("torch", "ok", torch.__version__)]
    if not torch.cuda.is_available():
        rows.append(
            Check(
                "cuda",
                "warn",
                "no GPU visible: the demo runs on the tiny CPU checkpoint",
                "real weights need an NVIDIA GPU and a CUDA build of torch (README: Real weights)",
            )
        )
        return rows
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        detail = f"{props.name}, {props.total_memory / 2**30:.1f} GiB, CUDA {torch.version.cuda}"
        rows.append(Check(f"cuda:{index}", "ok", detail))
    return rows


def check_ray() -> list[Check]:
    try:
        import ray
    except ImportError as exc:
        return [Check("ray", "fail", f"not importable: {exc}", INSTALL)]
    return [Check("ray", "ok", f"{ray.__version__} (local Ray starts on demand)")]


def check_essentia() -> list[Check]:
    try:
        essentia = importlib.import_module("essentia")
    except ImportError as exc:
        return [Check("essentia", "fail", f"not importable: {exc}", INSTALL)]
    return [Check("essentia", "ok", f"{essentia.__version__} (BPM/key analysis)")]


def check_soundfile() -> list[Check]:
    try:
        import numpy as np
        import soundfile as sf
    except (ImportError, OSError) as exc:
        return [Check("soundfile", "fail", f"not importable: {exc}", INSTALL)]
    detail = f"{sf.__version__}, libsndfile {sf.__libsndfile_version__}"
    try:  # the example songs include an MP3; reading and writing it needs libsndfile >= 1.1
        buffer = io.BytesIO()
        sf.write(buffer, np.zeros((4800, 2), np.float32), 48000, format="MP3")
    except Exception as exc:  # libsndfile reports an unsupported format in several ways
        fix = "install soundfile >= 0.12 (its wheel bundles a libsndfile with MP3)"
        return [Check("soundfile", "fail", f"{detail}; MP3 write failed: {exc}", fix)]
    formats = sorted(set(sf.available_formats()) & {"WAV", "FLAC", "OGG", "MP3"})
    return [Check("soundfile", "ok", f"{detail}; {', '.join(formats)} (MP3 write ok)")]


def check_checkpoints(checkpoints: Path | None) -> list[Check]:
    if checkpoints is None:
        return [
            Check(
                "checkpoints",
                "warn",
                "none given: the demo writes and uses a tiny CPU checkpoint",
                "for real adapters pass --checkpoints DIR (README: Real weights)",
            )
        ]
    from hotstep_ray.models.discovery import discover, missing_for_stages
    from hotstep_ray.models.errors import CheckpointError

    try:
        components = discover(checkpoints)
    except CheckpointError as exc:
        return [Check("checkpoints", "fail", str(exc), "pass the folder the downloader filled")]
    rows = []
    for info in components:
        label = f"{info.kind} {info.variant or ''}".strip()
        if info.usable:
            rows.append(Check(f"  {info.name}", "ok", f"{label}, {info.dtype or '?'}"))
        else:
            problems = "; ".join(info.problems)
            rows.append(Check(f"  {info.name}", "warn", f"{label}: {problems}", "re-download it"))
    for stage, missing in missing_for_stages(components).items():
        required = [kind for kind in missing if "optional" not in kind]
        if required:
            fix = f"add {', '.join(required)} under {checkpoints} (README: Real weights)"
            rows.append(Check(f"stage {stage}", "fail", f"missing {', '.join(required)}", fix))
        elif missing:
            rows.append(Check(f"stage {stage}", "warn", f"ready; no {', '.join(missing)}"))
        else:
            rows.append(Check(f"stage {stage}", "ok", "ready"))
    return [Check("checkpoints", "ok", str(checkpoints)), *rows]


def check_storage(data: str) -> list[Check]:
    """Write, read back and delete a probe file under the storage root."""
    from hotstep_ray.core.storage import Storage

    key = f".doctor/probe-{uuid.uuid4().hex[:12]}"
    payload = b"hotstep-ray doctor probe\n"
    try:
        storage = Storage(data)
        storage.write_bytes(key, payload)
        same = storage.read_bytes(key) == payload
        storage.delete(".doctor", recursive=True)
    except Exception as exc:  # any backend error is the finding itself
        fix = "check the path and permissions (s3://: AWS_* credentials and the bucket policy)"
        return [Check("storage", "fail", f"{data}: {type(exc).__name__}: {exc}", fix)]
    if not same:
        return [Check("storage", "fail", f"{storage.url}: read back differs", "check the backend")]
    return [Check("storage", "ok", f"{storage.url}: write, read, delete ok")]


def check_keys(env: dict[str, str] | None = None) -> list[Check]:
    env = dict(os.environ) if env is None else env
    rows = []
    for name, feature in PROVIDER_KEYS.items():
        if env.get(name):
            rows.append(Check(name, "ok", f"set: {feature} available"))
        else:
            fix = f"export {name} to enable it"
            rows.append(Check(name, "warn", f"not set: no {feature} (offline works)", fix))
    return rows


def run_checks(data: str, checkpoints: Path | None) -> list[Check]:
    steps: list[Callable[[], list[Check]]] = [
        check_python,
        check_torch,
        check_ray,
        check_essentia,
        check_soundfile,
        lambda: check_checkpoints(checkpoints),
        lambda: check_storage(data),
        check_keys,
    ]
    rows: list[Check] = []
    for step in steps:
        rows.extend(step())
    return rows


def doctor(
    data: str = typer.Option("./data", help="Storage root to probe (a folder or s3://…)."),
    checkpoints: Path | None = typer.Option(
        None, help="ACE-Step 1.5 checkpoints folder to check (default: none; the demo's tiny)."
    ),
) -> None:
    """Check the environment: Python, torch/CUDA, Ray, Essentia, audio I/O, weights, storage, keys.

    Prints what is missing and how to fix it; exit code 1 if anything fails."""
    rows = run_checks(data, checkpoints)
    table = Table(title="hotstep-ray doctor")
    for column in ("check", "status", "detail", "how to fix"):
        table.add_column(column, overflow="fold")
    style = {"ok": "green", "warn": "yellow", "fail": "bold red"}
    for row in rows:
        status = f"[{style[row.status]}]{row.status}[/]"
        table.add_row(escape(row.name), status, escape(row.detail), escape(row.fix))
    console.print(table)
    failed = [row.name.strip() for row in rows if row.status == "fail"]
    if failed:
        console.print(f"[bold red]not ready:[/] {', '.join(failed)}", soft_wrap=True)
        raise typer.Exit(EXIT_FAILURE)
    warned = sum(row.status == "warn" for row in rows)
    console.print(f"[green]ready[/] ({warned} warning{'s' if warned != 1 else ''})")
