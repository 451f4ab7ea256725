"""Shared CLI pieces: the calibration flags both trainers take."""

from __future__ import annotations

from hotstep_ray.cli.common import calibration_overrides


def test_only_the_given_calibration_flags_override_the_defaults():
    assert calibration_overrides(None, None, None) == {}
    assert calibration_overrides("0.5,1", None, 12.0) == {"scales": "0.5,1", "duration_s": 12.0}
    assert calibration_overrides(None, 3, None) == {"seeds": 3}
