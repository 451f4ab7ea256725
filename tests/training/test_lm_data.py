"""LM training data: the trained layout token for token, the loss span, skipping, batching."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from hotstep_ray.models import lm_tokenizer, prompts
from hotstep_ray.training import lm_data as D

# shared/reference/lm-template.md §5: the golden 76-token training sequence.
GOLDEN_IDS = [
    *(151644, 8948, 198, 2, 29051, 198, 31115, 7699, 41733, 11211, 3118, 389, 279, 2661, 4682),
    *(1447, 151645, 198, 151644, 872, 198, 2, 37600, 198, 5416, 76, 26278, 271, 2, 15953, 2216),
    *(198, 58, 56324, 278, 921, 151645, 198, 151644, 77091, 198, 151667, 198, 65, 5187, 25, 220),
    *(24, 15, 198, 17021, 25, 220, 16, 15, 198, 10563, 2246, 25, 362, 8922, 198, 15136, 622, 1568),
    *(25, 220, 19, 198, 151668, 271, 151669, 151670, 215668, 151645, 198),
]
GOLDEN_SONG = D.LmSong(
    song_id="golden",
    caption="calm piano",
    lyrics="",
    codes=(0, 1, 63999),
    bpm=90,
    keyscale="A minor",
    timesignature="4",
    duration=10,
    instrumental=True,
)
METAS_ONLY = D.RenderOptions(cot_caption=False)  # the golden CoT holds the four metas only


@pytest.fixture(scope="module")
def tokenizer():
    return lm_tokenizer.build_lm_tokenizer()


def test_rendered_sequence_is_the_golden_sequence(tokenizer):
    example = D.render_example(tokenizer, GOLDEN_SONG, METAS_ONLY)
    assert list(example.input_ids) == GOLDEN_IDS
    assert example.length == 76
    # The tokenizer it came from is the published one, byte for byte.
    for name, digest in lm_tokenizer.LM_TOKENIZER_SHA256.items():
        data = lm_tokenizer.tokenizer_files(True)[name]
        assert hashlib.sha256(data).hexdigest() == digest, name


def test_loss_span_is_exactly_the_completion(tokenizer):
    from_cot = D.render_example(tokenizer, GOLDEN_SONG, METAS_ONLY)
    codes_only = D.render_example(
        tokenizer, GOLDEN_SONG, D.RenderOptions(cot_caption=False, loss_on_cot=False)
    )
    # <think> at 41, first code at 71, <|im_end|> at 74; the trailing "\n" (75) is not a target.
    assert (from_cot.loss_start, from_cot.loss_end) == (41, 75)
    assert (codes_only.loss_start, codes_only.loss_end) == (71, 75)
    assert from_cot.input_ids[41] == lm_tokenizer.THINK_ID
    assert from_cot.input_ids[74] == lm_tokenizer.IM_END_ID
    targets = tokenizer.decode(codes_only.input_ids[71:75])
    assert targets == "<|audio_code_0|><|audio_code_1|><|audio_code_63999|><|im_end|>"


def test_packed_batch_targets_cover_each_completion_and_nothing_else(tokenizer):
    songs = [GOLDEN_SONG, *D.synthetic_songs(2, [5, 9], seed=3)]
    examples = [D.render_example(tokenizer, s) for s in songs]
    batch = D.collate(examples, ((0, 1, 2),), pad_multiple=64)
    flat = batch.input_ids.flatten()
    assert batch.input_ids.shape == (1, 64 * -(-sum(e.length for e in examples) // 64))
    expected_targets, expected_pred = [], []
    offset = 0
    for ex in examples:
        expected_targets += ex.input_ids[ex.loss_start : ex.loss_end]
        expected_pred += range(offset + ex.loss_start - 1, offset + ex.loss_end - 1)
        # positions restart at every song
        assert batch.position_ids[0, offset : offset + ex.length].tolist() == list(range(ex.length))
        offset += ex.length
    assert batch.target_ids.tolist() == expected_targets
    assert batch.pred_index.tolist() == expected_pred
    assert torch.equal(flat[batch.pred_index + 1], batch.target_ids)
    # per-song weights: each song's targets sum to 1, so Σ w·CE = Σ per-song mean CE
    sums = [float(batch.target_weight[s : s + e.n_targets].sum()) for s, e in _spans(examples)]
    # float32: n copies of fl(1/n), summed: half an ulp each way plus a few tree-sum roundings
    # of 1 (<~ 4e-7), inside approx's default rel 1e-6
    assert sums == pytest.approx([1.0, 1.0, 1.0])
    assert batch.cu_seqlens.tolist()[:-1] == [s for s, _ in _offsets(examples)]
    assert batch.cu_seqlens.tolist()[-1] == batch.input_ids.numel()


def _offsets(examples):
    offset = 0
    for ex in examples:
        yield offset, ex
        offset += ex.length


def _spans(examples):
    start = 0
    for ex in examples:
        yield start, ex
        start += ex.n_targets


def test_trigger_is_baked_into_the_caption_as_the_dit_path_does(tokenizer):
    song = D.LmSong("a", "dark synth", "[Verse]\nhi\n", (5, 6))
    for position in ("prepend", "append", "replace"):
        expected = prompts.apply_custom_tag("dark synth", "zq", position)
        assert D.song_caption(song, "zq", position) == expected
    # idempotent (a writer that already tagged the caption), and a per-song tag wins
    tagged = D.LmSong("b", "zq, dark synth", "", (1,))
    assert D.song_caption(tagged, "zq", "prepend") == "zq, dark synth"
    own = D.LmSong("c", "dark synth", "", (1,), custom_tag="mine", tag_position="append")
    assert D.song_caption(own, "zq", "prepend") == "dark synth, mine"
    text = tokenizer.decode(
        D.render_example(tokenizer, song, D.RenderOptions(trigger="zq")).input_ids
    )
    assert "# Caption\nzq, dark synth\n" in text and "caption: zq, dark synth\n" in text


def test_over_length_songs_are_skipped_and_reported_never_truncated(tokenizer):
    songs = D.synthetic_songs(3, [4, 40, 6], seed=1)
    full = [D.render_example(tokenizer, s) for s in songs]
    cap = full[0].length + 5  # the 4- and 6-code songs fit, the 40-code one does not
    kept, skipped = D.build_examples(tokenizer, songs, cap)
    assert [e.song_id for e in kept] == [songs[0].song_id, songs[2].song_id]
    assert [(s.song_id, s.reason, s.tokens) for s in skipped] == [
        (songs[1].song_id, "too-long", full[1].length)
    ]
    assert [e.input_ids for e in kept] == [full[0].input_ids, full[2].input_ids]


def test_reader_skips_bad_rows_and_reads_column_variants():
    rows = [
        json.dumps({"_id": "x1", "caption": "c", "codes": [1, 2, 3], "keyscale": "C major"}),
        json.dumps({"file": "sub/song two.flac", "caption": "c", "codes": "<|audio_code_7|>"}),
        "{not json",
        json.dumps({"id": "big", "codes": [64000]}),
        json.dumps({"id": "empty", "codes": []}),
        "",
    ]
    songs, skipped = D.read_lm_codes(rows)
    assert [(s.song_id, s.codes) for s in songs] == [("x1", (1, 2, 3)), ("song two", (7,))]
    assert [s.reason for s in skipped] == ["bad-row", "invalid-codes", "no-codes"]


def test_written_codes_read_back_identically(tmp_path):
    songs = D.synthetic_songs(3, 7, seed=2)
    path = D.write_lm_codes(tmp_path / D.CODES_FILE, songs)
    assert D.read_lm_codes(path.read_text().splitlines()) == (songs, [])


def test_groups_hold_every_song_once_and_respect_capacity():
    lengths = [50, 20, 35, 10, 45, 5, 30]
    packed = D.plan_groups(lengths, "pack", pack_tokens=60)
    rows = [row for group in packed for row in group]
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in row) <= 60 for row in rows)
    assert len(rows) == 4  # first-fit decreasing: 195 tokens in 4 rows of 60
    bucketed = D.plan_groups(lengths, "bucket", batch=3)
    assert [[row[0] for row in g] for g in bucketed] == [[5, 3, 1], [6, 2, 4], [0]]
    with pytest.raises(ValueError, match="does not fit"):
        D.plan_groups(lengths, "pack", pack_tokens=40)


def test_epoch_order_is_seeded_and_shards_are_even():
    groups = D.plan_groups([3] * 7, "single")
    first, again = D.epoch_groups(groups, 1, 42), D.epoch_groups(groups, 1, 42)
    assert first == again and first != D.epoch_groups(groups, 2, 42)
    assert D.epoch_groups(groups, 1, 42, "sequential") == groups
    shards = [D.shard_groups(first, rank, 3) for rank in range(3)]
    assert [len(s) for s in shards] == [3, 3, 3]
    assert {g for s in shards for g in s} == set(groups)


def test_codes_only_processor_allows_codes_and_eos_only():
    scores = torch.zeros(1, lm_tokenizer.LM_VOCAB_SIZE)
    processor = D.CodesOnlyLogitsProcessor(prompt_length=4, min_codes=2, max_codes=3)
    allowed = lambda n: torch.isfinite(processor(torch.zeros(1, 4 + n), scores))[0]  # noqa: E731
    codes = slice(lm_tokenizer.AUDIO_CODE_BASE_ID, lm_tokenizer.AUDIO_CODE_BASE_ID + 64000)
    early, mid, end = allowed(0), allowed(2), allowed(3)
    assert early[codes].all() and not early[lm_tokenizer.IM_END_ID] and early.sum() == 64000
    assert mid[codes].all() and mid[lm_tokenizer.IM_END_ID] and mid.sum() == 64001
    assert end.nonzero().flatten().tolist() == [lm_tokenizer.IM_END_ID]


def test_rows_in_the_preprocess_format_train_with_their_own_tag_and_repeat(tokenizer):
    row = {  # preprocess/cache.py's line: sample_id, file, codes, then CODE_LINE_FIELDS
        "sample_id": "ab12", "file": "song-ab12.safetensors", "codes": [3, 4, 5],
        "caption": "warm rhodes", "genre": "soul", "lyrics": "", "bpm": 92, "keyscale": "F major",
        "timesignature": "4", "language": "en", "is_instrumental": True, "custom_tag": "zq",
        "tag_position": "append", "duration_s": 0.6, "repeat": 2,
    }  # fmt: skip
    songs, skipped = D.read_lm_codes([json.dumps(row)])
    assert skipped == [] and songs[0].song_id == "ab12" and songs[0].repeat == 2
    examples, _ = D.build_examples(tokenizer, songs, 0)
    assert len(examples) == 2 and examples[0] == examples[1]
    text = tokenizer.decode(examples[0].input_ids)
    assert "# Caption\nwarm rhodes, zq\n" in text and "duration: 1\n" in text
    render = D.RenderOptions()
    assert D.common_trigger(songs, render) == ("zq", "append")
    mixed = [songs[0], D.LmSong("b", "c", "", (1,))]
    assert D.common_trigger(mixed, render) == ("", "prepend")
    assert D.common_trigger(mixed, D.RenderOptions(trigger="mine")) == ("mine", "prepend")
    # a run trigger replaces the rows' tags in every caption
    plan = D.plan_data(tokenizer, mixed, [], D.RenderOptions(trigger="mine"), max_len=0)
    texts = [tokenizer.decode(e.input_ids) for e in plan.examples]
    assert "# Caption\nmine, warm rhodes\n" in texts[0] and "# Caption\nmine, c\n" in texts[-1]
    assert plan.trigger == "mine" and plan.step_tokens == max(e.length for e in plan.examples)


def _songs_of(lengths: list[int]) -> tuple[list[D.LmExample], list[D.Group]]:
    """One example per length, one single-song micro-batch per example."""
    examples = [D.LmExample(f"s{i}", (1,) * n, 1, n, 0) for i, n in enumerate(lengths)]
    return examples, [((i,),) for i in range(len(examples))]


# 17 songs of 1,230-1,790 tokens (a 240 s song is ~1,700): 9 widths at 64, 5 at 128, 2 at 512
ASSORTED = [1230 + 35 * i for i in range(17)]


def test_a_short_compiled_run_trades_padding_for_fewer_compiles():
    examples, groups = _songs_of(ASSORTED)
    assert len(D.compiled_shapes(examples, groups, 64)) == 9
    # the seed's run (29 epochs): 7 fewer compiles (~96 s on an H200) outweigh 15% more tokens
    picked = D.pick_pad_multiple(examples, groups, epochs=29)
    assert picked == 512 and len(D.compiled_shapes(examples, groups, picked)) == 2
    # a long run of the same songs pays the padding every epoch: finer widths win
    assert D.pick_pad_multiple(examples, groups, epochs=2000) == 128
    assert D.pick_pad_multiple(examples, groups, epochs=100_000) == 64


def test_pick_pad_multiple_prefers_the_smaller_multiple_on_a_tie():
    examples, groups = _songs_of([1024, 1024, 2048])  # whole multiples of every candidate
    assert D.pick_pad_multiple(examples, groups, epochs=5) == 64
    # free compiles: padding alone decides, and a 64-multiple never pads more than a coarser one
    examples, groups = _songs_of(ASSORTED)
    assert D.pick_pad_multiple(examples, groups, epochs=1, compile_cost_tokens=0) == 64
