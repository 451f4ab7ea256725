"""Where torch.compile keeps what it compiled: Inductor's FX-graph, AOTAutograd and autotuning
caches and Triton's kernels. With them kept, a second run (another process, a Ray Train worker,
tomorrow's rerun) loads the compiled DiT blocks and LM layers instead of compiling them again;
by default they live in /tmp and go with the machine's next reboot.

Under a local storage root they go to `<root>/cache/compile/`, beside the runs that use them.
Compilers write plain files, so with an object-store root (`s3://...`) each machine keeps its own
under `~/.cache/hotstep-ray/compile/`. A user's own TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR
always win. Nothing here imports torch: the variables only need to be set before it compiles.
"""

from __future__ import annotations

import os
from pathlib import Path

from hotstep_ray.core.storage import Storage

COMPILE_CACHE_KEY = "cache/compile"
HOME_CACHE = Path("~/.cache/hotstep-ray/compile")
# variable -> sub-folder of the cache
CACHE_VARS = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}


def compile_cache_dir(storage: Storage) -> Path:
    if storage.is_local:
        return storage.local_path(COMPILE_CACHE_KEY)
    return HOME_CACHE.expanduser()


def compile_cache_env(storage: Storage) -> dict[str, str]:
    """The cache variables for runs on `storage`: the ones already set keep their values."""
    root = compile_cache_dir(storage)
    return {name: os.environ.get(name) or str(root / sub) for name, sub in CACHE_VARS.items()}


def use_compile_cache(storage: Storage) -> dict[str, str]:
    """Set the cache variables in this process (and so in the Ray it starts next) unless set."""
    env = compile_cache_env(storage)
    for name, value in env.items():
        os.environ.setdefault(name, value)
    return env


def compile_cache_vars() -> dict[str, str]:
    """The cache variables set in this process, for a Ray job's `runtime_env` (workers on a
    cluster started elsewhere do not inherit this process's environment)."""
    return {name: os.environ[name] for name in CACHE_VARS if os.environ.get(name)}
