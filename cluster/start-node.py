#!/usr/bin/env python3
"""Start a Ray node for hotstep-ray on a machine you manage yourself (bare metal, a VM, a Slurm
allocation): detect the GPUs, declare their memory as the `VRAM_GB` resource, set up token auth,
and exec `ray start`.

    cluster/start-node.py --head                          # head: no GPUs, no VRAM_GB
    cluster/start-node.py --address 10.0.0.5:6379         # worker: GPUs + VRAM_GB from nvidia-smi
    cluster/start-node.py --address ... --dry-run         # print what it would run (JSON)
    cluster/start-node.py --address ... -- --block        # anything after -- goes to `ray start`

Why `VRAM_GB`: the DiT and LM trainers ask every Ray Train worker for `{"GPU": 1, "VRAM_GB": n}`
(n = the GB the job needs, predicted before it starts), so Ray places a job only on a node whose
cards are big enough and refuses a job no node can hold, instead of letting it run out of memory.

The value: decimal GB (1e9 bytes, the trainers' unit) of the SMALLEST visible card, rounded down,
times the number of visible cards. Ray counts the resource per node, so on a node mixing card
sizes this never promises a worker more than its card has. `nvidia-smi` reports MiB:
A10G 23028 MiB -> 24, L40S 46068 -> 48, A100-80GB 81920 -> 85, H100 80GB 81559 -> 85.
A machine without `nvidia-smi` (or without GPUs) is a CPU node: `--num-gpus 0`, no `VRAM_GB`.
`CUDA_VISIBLE_DEVICES` (indices or UUIDs) limits which cards count.

Token auth (Ray 2.60): every node and every client must present the same token. This script
always starts Ray with `RAY_AUTH_MODE=token` (an explicit `RAY_AUTH_MODE=disabled` is respected,
with a warning) and refuses to start without a token, looked up where Ray looks: `RAY_AUTH_TOKEN`,
then the file named by `RAY_AUTH_TOKEN_PATH`, then `~/.ray/auth_token`. On the head,
`--generate-token` creates `~/.ray/auth_token` (`ray get-auth-token --generate`) when none exists;
copy that file to every other node (or set `RAY_AUTH_TOKEN` there from your secret store).

Only the standard library: it runs before anything else is set up on the machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

VRAM_RESOURCE = "VRAM_GB"
BYTES_PER_MIB = 1024 * 1024
BYTES_PER_GB = 1e9  # the trainers' unit (hotstep_ray/training/dit_vram.py: GB = 1e9)
RESERVED_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")
# Seconds between Ray Train's polls of its workers, for the controllers this node hosts; each
# run's start, report and end wait for a poll (2 s by Ray's default). The same value as a local
# Ray gets (hotstep_ray/distributed/runtime.py); one given in the environment is kept.
TRAIN_POLL_VAR, TRAIN_POLL_S = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5"


class NodeError(Exception):
    """A problem the user must fix; printed as one line, exit code 2."""


# =============================================================================== GPUs


def query_gpus(nvidia_smi: str | None = None) -> list[tuple[str, str, int]]:
    """(index, uuid, total MiB) per GPU that nvidia-smi lists; [] without nvidia-smi/GPUs."""
    binary = nvidia_smi or shutil.which("nvidia-smi")
    if not binary:
        return []
    command = [binary, "--query-gpu=index,uuid,memory.total", "--format=csv,noheader,nounits"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise NodeError(f"{binary} failed to run: {exc}") from exc
    if done.returncode != 0:
        # nvidia-smi present but no driver/GPU (e.g. a CPU node built from a GPU image)
        print(f"start-node: nvidia-smi exited {done.returncode}; no GPUs", file=sys.stderr)
        return []
    gpus = []
    for line in done.stdout.splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != 3:
            continue
        index, uuid, mib = fields
        try:
            gpus.append((index, uuid, int(float(mib))))
        except ValueError as exc:  # "[N/A]" and the like: refuse rather than guess
            raise NodeError(f"cannot read GPU {index}'s memory from nvidia-smi: {mib!r}") from exc
    return gpus


def visible(gpus: list[tuple[str, str, int]], cuda_visible: str | None) -> list[int]:
    """Total MiB of each GPU that `CUDA_VISIBLE_DEVICES` lets Ray use (all when unset)."""
    if cuda_visible is None:
        return [mib for _, _, mib in gpus]
    wanted = [item.strip() for item in cuda_visible.split(",") if item.strip()]
    chosen = []
    for item in wanted:
        match = [mib for index, uuid, mib in gpus if item in (index, uuid)]
        if not match:
            if item.startswith("-"):  # "-1": CUDA's way of hiding every device
                break
            raise NodeError(f"CUDA_VISIBLE_DEVICES names {item!r}, which nvidia-smi does not list")
        chosen.append(match[0])
    return chosen


def vram_gb(card_mib: list[int]) -> int:
    """Decimal GB of the smallest card, rounded down, times the number of cards."""
    if not card_mib:
        return 0
    per_card = math.floor(min(card_mib) * BYTES_PER_MIB / BYTES_PER_GB)
    return per_card * len(card_mib)


# =============================================================================== token auth


def find_token(env: dict[str, str], home: Path) -> str | None:
    """Where Ray takes its token from, in Ray's order; None when there is none."""
    if env.get("RAY_AUTH_TOKEN", "").strip():
        return "RAY_AUTH_TOKEN"
    path_var = env.get("RAY_AUTH_TOKEN_PATH", "")
    if path_var:
        path = Path(path_var).expanduser()
        if not path.is_file() or not path.read_text().strip():
            # Ray aborts on an unreadable or empty RAY_AUTH_TOKEN_PATH: say so before it does
            raise NodeError(f"RAY_AUTH_TOKEN_PATH={path_var} is missing or empty")
        return str(path)
    default = home / ".ray" / "auth_token"
    if default.is_file() and default.read_text().strip():
        return str(default)
    return None


