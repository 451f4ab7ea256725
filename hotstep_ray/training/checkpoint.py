"""Resumable training checkpoints through `Storage`, with no pickle anywhere.

A checkpoint folder holds:

    checkpoint.json                      manifest, written LAST (one atomic write)
    adapter-<step>-<id>.safetensors      adapter tensors, canonical keys, training dtype (exact)
    state-<step>-<id>.safetensors        every other tensor: optimizer moments, torch RNG states

The manifest carries step, epoch, the resolved config, the base-model fingerprint, the adapter
spec, sha256 of both payload files, and a JSON tree (optimizer state dict, RNG states, caller
extras such as stop-rule and milestone state) whose tensors are placeholders into the state file.
Payload names are unique per save and the manifest is replaced atomically, so a crash mid-save
leaves the previous checkpoint intact on a local disk and on S3 alike; superseded payloads are
deleted after the new manifest lands.

`load_checkpoint` refuses a base model whose fingerprint differs: sha256 over the sorted
(name, shape, dtype) of every non-adapter tensor (peft's `.base_layer` folded away, so injected and
raw models agree) plus 8 evenly spaced values of each. Fingerprint the model unmerged.
"""

from __future__ import annotations

import hashlib
import random
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from safetensors.torch import load as load_safetensors_bytes
from safetensors.torch import save as save_safetensors_bytes
from torch import nn

from hotstep_ray.core.errors import HotstepError
from hotstep_ray.core.storage import Storage
from hotstep_ray.training import adapters

MANIFEST = "checkpoint.json"
FORMAT = "hotstep-ray-checkpoint-v1"
_PAYLOAD = re.compile(r"^(adapter|state)-\d{8}-[0-9a-f]{8}\.safetensors$")
_SAMPLES_PER_TENSOR = 8


class CheckpointMismatchError(HotstepError, ValueError):
    """The checkpoint belongs to another base model (or is damaged); resuming would be wrong."""


@dataclass
class CheckpointState:
    step: int
    epoch: int
    config: dict[str, Any]
    fingerprint: str
    extra: Any = None
    files: dict[str, str] = field(default_factory=dict)


# -- fingerprint ---------------------------------------------------------------------------------
def _is_adapter_name(name: str) -> bool:
    return any(part.startswith(("lora_", "lokr_")) for part in name.split("."))


