"""Same-seed A/B on the plain classes, previews and their retention."""

from __future__ import annotations

from hotstep_ray.audition.ab import PreviewStore, run_ab
from hotstep_ray.audition.decode import DecodeResult
from hotstep_ray.audition.schemas import AuditionRequest, LmRequest
from hotstep_ray.core.storage import Storage

# All metas pinned (no phase 1). top_k: the tiny LM's logits are nearly flat over 64,000 codes,
# so with one seed the exponential race picks the same code whatever the weights; restricting to
# the model's own top 8 makes its ranking (and so the adapter) decide.
PIN = {"bpm": 120, "keyscale": "C major", "timesignature": "4", "top_k": 8}


def test_ab_same_seed_base_repeats_adapter_differs(planner, decoder, tmp_path):
    store = PreviewStore(Storage(tmp_path))
    request = AuditionRequest(caption="dream pop", duration=2, seed=11, lm_adapter="band", **PIN)
    first, audio = run_ab(request, planner, decoder, store)
    second, _ = run_ab(request, planner, decoder, store)
    base, tuned = first.sides
    assert base.ok and tuned.ok and base.codes_count == tuned.codes_count == 10
    assert second.sides[0].codes_sha1 == base.codes_sha1  # base identical across calls
    assert second.sides[1].codes_sha1 == tuned.codes_sha1
    assert tuned.codes_sha1 != base.codes_sha1 and not first.identical
    assert first.caption == "band, dream pop" and first.caption_input == "dream pop"
    # The base side IS an adapterless /lm run of the caption that was sent, same seed.
    plain = planner.generate(LmRequest(caption=first.caption, duration=2, lm_seed=11, **PIN))
    assert plain.codes_sha1 == base.codes_sha1
    folder = tmp_path / "previews" / first.preview_id
    assert sorted(p.name for p in folder.iterdir()) == ["adapter.wav", "base.wav", "preview.json"]
    assert store.audio(first.preview_id, "base")[0] == audio["base"].audio
    assert [p["previewId"] for p in store.list()] == [second.preview_id, first.preview_id]


def test_ab_unknown_adapter_fails_before_anything_runs(planner, decoder, tmp_path):
    import pytest

    from hotstep_ray.audition.errors import NotFoundError

    request = AuditionRequest(caption="x", duration=1, seed=1, lm_adapter="ghost")
    with pytest.raises(NotFoundError):
        run_ab(request, planner, decoder, PreviewStore(Storage(tmp_path)))
    assert not (tmp_path / "previews").exists()


def _fake(size: int) -> dict[str, DecodeResult]:
    audio = DecodeResult(b"x" * size, "wav", 48000, 2, 1, 0.2, 1, "", 0.0)
    return {"base": audio}


def test_retention_keeps_newest_runs_within_bytes(tmp_path):
    import os

    store = PreviewStore(Storage(tmp_path), max_runs=3, max_bytes=10_000)
    for i in range(5):
        store.write(f"p{i}", {"previewId": f"p{i}"}, _fake(100))
        marker = tmp_path / "previews" / f"p{i}" / "preview.json"
        os.utime(marker, ns=(i * 10**9, i * 10**9))  # strictly increasing write times
    store.prune()
    assert sorted(p.name for p in (tmp_path / "previews").iterdir()) == ["p2", "p3", "p4"]
    store.write(
        "big", {"previewId": "big"}, _fake(9_900)
    )  # newest; with it the older ones exceed 10 kB
    kept = sorted(p.name for p in (tmp_path / "previews").iterdir())
    assert kept == ["big"]


def test_side_request_carries_every_meta_and_sampling_option():
    from hotstep_ray.audition.ab import side_request
    from hotstep_ray.audition.schemas import AuditionRequest

    request = AuditionRequest(
        caption="c", lyrics="la", duration=3, bpm=99, keyscale="D minor", timesignature="3",
        language="de", temperature=0.5, top_p=0.7, top_k=9, cfg_scale=1.5, rep_penalty=1.2,
        rep_window=32, negative_prompt="noise", max_cot_tokens=64,
    )  # fmt: skip
    side = side_request(request, "tagged c", 11, "band", 0.5)
    for name in ("lyrics", "duration", "bpm", "keyscale", "timesignature", "language",
                 "temperature", "top_p", "top_k", "cfg_scale", "rep_penalty", "rep_window",
                 "negative_prompt", "max_cot_tokens"):  # fmt: skip
        assert getattr(side, name) == getattr(request, name), name
    assert (side.caption, side.lm_seed, side.lm_adapter, side.lm_adapter_scale) == (
        "tagged c",
        11,
        "band",
        0.5,
    )
    assert side.use_trigger is False