# =============================================================================== command


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(
        prog="start-node.py", description=__doc__.split("\n\n")[0].split("\n", 1)[0]
    )
    role = parser.add_mutually_exclusive_group(required=True)
    role.add_argument("--head", action="store_true", help="start the head (no GPUs declared)")
    role.add_argument("--address", help="the head's GCS address, HOST:PORT (worker node)")
    parser.add_argument("--port", type=int, default=6379, help="head GCS port [6379]")
    parser.add_argument("--num-cpus", type=int, help="CPUs to declare (default: Ray's count)")
    parser.add_argument(
        "--vram-gb", type=int, help="declare this VRAM_GB instead of the detected value"
    )
    parser.add_argument(
        "--resource",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="another custom resource (repeatable), merged with VRAM_GB",
    )
    parser.add_argument(
        "--head-gpus",
        action="store_true",
        help="let the head use its GPUs (one-machine setups; clusters keep the head GPU-free)",
    )
    parser.add_argument(
        "--generate-token",
        action="store_true",
        help="head only: create ~/.ray/auth_token when no token exists",
    )
    parser.add_argument("--ray", help="the ray executable (default: beside python, else PATH)")
    parser.add_argument("--nvidia-smi", help="the nvidia-smi executable (default: PATH)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan as JSON and exit")
    args = parser.parse_args(argv)
    if args.generate_token and not args.head:
        parser.error("--generate-token is for the head; copy its token to the other nodes")
    for flag in ("--resources", "--num-gpus"):
        if any(item == flag or item.startswith(flag + "=") for item in extra):
            parser.error(f"{flag} is set by this script; use --resource / --vram-gb instead")
    return args, extra


