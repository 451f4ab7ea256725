"""DiT audition: base vs DiT adapter with one seed, codes as hints, sampler choice."""

from __future__ import annotations

import pytest

from hotstep_ray.audition.dit_audition import DitAudition
from hotstep_ray.audition.schemas import DitRequest
from hotstep_ray.core.errors import InputError


@pytest.fixture(scope="module")
def dit(tiny_tree, data_root):
    return DitAudition.from_checkpoints(tiny_tree, data=str(data_root), device="cpu")


def test_adapter_side_differs_base_side_is_the_plain_dit(dit, runs):
    result, audio = dit.render(DitRequest(caption="rock", duration=2, seed=5, dit_adapter="crew"))
    base, tuned = result.sides
    assert (base.slot, tuned.slot) == ("base-render", "adapter-render")
    assert result.caption == "crewx, rock" and result.trigger.path == runs["dit"]
    assert base.audio_sha1 != tuned.audio_sha1
    assert result.sampler == "turbo 8 steps, shift 3"
    assert audio["base-render"].num_samples == 2 * 48000
    alone, again = dit.render(DitRequest(caption="crewx, rock", duration=2, seed=5))
    assert [s.slot for s in alone.sides] == ["base-render"]
    assert again["base-render"].audio == audio["base-render"].audio  # same seed, same bytes


def test_codes_as_hints_and_bad_requests(dit):
    hinted, _ = dit.render(DitRequest(caption="rock", duration=1, seed=1, audio_codes=[3] * 5))
    plain, _ = dit.render(DitRequest(caption="rock", duration=1, seed=1))
    assert hinted.sides[0].audio_sha1 != plain.sides[0].audio_sha1
    with pytest.raises(InputError, match="exactly 8"):
        dit.render(DitRequest(caption="rock", duration=1, steps=30))
    with pytest.raises(InputError, match="at most 8 s"):  # the tiny silence latent is 8 s
        dit.render(DitRequest(caption="rock", duration=9))
    with pytest.raises(InputError, match="outside"):
        dit.render(DitRequest(caption="rock", duration=1, audio_codes=[70000]))
