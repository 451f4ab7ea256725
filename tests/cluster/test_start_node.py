"""cluster/start-node.py: GPU memory detection (a fake nvidia-smi), the `ray start` it execs (a
fake ray that records its argv and env), and token auth."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "cluster" / "start-node.py"
# what nvidia-smi --query-gpu=index,uuid,memory.total prints for these cards (MiB)
A10G, L40S, H100 = 23028, 46068, 81559


def _fake(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


def _nvidia_smi(folder: Path, *mib: int) -> Path:
    lines = "".join(f"{i}, GPU-{i:04d}, {m}\\n" for i, m in enumerate(mib))
    return _fake(folder / "nvidia-smi", f'printf "{lines}"\n')


def _run(tmp_path: Path, *args: str, env: dict[str, str] | None = None, token: bool = True):
    """Run the script with HOME = tmp_path/home (token file there unless `token=False`)."""
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True, exist_ok=True)
    if token:
        (home / ".ray" / "auth_token").write_text("s3cr3t-token")
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RAY_AUTH", "RAY_TRAIN", "CUDA_VIS"))
    }
    full = {**base, "HOME": str(home), "PATH": f"{tmp_path}:{os.environ['PATH']}", **(env or {})}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=full, timeout=60
    )


def _plan(tmp_path: Path, *args: str, **kwargs) -> dict:
    done = _run(tmp_path, "--dry-run", *args, **kwargs)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize(
    ("cards", "expected"),
    [((A10G,), 24), ((L40S,), 48), ((H100,), 85), ((L40S, L40S), 96), ((A10G, L40S), 48)],
)
def test_worker_declares_vram_gb_of_its_cards(tmp_path, cards, expected):
    _nvidia_smi(tmp_path, *cards)
    plan = _plan(tmp_path, "--address", "10.0.0.5:6379")
    assert plan["num_gpus"] == len(cards) and plan["vram_gb"] == expected
    assert f"--num-gpus={len(cards)}" in plan["command"]
    assert f'--resources={{"VRAM_GB": {expected}}}' in plan["command"]
    assert plan["command"][1:3] == ["start", "--address=10.0.0.5:6379"]


def test_cpu_node_and_head_declare_no_vram(tmp_path):
    # nvidia-smi without a driver or GPU (a CPU node built from a GPU image): a CPU node
    no_driver = _fake(tmp_path / "no-driver", "echo 'NVIDIA-SMI has failed' >&2; exit 9\n")
    plan = _plan(tmp_path, "--address", "h:6379", "--nvidia-smi", str(no_driver))
    assert plan["num_gpus"] == 0 and plan["vram_gb"] == 0
    assert not any(arg.startswith("--resources") for arg in plan["command"])
    # a head on a GPU machine keeps its cards out of Ray unless told otherwise
    _nvidia_smi(tmp_path, H100)
    head = _plan(tmp_path, "--head")
    assert "--num-gpus=0" in head["command"] and head["vram_gb"] == 0
    assert "--head" in head["command"] and any("left out" in n for n in head["notes"])
    assert _plan(tmp_path, "--head", "--head-gpus")["vram_gb"] == 85


def test_cuda_visible_devices_and_overrides(tmp_path):
    _nvidia_smi(tmp_path, A10G, L40S, L40S)
    plan = _plan(tmp_path, "--address", "h:6379", env={"CUDA_VISIBLE_DEVICES": "1,GPU-0002"})
    assert plan["gpus_mib"] == [L40S, L40S] and plan["vram_gb"] == 96
    plan = _plan(
        tmp_path, "--address", "h:6379", "--vram-gb", "40", "--resource", "labeler=1", "--", "-v"
    )
    assert '--resources={"VRAM_GB": 40, "labeler": 1.0}' in plan["command"]
    assert plan["command"][-1] == "-v"
    bad = _run(tmp_path, "--address", "h:6379", env={"CUDA_VISIBLE_DEVICES": "7"})
    assert bad.returncode == 2 and "CUDA_VISIBLE_DEVICES names '7'" in bad.stderr
    clash = _run(tmp_path, "--address", "h:6379", "--", "--resources={}")
    assert clash.returncode == 2 and "--resources is set by this script" in clash.stderr


def test_token_auth_is_required_and_found_where_ray_looks(tmp_path):
    _nvidia_smi(tmp_path)
    missing = _run(tmp_path, "--address", "h:6379", token=False)
    assert missing.returncode == 2 and "no Ray auth token" in missing.stderr
    plan = _plan(tmp_path, "--address", "h:6379", token=False, env={"RAY_AUTH_TOKEN": "x"})
    assert plan["env"] == {"RAY_AUTH_MODE": "token", "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5"}
    assert plan["notes"] == ["auth token: RAY_AUTH_TOKEN"]
    empty = tmp_path / "empty"
    empty.write_text("")
    bad_path = _run(tmp_path, "--address", "h:6379", env={"RAY_AUTH_TOKEN_PATH": str(empty)})
    assert bad_path.returncode == 2 and "missing or empty" in bad_path.stderr
    off = _plan(tmp_path, "--address", "h:6379", token=False, env={"RAY_AUTH_MODE": "disabled"})
    assert off["env"] == {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5"}
    assert "anyone who reaches" in off["notes"][0]
    assert "s3cr3t" not in _run(tmp_path, "--head", "--dry-run").stdout  # never printed


def test_execs_ray_start_with_token_mode_and_generates_the_token(tmp_path):
    _nvidia_smi(tmp_path, L40S)
    record = tmp_path / "record.txt"  # the exec'd argv, one per line, then RAY_AUTH_MODE
    fake_ray = _fake(
        tmp_path / "ray",
        'if [ "$1" = get-auth-token ]; then mkdir -p "$HOME/.ray"; '
        'printf generated > "$HOME/.ray/auth_token"; echo generated; exit 0; fi\n'
        f'printf "%s\\n" "$@" "mode=$RAY_AUTH_MODE" > {record}\n',
    )
    done = _run(tmp_path, "--head", "--generate-token", "--ray", str(fake_ray), token=False)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "home" / ".ray" / "auth_token").read_text() == "generated"
    assert "generated" not in done.stdout  # the token stays off the terminal
    seen = record.read_text().splitlines()
    assert seen == ["start", "--head", "--port=6379", "--num-gpus=0", "mode=token"]

    done = _run(tmp_path, "--address", "h:6379", "--ray", str(fake_ray))
    assert done.returncode == 0, done.stderr
    seen = record.read_text().splitlines()
    resources = '--resources={"VRAM_GB": 48}'
    assert seen == ["start", "--address=h:6379", "--num-gpus=1", resources, "mode=token"]


def test_ray_trains_poll_interval_is_set_unless_given(tmp_path):
    """Each Ray Train report waits for the controller's next poll: 0.5 s rather than Ray's 2 s,
    and an interval the operator set is theirs."""
    _nvidia_smi(tmp_path)
    given = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "3"}
    plan = _plan(tmp_path, "--address", "h:6379", env=given)
    assert "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S" not in plan["env"]
