"""Prompt builders against the upstream recordings, string for string.

`acestep15_prompts.json` was recorded from ACE-Step `82252c2` (2026-04-08). Its phase-2
`messages` are still exactly what the builders produce, but the fixture records the pre-fix
*rendering* (closed assistant turn, `add_generation_prompt=False` + "\\n"). The chat-template side
of that, and the fixed open-turn layout, is tested in test_lm_tokenizer.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from hotstep_ray.models import prompts as P

FIXTURES = Path(__file__).parents[1] / "fixtures" / "prompts"
DATA = json.loads((FIXTURES / "acestep15_prompts.json").read_text(encoding="utf-8"))
SIDESTEP = json.loads((FIXTURES / "sidestep_dataset_json.json").read_text(encoding="utf-8"))
SAMPLES = DATA["samples"]
IDS = [sample["id"] for sample in SAMPLES]
CUSTOM_NEGATIVE = "harsh noise, distorted"  # the negative prompt the fixture's *_custom_* used


def _inputs(sample: dict) -> dict:
    return sample["input"]


# --- constants -----------------------------------------------------------------------------------


def test_constants_match_upstream() -> None:
    constants = DATA["meta"]["constants"]
    assert P.SFT_GEN_PROMPT == constants["SFT_GEN_PROMPT"]
    assert P.DEFAULT_DIT_INSTRUCTION == constants["DEFAULT_DIT_INSTRUCTION"]
    assert P.DEFAULT_LM_INSTRUCTION == constants["DEFAULT_LM_INSTRUCTION"]
    assert P.DEFAULT_LM_UNDERSTAND_INSTRUCTION == constants["DEFAULT_LM_UNDERSTAND_INSTRUCTION"]
    assert P.DEFAULT_LM_INSPIRED_INSTRUCTION == constants["DEFAULT_LM_INSPIRED_INSTRUCTION"]
    assert P.DEFAULT_LM_REWRITE_INSTRUCTION == constants["DEFAULT_LM_REWRITE_INSTRUCTION"]
    assert P.TASK_INSTRUCTIONS == constants["TASK_INSTRUCTIONS"]
    assert P.DEFAULT_META_STRING == constants["default_meta_string_when_metas_None"]
    assert P.metas_to_string(None) == constants["default_meta_string_when_metas_None"]


# --- DiT prompts ---------------------------------------------------------------------------------


@pytest.mark.parametrize("sample", SAMPLES, ids=IDS)
def test_dit_prompts_match_fixture(sample: dict) -> None:
    given, dit = _inputs(sample), sample["dit"]
    meta = P.build_dit_metadata(
        given["bpm"], given["key_scale"], given["time_signature"], given["audio_duration"]
    )
    assert meta == dit["metadata_dict"]
    assert P.metas_to_string(meta) == dit["metas_string"]
    caption = P.extract_caption_from_sft_format(given["captions"])
    assert caption == dit["caption_after_extract_caption_from_sft_format"]
    text, lyric = P.build_dit_text_inputs(
        given["captions"], given["lyrics"], given["vocal_language"], meta
    )
    assert text == dit["text_prompt"]
    assert lyric == dit["lyrics_prompt"]
    assert text + "\n\n" + lyric == dit["text_inputs_log_string"]
    helper = dit["build_dit_inputs_helper"]
    raw_text, raw_lyric = P.build_dit_text_inputs(
        given["captions"], given["lyrics"], given["vocal_language"], meta, extract_sft_caption=False
    )
    assert (raw_text, raw_lyric) == (helper["caption_input"], helper["lyrics_input"])
    assert (raw_text == text) is helper["same_as_batch_path"]
    assert dit["text_tokenizer_kwargs"]["max_length"] == P.CAPTION_MAX_TOKENS
    assert dit["lyrics_tokenizer_kwargs"]["max_length"] == P.LYRIC_MAX_TOKENS


def test_dit_metadata_na_rules() -> None:
    assert P.build_dit_metadata(0, "  ", "N/A", 0) == {
        "bpm": "N/A",
        "keyscale": "N/A",
        "timesignature": "N/A",
    }
    assert P.build_dit_metadata(None, None, None, -3.0)["keyscale"] == "N/A"
    assert P.build_dit_metadata("96", "F# minor", "3", "59.9")["duration"] == "59 seconds"


def test_metas_to_string_aliases_and_duration_forms() -> None:
    assert P.metas_to_string({"tempo": 88, "time_signature": "3", "key": "D minor"}) == (
        "- bpm: 88\n- timesignature: 3\n- keyscale: D minor\n- duration: 30 seconds\n"
    )
    assert "- duration: 12 seconds\n" in P.metas_to_string({"length": 12.9})
    assert "- duration: 45 seconds\n" in P.metas_to_string({"duration": "45 seconds"})
    assert "- duration: 30 seconds\n" in P.metas_to_string({"duration": [1]})
    assert P.metas_to_string("- custom\n") == "- custom\n"


def test_caption_prompt_instruction_and_tasks() -> None:
    prompt = P.build_dit_caption_prompt("x", None, "Repaint the mask area")
    assert prompt.startswith("# Instruction\nRepaint the mask area:\n\n# Caption\nx\n\n# Metas\n")
    assert prompt.endswith("- duration: 30 seconds\n<|endoftext|>\n")
    assert P.task_instruction("text2music") == P.DEFAULT_DIT_INSTRUCTION
    assert P.task_instruction("extract", "vocals") == "Extract the vocals track from the audio:"
    assert P.task_instruction("lego") == "Generate the track based on the audio context:"
    assert P.task_instruction("complete", track_classes="drums, bass") == (
        "Complete the input track with drums, bass:"
    )
    with pytest.raises(ValueError, match="unknown task"):
        P.task_instruction("remix")


def test_metas_dict_overrides_caption_and_language() -> None:
    text, lyric = P.build_dit_text_inputs(
        "user caption", "la", "en", {"caption": "lm caption", "language": "fr", "bpm": 90}
    )
    assert "# Caption\nlm caption\n\n" in text
    assert lyric == "# Languages\nfr\n\n# Lyric\nla<|endoftext|>"


def test_lyric_prompt_instrumental_and_language() -> None:
    assert P.build_lyric_prompt(P.normalize_lyrics("", False), "en") == (
        "# Languages\nen\n\n# Lyric\n[Instrumental]<|endoftext|>"
    )
    assert P.normalize_lyrics("la la", instrumental=True) == "[Instrumental]"
    assert P.normalize_lyrics("la la") == "la la"
    assert P.build_lyric_prompt("la", None) == "# Languages\nunknown\n\n# Lyric\nla<|endoftext|>"


# --- Side-Step -----------------------------------------------------------------------------------


def test_apply_custom_tag_positions() -> None:
    assert P.apply_custom_tag("soft piano", "zxq", "prepend") == "zxq, soft piano"
    assert P.apply_custom_tag("soft piano", "zxq", "append") == "soft piano, zxq"
    assert P.apply_custom_tag("soft piano", "zxq", "replace") == "zxq"
    assert P.apply_custom_tag("", "zxq", "append") == "zxq"
    assert P.apply_custom_tag("soft piano", "", "replace") == "soft piano"
    assert P.apply_custom_tag("soft piano", None) == "soft piano"
    with pytest.raises(ValueError, match="tag position"):
        P.apply_custom_tag("soft piano", "zxq", "middle")


SIDESTEP_FILES = [(case, file) for case in SIDESTEP["cases"] for file in case["per_file"]]


@pytest.mark.parametrize(
    ("case", "file"),
    SIDESTEP_FILES,
    ids=[f"{c['name']}-{f['index_in_sorted_list']}" for c, f in SIDESTEP_FILES],
)
def test_sidestep_text_prompt_matches_fixture(case: dict, file: dict) -> None:
    position = case["effective_dataset_metadata"]["tag_position"]
    prompt = P.build_sidestep_text_prompt(file["sample_record"], position, file["use_genre"])
    assert prompt == file["text_prompt"]


def test_sidestep_caption_choice() -> None:
    assert P.sidestep_caption_text("cap", "gen", None, use_genre=True) == "gen"
    assert P.sidestep_caption_text("cap", "", None, use_genre=True) == "cap"
    assert P.sidestep_caption_text("cap", "gen", "caption", use_genre=True) == "cap"
    assert P.sidestep_caption_text("cap", "", "genre", use_genre=False) == ""
    assert P.sidestep_metas_string(0, "", None, 12.5) == (
        "- bpm: N/A\n- timesignature: N/A\n- keyscale: N/A\n- duration: 12.5 seconds\n"
    )


# --- LM messages ---------------------------------------------------------------------------------


@pytest.mark.parametrize("sample", SAMPLES, ids=IDS)
def test_lm_messages_match_fixture(sample: dict) -> None:
    given, lm = _inputs(sample), sample["lm"]
    caption, lyrics = given["captions"], given["lyrics"]
    user_meta = P.lm_user_metadata(
        given["bpm"], given["key_scale"], given["time_signature"], given["audio_duration"]
    )
    assert user_meta == lm["user_metadata"]
    assert P.has_all_metas(user_meta) is lm["has_all_metas"]
    assert P.lm_phase1_messages(caption, lyrics) == lm["phase1"]["messages"]
    assert P.lm_phase1_uncond_messages(lyrics) == lm["phase1_uncond_default_negative"]["messages"]
    custom = P.lm_phase1_uncond_messages(lyrics, CUSTOM_NEGATIVE)
    assert custom == lm["phase1_uncond_custom_negative"]["messages"]
    for key in ("phase1", "phase1_uncond_default_negative", "format_mode"):
        assert lm[key]["apply_chat_template_kwargs"]["add_generation_prompt"] is True
        assert lm[key]["suffix_appended_after_template"] == ""
    assert P.lm_format_messages(caption, lyrics) == lm["format_mode"]["messages"]

    parsed, codes = P.parse_lm_output(lm["phase1_simulated_output_text"])
    assert parsed == lm["phase1_parse_lm_output"]
    assert codes == ""
    phase2_meta = P.metadata_for_phase2(user_meta, parsed)
    assert phase2_meta == lm["metadata_for_phase2"]
    assert P.format_cot(phase2_meta) == lm["cot_text"]
    assert P.format_cot(user_meta) == lm["cot_from_user_metadata_only"]
    full = sample["lm_phase1_output_dict_used_for_simulation"]
    assert P.format_cot(full) == lm["cot_from_full_phase1_dict"]

    # Phase 2 messages are unchanged by the upstream fix (only their rendering changed).
    assert P.lm_phase2_messages(caption, lyrics, lm["cot_text"]) == lm["phase2"]["messages"]
    # The fixture's CFG branches are the pre-fix ones: `legacy=True` reproduces their messages.
    old_empty = "<think>\n</think>"
    legacy_default = P.lm_phase2_uncond_messages(caption, lyrics, assistant=old_empty, legacy=True)
    assert legacy_default == lm["phase2_uncond_default_negative"]["messages"]
    legacy_custom = P.lm_phase2_uncond_messages(
        caption, lyrics, CUSTOM_NEGATIVE, assistant=old_empty, legacy=True
    )
    assert legacy_custom == lm["phase2_uncond_custom_negative"]["messages"]
    # ...while the current (trained) CFG branch is the bare negative prompt with an empty CoT.
    current = P.lm_phase2_uncond_messages(caption, lyrics, CUSTOM_NEGATIVE)
    assert current[1:] == [
        {"role": "user", "content": CUSTOM_NEGATIVE},
        {"role": "assistant", "content": P.EMPTY_COT},
    ]
    assert P.lm_phase2_uncond_messages()[1]["content"] == "NO USER INPUT"


def test_understand_and_inspiration_messages_match_fixture() -> None:
    understand = DATA["understand_mode"]
    codes = understand["audio_codes"]
    assert P.lm_understand_messages(codes) == understand["prompt"]["messages"]
    uncond = P.lm_understand_messages(codes, uncond=True)
    assert uncond == understand["prompt_uncond_default_negative"]["messages"]
    assert P.lm_understand_messages(codes, uncond=True, negative_prompt=" ")[1]["content"] == ""

    example = understand["parse_example"]
    metadata, found_codes = P.parse_lm_output(example["lm_output_text"])
    assert metadata == example["parse_lm_output_metadata"]
    assert found_codes == example["parse_lm_output_codes"]
    assert (
        P.extract_lyrics_from_output(example["lm_output_text"])
        == (example["extract_lyrics_from_output"])
    )

    inspiration = DATA["inspiration_mode"]
    assert (
        P.lm_inspiration_messages("a soft love song for a quiet evening")
        == (inspiration["prompt"]["messages"])
    )
    assert (
        P.lm_inspiration_messages("driving synthwave for night racing", True)
        == (inspiration["prompt_instrumental"]["messages"])
    )
    assert P.lm_inspiration_messages("  ")[1]["content"] == "NO USER INPUT\n\ninstrumental: false"
    assert P.lm_format_messages("c", "l", uncond=True)[1]["content"] == "NO USER INPUT"


def test_phase2_output_parse_keeps_yaml_quotes() -> None:
    example = DATA["phase2_output_parse_example"]
    metadata, codes = P.parse_lm_output(example["lm_output_text"])
    assert metadata == example["parse_lm_output_metadata"]
    assert codes == example["parse_lm_output_codes"]


# --- CoT YAML and parsing ------------------------------------------------------------------------


def test_cot_yaml_rules() -> None:
    cot = P.format_cot({"timesignature": "3/4", "bpm": "120", "genres": "x", "language": "en"})
    assert cot == "<think>\nbpm: 120\nlanguage: en\ntimesignature: 3\n</think>"
    assert P.format_cot({}) == "<think>\n\n</think>"
    long = "word " * 30
    folded = P.cot_yaml({"caption": long.strip()})
    assert "\n  " in folded  # yaml folds at ~80 columns with a 2-space continuation
    assert max(len(line) for line in folded.split("\n")) < 90
    assert P.cot_yaml({"keyscale": "F# minor", "caption": "a: b"}) == (
        "caption: 'a: b'\nkeyscale: F# minor"
    )
    assert yaml.safe_load(P.cot_yaml({"caption": "中文", "bpm": 1})) == {
        "caption": "中文",
        "bpm": 1,
    }


def test_parse_format_round_trip() -> None:
    meta = {
        "bpm": 128,
        "caption": "A bright house track with " + "layered synth stabs and a rolling bassline " * 3,
        "duration": 95,
        "keyscale": "G minor",
        "language": "en",
        "timesignature": "4",
    }
    meta["caption"] = meta["caption"].strip()
    text = P.format_cot(meta) + "\n\n<|audio_code_5|><|audio_code_63999|><|im_end|>"
    parsed, codes = P.parse_lm_output(text)
    assert parsed == meta
    assert codes == "<|audio_code_5|><|audio_code_63999|>"


def test_parse_lm_output_edge_cases() -> None:
    parsed, codes = P.parse_lm_output("bpm: fast\nduration: 12\nunknown: 3\n<|audio_code_7|>")
    assert parsed == {"bpm": "fast", "duration": 12}
    assert codes == "<|audio_code_7|>"
    assert P.parse_lm_output("<reasoning>\nkeyscale: C major\n</reasoning>")[0] == {
        "keyscale": "C major"
    }
    assert P.parse_lm_output("")[0] == {}


def test_extract_lyrics_variants() -> None:
    assert P.extract_lyrics_from_output("no think block") == ""
    assert P.extract_lyrics_from_output("<think>\n</think>\n\n# Lyrics\nla\n<|im_end|>") == "la"
    assert P.extract_lyrics_from_output("<think>\n</think>\n\n[Verse]\nla<|im_end|>\n") == (
        "[Verse]\nla"
    )


def test_user_metadata_glue() -> None:
    assert P.lm_user_metadata("96.7", " n/a ", "3/4 ", "0") == {"bpm": 96, "timesignature": "3/4"}
    assert P.lm_user_metadata("fast", None, None, None) == {}
    assert not P.has_all_metas(None)
    assert P.metadata_for_phase2({"bpm": 1}, {"bpm": 2, "caption": "c"}) == {
        "bpm": 2,
        "caption": "c",
    }


class _Templater:
    """A stand-in that shows how the builders call apply_chat_template."""

    def __init__(self, rendered: str) -> None:
        self.rendered, self.calls = rendered, []

    def apply_chat_template(self, conversation, **kwargs):
        self.calls.append((conversation, kwargs))
        return self.rendered


def test_render_open_assistant_contract() -> None:
    fake = _Templater("...<think>\nx\n</think>\n\n<|im_end|>\n")
    messages = P.lm_phase2_messages("c", "l", "<think>\nx\n</think>")
    assert P.render_open_assistant(fake, messages) == "...<think>\nx\n</think>\n\n"
    assert fake.calls[0][1] == {"tokenize": False, "add_generation_prompt": False}
    with pytest.raises(ValueError, match="ending in an assistant"):
        P.render_open_assistant(fake, P.lm_phase1_messages("c", "l"))
    with pytest.raises(ValueError, match="did not close"):
        P.render_open_assistant(_Templater("no closing"), messages)
    generation = _Templater("rendered")
    assert P.build_lm_inspiration_prompt(generation, "q") == "rendered"
    assert generation.calls[0][1]["add_generation_prompt"] is True
