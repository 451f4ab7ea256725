"""`audition serve`'s options are the app contract's fields: the given ones reach it, the rest keep
the contract's defaults (written only there), and a bad value is one `error:` line, exit 2,
before Ray starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from hotstep_ray.audition.options import AuditionAppConfig
from hotstep_ray.cli.main import app


class _Deployed(Exception):
    """Stands in for the app going up: the command would block from there on."""


@pytest.fixture
def built(monkeypatch) -> list[AuditionAppConfig]:
    """The configs `audition serve` builds its app from; Ray and Serve are never started."""
    from ray import serve

    from hotstep_ray.audition import serve_app
    from hotstep_ray.distributed import runtime

    seen: list[AuditionAppConfig] = []

    def build_app(config: AuditionAppConfig) -> None:
        seen.append(config)
        raise _Deployed

    monkeypatch.setattr(runtime, "ensure_ray", lambda *args, **kwargs: None)
    monkeypatch.setattr(serve, "start", lambda **kwargs: None)
    monkeypatch.setattr(serve_app, "build_app", build_app)
    return seen


def _serve(args: list[str]):
    return CliRunner().invoke(app, ["audition", "serve", *args], terminal_width=200)


def test_options_not_given_keep_the_contracts_defaults(built, tmp_path: Path) -> None:
    result = _serve(["--checkpoints", str(tmp_path), "--data", "store"])
    assert isinstance(result.exception, _Deployed), result.output
    (config,) = built
    assert config == AuditionAppConfig(checkpoints=str(tmp_path.resolve()), data="store")
    assert config.decode_mode == "auto" and config.enable_dit


def test_given_options_reach_the_contract(built, tmp_path: Path) -> None:
    args = ["--checkpoints", str(tmp_path), "--decode-mode", "compiled", "--no-enable-dit"]
    args += ["--lm", "acestep-5Hz-lm-0.6B", "--lm-gpus", "0.3", "--cpu-threads", "2"]
    result = _serve(args)
    assert isinstance(result.exception, _Deployed), result.output
    (config,) = built
    assert (config.decode_mode, config.enable_dit, config.lm) == (
        "compiled",
        False,
        "acestep-5Hz-lm-0.6B",
    )
    assert (config.lm_gpus, config.cpu_threads, config.data) == (0.3, 2, "./data")


def test_a_bad_value_is_one_error_line_before_ray_starts(built, tmp_path: Path) -> None:
    base = ["--checkpoints", str(tmp_path)]
    result = _serve([*base, "--decode-mode", "fast", "--lm-gpus", "-1"])
    assert result.exit_code == 2, result.output
    assert sorted(result.output.splitlines()) == [
        "error: --decode-mode must be one of auto, eager, static, graph, compiled (got fast)",
        "error: --lm-gpus must be ≥ 0 (got -1)",
    ]
    assert built == []


def test_help_shows_the_contracts_default_and_no_token_option() -> None:
    import typer

    serve = typer.main.get_command(app).commands["audition"].commands["serve"]
    options = {param.name: param for param in serve.params}
    mode = options["decode_mode"]
    assert mode.metavar == "<auto|eager|static|graph|compiled>"
    assert mode.help.endswith("Default: auto.")
    assert options["enable_dit"].opts == ["--enable-dit"]
    assert "token" not in options  # from $HOTSTEP_TOKEN only
