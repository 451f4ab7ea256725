"""Tensor cache reading, epoch plans, crops and padded micro-batch assembly."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from safetensors.torch import save as save_safetensors_bytes
from test_dit_support import SONG_FRAMES, song_tensors, write_cache

from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage
from hotstep_ray.training import dit_data


@pytest.fixture
def storage(tmp_path) -> Storage:
    return Storage(tmp_path)


def test_cache_reads_songs_meta_and_stats(storage: Storage) -> None:
    key = write_cache(storage, repeats=(1, 3, 1))
    cache = dit_data.load_cache(storage, key)
    assert [s.stem for s in cache.songs] == ["song0", "song1", "song2"]
    assert [s.frames for s in cache.songs] == list(SONG_FRAMES)
    assert cache.repeats == [1, 3, 1] and cache.samples == 5
    assert cache.condition_len == 12 and cache.condition_dim == 64
    assert cache.channel_stats_source == "file" and cache.channel_std.shape == (64,)
    assert cache.meta["custom_tag"] == "zqx"


def test_trigger_comes_from_the_song_headers_without_a_meta_tag(storage: Storage) -> None:
    key = write_cache(storage, meta={"variant_key": "turbo"})
    for index in range(3):
        tensors = song_tensors(20, 4, seed=index)
        tags = {"custom_tag": "zqx", "tag_position": "append", "repeat": "2"}
        data = save_safetensors_bytes(tensors, metadata=tags)
        storage.write_bytes(f"{key}/song{index}.safetensors", data)
    cache = dit_data.load_cache(storage, key)
    assert cache.trigger() == ("zqx", "append") and cache.repeats == [2, 2, 2]


def test_missing_stats_are_computed_and_meta_repeats_apply(storage: Storage) -> None:
    key = write_cache(storage, stats=False, meta={"samples": {"song2": {"repeat": 2}}})
    cache = dit_data.load_cache(storage, key)
    assert cache.channel_stats_source == "computed"
    every_frame = torch.cat([song.target for song in cache.songs])
    # against a float64 std: the cache's float64 sums rounded once to float32 (half an ulp, 6e-8
    # relative) plus float64 round-off; rtol 1e-6 ~ 8 ulp
    want = every_frame.double().std(dim=0, unbiased=False)
    assert torch.allclose(cache.channel_std.double(), want, rtol=1e-6, atol=0)
    assert cache.repeats == [1, 1, 2]


def test_cache_errors_are_clear(storage: Storage) -> None:
    with pytest.raises(InputError, match="preprocess"):
        dit_data.load_cache(storage, "tensors/none/turbo")
    tensors = song_tensors(10, 4, seed=0)
    del tensors["context_latents"]
    with pytest.raises(InputError, match="context_latents"):
        dit_data.read_song(save_safetensors_bytes(tensors), "broken")


def test_epoch_plan_uses_each_song_repeat_times_in_distinct_micro_batches() -> None:
    repeats = [1, 3, 1, 2]
    for epoch in (1, 2, 3):
        plan = dit_data.plan_epoch(repeats, batch=3, seed=42, epoch=epoch)
        assert Counter(s for mb in plan for s in mb) == {0: 1, 1: 3, 2: 1, 3: 2}
        assert all(len(set(mb)) == len(mb) <= 3 for mb in plan)
    assert dit_data.plan_epoch(repeats, 3, 42, 1) == dit_data.plan_epoch(repeats, 3, 42, 1)
    assert dit_data.plan_epoch(repeats, 3, 42, 1) != dit_data.plan_epoch(repeats, 3, 42, 2)
    assert dit_data.plan_epoch([1, 1, 1], 2, 0, 1, "sequential") == [(0, 1), (2,)]


def test_shards_have_equal_length_and_windows_group_grad_accum() -> None:
    plan = [(0,), (1,), (2,), (0,), (1,)]
    shards = [dit_data.shard_plan(plan, rank, 2) for rank in (0, 1)]
    assert len(shards[0]) == len(shards[1]) == 3
    assert dit_data.windows(plan, 2) == [[(0,), (1,)], [(2,), (0,)], [(1,)]]


def test_crops_are_aligned_uniform_and_cover_the_song(storage: Storage) -> None:
    cache = dit_data.load_cache(storage, write_cache(storage))
    song = cache.songs[2]  # 90 frames, crop 40: starts 0, 2, ..., 50
    rng = torch.Generator().manual_seed(0)
    starts = Counter(dit_data.draw_crop(song, 2, 40, 0, rng).start for _ in range(13_000))
    assert set(starts) == set(range(0, 51, 2))
    # seeded integer draws (the same on every CPU). Each count ~ Binomial(13000, 1/26), sd ~22: a
    # uniform draw's max - min exceeds 140 (6.4 sd) with probability ~0.3%, 100 with ~23%
    assert max(starts.values()) - min(starts.values()) < 0.28 * 500
    short = dit_data.draw_crop(cache.songs[0], 0, 48, 0, rng)  # 40 frames < crop 48
    assert (short.start, short.frames) == (0, 40)


def test_genre_variant_is_used_at_the_ratio(storage: Storage) -> None:
    cache = dit_data.load_cache(storage, write_cache(storage, genre=True))
    assert cache.genre_songs == 3 and cache.condition_len == 14
    rng = torch.Generator().manual_seed(1)
    crops = [dit_data.draw_crop(cache.songs[1], 1, 32, 30, rng) for _ in range(4000)]
    # Binomial(4000, 0.3) share: sd 0.0072, so 0.03 is ~4 sd
    assert sum(c.genre for c in crops) / 4000 == pytest.approx(0.30, abs=0.03)
    batch = dit_data.assemble(cache, [next(c for c in crops if c.genre)], 32)
    assert torch.equal(batch.encoder_hidden_states[0], cache.songs[1].genre_condition.float())


def test_assembly_pads_with_masks_and_keeps_real_frames(storage: Storage) -> None:
    cache = dit_data.load_cache(storage, write_cache(storage))
    frames = dit_data.batch_frames(cache, 48)
    crops = [dit_data.Crop(0, 0, 40, False), dit_data.Crop(2, 10, 48, False)]
    batch = dit_data.assemble(cache, crops, frames)
    assert batch.target_latents.shape == (2, 48, 64)
    assert batch.context_latents.shape == (2, 48, 128)
    assert batch.encoder_hidden_states.shape == (2, 12, 64)
    assert batch.latent_mask[0].sum() == 40 and batch.latent_mask[1].all()
    assert batch.target_latents[0, 40:].abs().sum() == 0
    assert torch.equal(batch.target_latents[1], cache.songs[2].target[10:58])
    assert batch.encoder_attention_mask.sum(dim=1).tolist() == [8, 10]
    full = dit_data.assemble(cache, [dit_data.Crop(1, 0, 48, False)], frames, condition_len=12)
    assert full.latent_mask is None and full.encoder_attention_mask is None
    assert dit_data.batch_frames(cache, 2000) == 90  # crop longer than every song
