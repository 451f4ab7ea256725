"""Merge policies, provenance, the user-field rule, is_instrumental and the declared language."""

from __future__ import annotations

import pytest

from hotstep_ray.labeling.merge import (
    Proposal,
    lyrics_mean_instrumental,
    may_write,
    merge_fields,
)

CURRENT = {"caption": "old caption", "genre": "", "bpm": "100", "key": "", "lyrics": "old words"}
SOURCES = {"caption": "sidecar", "bpm": "sidecar", "lyrics": "sidecar"}
PROPOSALS = {
    "caption": Proposal("new caption", "llm"),
    "genre": Proposal("synth-pop", "llm"),
    "bpm": Proposal(120, "essentia"),
    "key": Proposal("A major", "essentia"),
    "lyrics": Proposal("[Verse]\nnew words", "genius"),
    "signature": Proposal("4/4", "llm"),
}


@pytest.mark.parametrize(
    ("policy", "changed"),
    [
        ("fill_missing", {"genre", "key", "signature"}),
        ("overwrite_caption", {"genre", "key", "signature", "caption"}),
        ("overwrite_lyrics", {"genre", "key", "signature", "lyrics", "is_instrumental"}),
        (
            "overwrite_all",
            {"genre", "key", "signature", "caption", "lyrics", "bpm", "is_instrumental"},
        ),
    ],
)
def test_policy_table(policy, changed):
    result = merge_fields(CURRENT, SOURCES, PROPOSALS, policy)
    assert set(result.written) == changed
    for name in changed - {"is_instrumental"}:
        assert result.fields[name] == PROPOSALS[name].value
        assert result.sources[name] == PROPOSALS[name].source
    for name in set(CURRENT) - changed:
        assert result.fields[name] == CURRENT[name]
        assert name not in result.sources


def test_fill_missing_never_touches_a_user_field_even_an_empty_one():
    current = {"caption": "", "genre": "", "bpm": ""}
    sources = {"genre": "user", "bpm": "user"}
    result = merge_fields(current, sources, PROPOSALS, "fill_missing")
    assert result.fields["genre"] == "" and result.fields["bpm"] == ""
    assert result.fields["caption"] == "new caption"
    assert not may_write("genre", "fill_missing", current, sources)
    # An explicit overwrite policy is the user asking: it does replace the field.
    assert merge_fields(current, sources, PROPOSALS, "overwrite_all").fields["genre"] == "synth-pop"


def test_empty_proposals_never_write_and_caption_blobs_are_unwrapped():
    proposals = {
        "caption": Proposal("{'caption': 'from a blob'}", "llm"),
        "genre": Proposal("  ", "llm"),
        "bpm": Proposal(None, "essentia"),
    }
    result = merge_fields({"caption": "", "genre": "", "bpm": ""}, {}, proposals, "overwrite_all")
    assert result.fields == {"caption": "from a blob", "genre": "", "bpm": ""}
    assert result.written == ["caption"]


@pytest.mark.parametrize(
    ("lyrics", "instrumental", "written"),
    [
        ("[Verse]\nwords", False, "[Verse]\nwords"),
        ("[Instrumental]", True, "[Instrumental]"),
        ("[Intro]\n\n[Outro]", True, "[Instrumental]"),
        ("This song is an instrumental.", True, "[Instrumental]"),
    ],
)
def test_is_instrumental_follows_the_winning_lyrics(lyrics, instrumental, written):
    result = merge_fields(
        {"lyrics": ""}, {}, {"lyrics": Proposal(lyrics, "genius")}, "fill_missing"
    )
    assert result.fields["is_instrumental"] is instrumental
    assert result.fields["lyrics"] == written
    assert lyrics_mean_instrumental(lyrics) is instrumental


def test_lyrics_absent_or_losing_never_set_is_instrumental():
    current = {"lyrics": "kept words", "is_instrumental": "true"}
    lost = merge_fields(current, {}, {"lyrics": Proposal("other", "genius")}, "fill_missing")
    assert lost.fields["is_instrumental"] == "true" and "is_instrumental" not in lost.written
    none = merge_fields({"lyrics": "", "is_instrumental": ""}, {}, {}, "overwrite_all")
    assert none.fields["is_instrumental"] == ""


def test_declared_language_is_force_written_but_a_user_edit_wins():
    forced = merge_fields({"language": "de"}, {"language": "sidecar"}, {}, "fill_missing", "en")
    assert forced.fields["language"] == "en" and forced.written == ["language"]
    assert "language" not in forced.sources  # a dataset setting, not a per-sample label
    same = merge_fields({"language": "en"}, {}, {}, "fill_missing", "en")
    assert same.written == []
    kept = merge_fields({"language": "ja"}, {"language": "user"}, {}, "overwrite_all", "en")
    assert kept.fields["language"] == "ja"