@torch.no_grad()
def model_fingerprint(model: nn.Module) -> str:
    """sha256 of the base model's tensor names, shapes, dtypes and a few values each."""
    digest = hashlib.sha256()
    tensors = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if not _is_adapter_name(name):
            tensors[name.replace(".base_layer.", ".")] = tensor
    for name in sorted(tensors):
        tensor = tensors[name].detach()
        digest.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}\n".encode())
        flat = tensor.reshape(-1)
        numel = flat.numel()
        if numel:
            # Evenly spaced indices in integer arithmetic (a float32 linspace overshoots > 2^24).
            count = min(_SAMPLES_PER_TENSOR, numel)
            index = [i * (numel - 1) // max(1, count - 1) for i in range(count)]
            picked = flat[torch.tensor(index, device=flat.device)]
            digest.update(picked.double().cpu().numpy().tobytes())
    return digest.hexdigest()


# -- JSON + tensor trees -------------------------------------------------------------------------
def encode_tree(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """JSON-able form of `obj`; tensors move into `tensors` and leave a placeholder. Dict keys keep
    their type (optimizer state is keyed by int), tuples stay tuples."""
    if isinstance(obj, torch.Tensor):
        name = f"t{len(tensors)}"
        tensors[name] = obj.detach().cpu().contiguous()
        return {"__tensor__": name}
    if isinstance(obj, dict):
        return {"__dict__": [[k, encode_tree(v, tensors)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tuple__": [encode_tree(v, tensors) for v in obj]}
    if isinstance(obj, list):
        return [encode_tree(v, tensors) for v in obj]
    if isinstance(obj, np.ndarray):
        return {"__ndarray__": obj.tolist(), "dtype": str(obj.dtype)}
    if isinstance(obj, np.generic):
        return obj.item()
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    raise TypeError(f"cannot store {type(obj).__name__} in a checkpoint (no pickle)")


def decode_tree(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, list):
        return [decode_tree(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        if "__dict__" in obj:
            return {k: decode_tree(v, tensors) for k, v in obj["__dict__"]}
        if "__tuple__" in obj:
            return tuple(decode_tree(v, tensors) for v in obj["__tuple__"])
        if "__ndarray__" in obj:
            return np.asarray(obj["__ndarray__"], dtype=obj["dtype"])
    return obj


# -- RNG -----------------------------------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    """Python, numpy (legacy global), torch CPU and every CUDA device generator."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch_cpu": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["torch_cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch_cpu"])
    cuda = state.get("torch_cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


# -- when ----------------------------------------------------------------------------------------
def due(epoch: int, last_saved: float, every_s: float, every_epochs: int, now: float) -> bool:
    """Whether the checkpoint at the end of `epoch` is due (`contracts.CheckpointCadence`):
    `every_s` seconds since `last_saved` (unix s; 0 = none yet, so the first epoch's is due), or
    every `every_epochs` epochs. The run's last epoch is the caller's to force."""
    return bool(every_epochs and epoch % every_epochs == 0) or now - last_saved >= every_s


# -- save / load ---------------------------------------------------------------------------------
def _join(key: str, name: str) -> str:
    return f"{key.rstrip('/')}/{name}" if key else name


def save_checkpoint(
    storage: Storage,
    key: str,
    *,
    model: nn.Module,
    optimizer: Any | None,
    step: int,
    epoch: int,
    config: dict[str, Any] | None = None,
    extra: Any = None,
    fingerprint: str | None = None,
) -> str:
    """Write a checkpoint folder at `key`; returns the manifest key. `optimizer` is anything with
    `state_dict()` (the `HybridOptimizer`); `extra` any tree of JSON values and tensors (schedule,
    stop rule, milestones, data-order state). RNG states are taken here, after the step."""
    token = f"{step:08d}-{uuid.uuid4().hex[:8]}"
    tensors: dict[str, torch.Tensor] = {}
    tree = encode_tree(
        {
            "optimizer": None if optimizer is None else optimizer.state_dict(),
            "rng": rng_state(),
            "extra": extra,
        },
        tensors,
    )
    adapter_state = {k: v.cpu().contiguous() for k, v in adapters.adapter_state_dict(model).items()}
    payloads = {
        "adapter": (f"adapter-{token}.safetensors", save_safetensors_bytes(adapter_state)),
        "state": (f"state-{token}.safetensors", save_safetensors_bytes(tensors)),
    }
    for name, data in payloads.values():
        storage.write_bytes(_join(key, name), data)
    info = adapters.adapter_info(model)
    manifest = {
        "format": FORMAT,
        "step": step,
        "epoch": epoch,
        "fingerprint": fingerprint or model_fingerprint(model),
        "config": config or {},
        "adapter_spec": info.spec.model_dump(mode="json"),
        "files": {part: name for part, (name, _) in payloads.items()},
        "sha256": {name: hashlib.sha256(data).hexdigest() for name, data in payloads.values()},
        "tree": tree,
    }
    manifest_key = _join(key, MANIFEST)
    storage.write_json(manifest_key, manifest)  # the commit point
    current = {name for name, _ in payloads.values()}
    for child in storage.list(key):
        name = child.rsplit("/", 1)[-1]
        if _PAYLOAD.match(name) and name not in current:
            storage.delete(child)
    return manifest_key


def read_manifest(storage: Storage, key: str) -> dict[str, Any]:
    manifest = storage.read_json(_join(key, MANIFEST))
    if manifest.get("format") != FORMAT:
        raise CheckpointMismatchError(f"{storage.url_of(key)}: not a {FORMAT} checkpoint")
    return manifest


def load_checkpoint(
    storage: Storage,
    key: str,
    *,
    model: nn.Module,
    optimizer: Any | None = None,
    fingerprint: str | None = None,
    restore_rng: bool = True,
) -> CheckpointState:
    """Restore adapter, optimizer and RNG from `key` into a freshly built model/optimizer of the
    same config; returns step/epoch/config/extra. Refuses another base model or damaged files."""
    manifest = read_manifest(storage, key)
    expected = fingerprint or model_fingerprint(model)
    if manifest["fingerprint"] != expected:
        raise CheckpointMismatchError(
            f"checkpoint {storage.url_of(key)} was made on base model "
            f"{manifest['fingerprint'][:16]}… but this model is {expected[:16]}…; "
            "resume needs the same base weights"
        )
    blobs = {}
    for part, name in manifest["files"].items():
        data = storage.read_bytes(_join(key, name))
        if hashlib.sha256(data).hexdigest() != manifest["sha256"][name]:
            raise CheckpointMismatchError(f"{storage.url_of(_join(key, name))} is damaged (sha256)")
        blobs[part] = data
    adapters.load_adapter_state(model, load_safetensors_bytes(blobs["adapter"]))
    tree = decode_tree(manifest["tree"], load_safetensors_bytes(blobs["state"]))
    if optimizer is not None:
        if tree["optimizer"] is None:
            raise CheckpointMismatchError("checkpoint holds no optimizer state")
        optimizer.load_state_dict(tree["optimizer"])
    if restore_rng:
        set_rng_state(tree["rng"])
    return CheckpointState(
        step=int(manifest["step"]),
        epoch=int(manifest["epoch"]),
        config=manifest["config"],
        fingerprint=manifest["fingerprint"],
        extra=tree["extra"],
        files=dict(manifest["files"]),
    )