def custom_resources(pairs: list[str]) -> dict[str, float]:
    resources: dict[str, float] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise NodeError(f"--resource wants NAME=VALUE, got {pair!r}")
        if name in RESERVED_RESOURCES or name == VRAM_RESOURCE:
            raise NodeError(f"--resource {name} is not a custom resource; see --help")
        try:
            resources[name] = float(value)
        except ValueError as exc:
            raise NodeError(f"--resource {name}: {value!r} is not a number") from exc
    return resources


def ray_executable(given: str | None) -> str:
    if given:
        return given
    beside = Path(sys.executable).parent / "ray"
    return str(beside) if beside.is_file() else (shutil.which("ray") or "ray")


def plan(args: argparse.Namespace, extra: list[str], env: dict[str, str], home: Path) -> dict:
    """Everything `ray start` gets: the command, the env it adds, and what was detected."""
    cards = visible(query_gpus(args.nvidia_smi), env.get("CUDA_VISIBLE_DEVICES"))
    use_gpus = not args.head or args.head_gpus
    num_gpus = len(cards) if use_gpus else 0
    declared = args.vram_gb if args.vram_gb is not None else vram_gb(cards)
    if not num_gpus:
        declared = 0  # a CPU node (or the head) never offers VRAM_GB
    resources = custom_resources(args.resource)
    if declared > 0:
        resources[VRAM_RESOURCE] = declared
    ray = ray_executable(args.ray)
    command = [ray, "start"]
    command += ["--head", f"--port={args.port}"] if args.head else [f"--address={args.address}"]
    command.append(f"--num-gpus={num_gpus}")
    if args.num_cpus is not None:
        command.append(f"--num-cpus={args.num_cpus}")
    if resources:
        command.append("--resources=" + json.dumps(resources, sort_keys=True))
    command += extra

    added: dict[str, str] = {}
    notes: list[str] = []
    if args.head and cards and not args.head_gpus:
        notes.append(f"head: {len(cards)} GPU(s) left out of Ray (--head-gpus to use them)")
    if TRAIN_POLL_VAR not in env:
        added[TRAIN_POLL_VAR] = TRAIN_POLL_S
    mode = env.get("RAY_AUTH_MODE", "").strip().lower()
    generate = False
    if mode == "disabled":
        notes.append("RAY_AUTH_MODE=disabled: anyone who reaches this node can run code on it")
    else:
        if mode not in ("", "token"):
            raise NodeError(f"RAY_AUTH_MODE={mode!r}: use 'token' (or 'disabled')")
        added["RAY_AUTH_MODE"] = "token"
        source = find_token(env, home)
        if source is None:
            if not args.generate_token:
                where = "run with --generate-token" if args.head else "copy the head's"
                raise NodeError(
                    f"no Ray auth token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, {home}/.ray/"
                    f"auth_token): {where} ~/.ray/auth_token, or set RAY_AUTH_TOKEN"
                )
            generate = True
            source = str(home / ".ray" / "auth_token")
        notes.append(f"auth token: {source}" + (" (generated now)" if generate else ""))
    return {
        "command": command,
        "env": added,
        "gpus_mib": cards,
        "num_gpus": num_gpus,
        "vram_gb": resources.get(VRAM_RESOURCE, 0),
        "generate_token": generate,
        "notes": notes,
    }


def main(argv: list[str] | None = None) -> int:
    args, extra = parse_args(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ)
    try:
        steps = plan(args, extra, env, Path.home())
    except NodeError as exc:
        print(f"start-node: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(json.dumps(steps, indent=2))
        return 0
    for note in steps["notes"]:
        print(f"start-node: {note}", file=sys.stderr)
    env.update(steps["env"])
    if steps["generate_token"]:
        ray = steps["command"][0]
        # it prints the token on stdout: keep it off the terminal and out of logs
        generate = [ray, "get-auth-token", "--generate"]
        subprocess.run(generate, env=env, check=True, stdout=subprocess.DEVNULL)
    print("start-node: " + " ".join(steps["command"]), file=sys.stderr)
    os.execvpe(steps["command"][0], steps["command"], env)
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main())
