"""torch.compile's caches live under the storage root, so a later run or Ray worker loads what
an earlier one compiled; a user's own cache variables win."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hotstep_ray.core.compile_cache import (
    CACHE_VARS,
    HOME_CACHE,
    compile_cache_env,
    compile_cache_vars,
    use_compile_cache,
)
from hotstep_ray.core.storage import Storage


def _clear(monkeypatch) -> None:
    for name in CACHE_VARS:
        monkeypatch.delenv(name, raising=False)


def test_a_local_root_keeps_the_caches_beside_its_runs(tmp_path, monkeypatch):
    _clear(monkeypatch)
    env = use_compile_cache(Storage(tmp_path))
    assert env == {
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache" / "compile" / "inductor"),
        "TRITON_CACHE_DIR": str(tmp_path / "cache" / "compile" / "triton"),
    }
    assert {name: os.environ[name] for name in CACHE_VARS} == env
    assert compile_cache_vars() == env  # what ensure_ray hands its workers


def test_an_object_store_root_uses_each_machines_home_and_the_users_choice_wins(monkeypatch):
    _clear(monkeypatch)
    monkeypatch.setenv("TRITON_CACHE_DIR", "/mine/triton")
    env = compile_cache_env(Storage("memory://bucket/root"))
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(HOME_CACHE.expanduser() / "inductor")
    assert env["TRITON_CACHE_DIR"] == "/mine/triton"


@pytest.mark.slow  # a fresh process importing torch and compiling on the CPU
def test_a_compile_writes_into_the_cache_under_the_root(tmp_path):
    """End to end in a fresh process: the variables reach Inductor, which writes its code there."""
    code = (
        "import sys, torch\n"
        "from hotstep_ray.core.compile_cache import use_compile_cache\n"
        "from hotstep_ray.core.storage import Storage\n"
        "use_compile_cache(Storage(sys.argv[1]))\n"
        "f = torch.compile(lambda x: torch.sin(x) * 2 + 1)\n"
        "print(float(f(torch.ones(8)).sum()))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in CACHE_VARS}
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    inductor = Path(tmp_path) / "cache" / "compile" / "inductor"
    assert any(inductor.rglob("*.py")), sorted(str(p) for p in inductor.rglob("*"))[:20]
