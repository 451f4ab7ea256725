"""The LM renders its prompts from text at train time, so a run trigger (`--trigger`) re-conditions
it: the word replaces each row's preprocessed tag in the caption the adapter learns from, and the
export names it. A row whose writer baked its own tag into the caption cannot be re-tagged: a
different run trigger is then refused rather than stamped."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from test_lm_init_adapter import tiny_fixture  # noqa: F401  (fixture)
from test_lm_train import make_spec, one_thread  # noqa: F401  (one_thread: autouse)

from hotstep_ray.core.errors import InputError
from hotstep_ray.training import lm_data as D
from hotstep_ray.training import lm_setup

TAGGED = "tensors/band/tagged/lm_codes.jsonl"


def _texts(setup: lm_setup.LmSetup) -> list[str]:
    return [setup.tokenizer.decode(example.input_ids) for example in setup.examples]


def test_a_run_trigger_reaches_the_rendered_prompt_tokens(tiny):
    folder, storage = tiny
    songs = [replace(s, custom_tag="rowtag") for s in D.synthetic_songs(2, 6, seed=5)]
    D.write_lm_codes(storage.local_path(TAGGED), songs)
    spec = make_spec(folder).model_copy(update={"codes_key": TAGGED})  # trigger "zq"
    setup = lm_setup.setup_lm(spec, storage)
    texts = _texts(setup)
    assert len(texts) == 2 and setup.trigger == "zq"
    for song, text in zip(songs, texts, strict=True):
        assert f"# Caption\nzq, {song.caption}\n" in text  # in the tokens the loss reads
        assert "rowtag" not in text
    # without a run trigger each row's own tag is rendered, and is what the export names
    own = lm_setup.setup_lm(spec.model_copy(update={"trigger": ""}), storage)
    assert all("# Caption\nrowtag, " in text for text in _texts(own)) and own.trigger == "rowtag"


def test_a_caption_with_its_tag_baked_in_refuses_another_trigger(tiny):
    folder, storage = tiny
    key = "tensors/band/baked/lm_codes.jsonl"
    rows = []
    for song in D.synthetic_songs(2, 6, seed=5):
        row = D.song_row(replace(song, caption=f"own, {song.caption}", custom_tag="own"))
        rows.append(json.dumps({**row, "trigger_applied": True}) + "\n")
    storage.write_text(key, "".join(rows))
    spec = make_spec(folder).model_copy(update={"codes_key": key})
    with pytest.raises(InputError, match="cannot replace"):
        lm_setup.setup_lm(spec, storage)
    same = lm_setup.setup_lm(spec.model_copy(update={"trigger": "own"}), storage)
    assert all("# Caption\nown, " in text and "zq" not in text for text in _texts(same))
