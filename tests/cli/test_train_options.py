"""Options that would do nothing where a trainer runs are refused in one line (exit 2) before
anything starts: Ray's own without `--ray` (train-dit and train-lm alike), and train-lm's
`--device` with `--ray` (each Ray worker trains on the device Ray places it on)."""

from __future__ import annotations

from typer.testing import CliRunner

from hotstep_ray.cli.train_dit_cmd import app as dit_app
from hotstep_ray.cli.train_lm_cmd import app as lm_app


def _refused(app, args: list[str], flag: str, what: str) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert text.count("error:") == 1 and f"{flag} only apply {what}" in text, text


def test_ray_only_options_are_refused_without_ray_by_both_trainers(tmp_path) -> None:
    lm = ["run", "band", "--data", str(tmp_path / "data"), "--checkpoints", str(tmp_path)]
    dit = ["run", "band", "--data", str(tmp_path / "data"), "--no-ray"]
    for extra, flag in (
        (["--workers", "2"], "--workers"),
        (["--workers", "1"], "--workers"),  # the default value, given: still did nothing
        (["--max-failures", "0"], "--max-failures"),
        (["--ray-address", "auto"], "--ray-address"),
    ):
        _refused(lm_app, [*lm, "--no-ray", *extra], flag, "with --ray")
        _refused(dit_app, [*dit, *extra], flag, "with --ray")
    _refused(
        lm_app,
        [*lm, "--workers", "2", "--max-failures", "1"],
        "--workers, --max-failures",
        "with --ray",
    )


def test_train_lm_refuses_a_device_with_ray(tmp_path) -> None:
    args = ["run", "band", "--data", str(tmp_path / "data"), "--checkpoints", str(tmp_path)]
    _refused(lm_app, [*args, "--ray", "--device", "cuda:1"], "--device", "to a run in this process")
    assert not (tmp_path / "data").exists()  # refused before Ray or a job started
