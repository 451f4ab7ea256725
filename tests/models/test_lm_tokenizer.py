"""The offline-built LM / text tokenizers against the published facts (lm-template.md): file
hashes, special-token ids, the golden 76-token training sequence, and the chat-template
renderings of the fixture's messages.

On the fixture's phase-2 entries: `acestep15_prompts.json` recorded upstream's pre-fix builder,
which rendered [system, user, assistant=CoT] with add_generation_prompt=False, i.e. it CLOSED the
assistant turn (`…</think>\\n\\n<|im_end|>\\n`) and generation started after it. The LM was
trained on the open turn (`…</think>\\n\\n{codes}<|im_end|>\\n`, upstream PR #1127/#1128), which is
what `build_lm_phase2_prompt` renders. The two differ by exactly the trailing `<|im_end|>\\n`;
`test_fixture_phase2_is_prefix_plus_im_end` pins that relation for every fixture sample.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from hotstep_ray.models import lm_tokenizer as L
from hotstep_ray.models import prompts as P
from hotstep_ray.models.errors import CheckpointError

FIXTURES = Path(__file__).parents[1] / "fixtures" / "prompts"
DATA = json.loads((FIXTURES / "acestep15_prompts.json").read_text(encoding="utf-8"))
SAMPLES = DATA["samples"]
IDS = [sample["id"] for sample in SAMPLES]

SYSTEM_TURN = (
    "<|im_start|>system\n# Instruction\nGenerate audio semantic tokens based on the given "
    "conditions:\n\n<|im_end|>\n"
)
EN_USER_TURN = (
    "<|im_start|>user\n# Caption\nupbeat synth-pop with bright female vocals and punchy drums\n\n"
    "# Lyric\n[Verse 1]\nNeon lights are calling me\nDancing through the city streets\n\n[Chorus]\n"
    "We are alive tonight\n<|im_end|>\n"
)
EN_COT_BODY = "bpm: 120\nduration: 30\nkeyscale: C major\ntimesignature: 4\n"
# lm-template.md §6: A (phase 1), D (phase 2, current builder), F (uncond, current), G (training).
RENDER_A = SYSTEM_TURN + EN_USER_TURN + "<|im_start|>assistant\n"
RENDER_D = RENDER_A + "<think>\n" + EN_COT_BODY + "</think>\n\n"
RENDER_F = (
    SYSTEM_TURN + "<|im_start|>user\nNO USER INPUT<|im_end|>\n<|im_start|>assistant\n"
    "<think>\n\n</think>\n\n"
)
G_CODES = [123, 45678, 0, 63999, 1000]
RENDER_G = RENDER_D + "".join(f"<|audio_code_{n}|>" for n in G_CODES) + "<|im_end|>\n"

GOLDEN_TEXT = (
    SYSTEM_TURN + "<|im_start|>user\n# Caption\ncalm piano\n\n# Lyric\n[Instrumental]\n<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nbpm: 90\nduration: 10\nkeyscale: A minor\ntimesignature: 4\n"
    "</think>\n\n<|audio_code_0|><|audio_code_1|><|audio_code_63999|><|im_end|>\n"
)
# lm-template.md §5, "Golden training sequence" (76 tokens).
GOLDEN_IDS = [
    151644, 8948, 198, 2, 29051, 198, 31115, 7699, 41733, 11211, 3118, 389, 279, 2661, 4682, 1447,
    151645, 198, 151644, 872, 198, 2, 37600, 198, 5416, 76, 26278, 271, 2, 15953, 2216, 198, 58,
    56324, 278, 921, 151645, 198, 151644, 77091, 198, 151667, 198, 65, 5187, 25, 220, 24, 15, 198,
    17021, 25, 220, 16, 15, 198, 10563, 2246, 25, 362, 8922, 198, 15136, 622, 1568, 25, 220, 19,
    198, 151668, 271, 151669, 151670, 215668, 151645, 198,
]  # fmt: skip


@pytest.fixture(scope="module")
def tok():
    return L.build_lm_tokenizer()


@pytest.fixture(scope="module")
def text_tok():
    return L.build_text_tokenizer()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --- files and hashes ----------------------------------------------------------------------------


def test_assets_are_the_published_qwen3_files() -> None:
    for name in ("vocab.json", "merges.txt", "chat_template.jinja"):
        assert _sha((L.ASSETS / name).read_bytes()) == L.LM_TOKENIZER_SHA256[name]
    base = (L.ASSETS / "chat_template_base.jinja").read_bytes()
    assert _sha(base) == L.TEXT_TOKENIZER_SHA256["chat_template.jinja"]
    assert len(base) == 4116 and len((L.ASSETS / "chat_template.jinja").read_bytes()) == 4168


def test_saved_lm_folder_is_byte_identical_to_the_official_one(tmp_path: Path) -> None:
    folder = L.save_lm_tokenizer(tmp_path / "lm")
    names = sorted(path.name for path in folder.iterdir())
    assert names == sorted(L.LM_TOKENIZER_SHA256)
    for name, digest in L.LM_TOKENIZER_SHA256.items():
        assert _sha((folder / name).read_bytes()) == digest, name
    assert (folder / "tokenizer.json").stat().st_size == 24_321_939


def test_saved_text_folder_matches_published_hashes(tmp_path: Path) -> None:
    folder = L.save_text_tokenizer(tmp_path / "text")
    for name, digest in L.TEXT_TOKENIZER_SHA256.items():
        assert _sha((folder / name).read_bytes()) == digest, name
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert "chat_template" not in config and len(config["added_tokens_decoder"]) == 26


def test_lm_tokenizer_config_facts() -> None:
    config = json.loads(L.tokenizer_files(True)["tokenizer_config.json"])
    assert config["eos_token"] == "<|im_end|>" and config["pad_token"] == "<|endoftext|>"
    assert config["bos_token"] is None and config["unk_token"] is None
    assert "chat_template" not in config
    assert len(config["additional_special_tokens"]) == 65535
    assert config["added_tokens_decoder"]["151667"]["special"] is False
    assert config["added_tokens_decoder"]["217203"]["content"] == "<|audio_code_65534|>"


# --- ids -----------------------------------------------------------------------------------------


def test_special_and_audio_token_ids(tok) -> None:
    assert len(tok) == L.LM_VOCAB_SIZE == 217204
    assert (tok.pad_token, tok.pad_token_id) == ("<|endoftext|>", 151643)
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", 151645)
    assert tok.bos_token is None and tok.unk_token is None
    assert tok.convert_tokens_to_ids(["<|im_start|>", "<think>", "</think>"]) == [
        151644,
        151667,
        151668,
    ]
    for n in (0, 1, 63999, 64000, 65534):
        assert tok.convert_tokens_to_ids(L.audio_code_token(n)) == 151669 + n == L.audio_code_id(n)
    assert len(tok.all_special_tokens) == 2 + 65535
    # Nothing is added on encode; codes are single special tokens.
    assert tok("hello").input_ids == [14990]
    assert tok("hello", add_special_tokens=True).input_ids == [14990]
    ids = [151667, 271, 151668, 151669, 151645]
    assert tok.decode(ids, skip_special_tokens=True) == "<think>\n\n</think>"
    assert tok.decode(ids) == "<think>\n\n</think><|audio_code_0|><|im_end|>"


@pytest.mark.parametrize(
    ("text", "ids"),
    [
        ("<|im_start|>user\nx<|im_end|>\n", [151644, 872, 198, 87, 151645, 198]),
        ("<think>\n\n</think>", [151667, 271, 151668]),
        ("<|im_start|>assistant\n<think>\n", [151644, 77091, 198, 151667, 198]),
        ("</think>\n\n<|audio_code_0|>", [151668, 271, 151669]),
        ("<|audio_code_63999|><|im_end|>\n", [215668, 151645, 198]),
        (
            SYSTEM_TURN,
            [151644, 8948, 198, 2, 29051, 198, 31115, 7699, 41733, 11211, 3118, 389, 279, 2661,
             4682, 1447, 151645, 198],
        ),
        ("NO USER INPUT", [8996, 13872, 26149]),
    ],
)  # fmt: skip
def test_recurring_pieces(tok, text: str, ids: list[int]) -> None:
    assert tok(text).input_ids == ids


@pytest.mark.parametrize("spelling", ["<|audio_code_0001|>", "<|audio_code_65535|>"])
def test_non_canonical_code_spellings_are_plain_text(tok, spelling: str) -> None:
    ids = tok(spelling).input_ids
    assert len(ids) > 5 and all(i < L.AUDIO_CODE_BASE_ID for i in ids)


def test_audio_code_text_round_trip(tok) -> None:
    codes = [0, 1, 123, 45678, 63999, 64000, 65534]
    text = L.audio_codes_text(codes)
    assert L.parse_audio_codes(text) == codes
    assert L.parse_audio_codes(text, clamp=True)[-2:] == [63999, 63999]
    assert L.audio_codes_from_ids(tok(text).input_ids) == codes
    parsed = P.parse_lm_output("<think>\nbpm: 1\n</think>\n\n" + text + "<|im_end|>")[1]
    assert L.parse_audio_codes(parsed) == codes
    assert L.parse_audio_codes("<|audio_code_x|> <|audio_code_-1|>") == []
    with pytest.raises(ValueError):
        L.audio_code_token(65535)


# --- the golden training sequence and the template renderings ------------------------------------


def test_golden_training_sequence(tok) -> None:
    cot = P.format_cot({"bpm": 90, "duration": 10, "keyscale": "A minor", "timesignature": 4})
    seq = L.render_training_sequence(tok, "calm piano", "[Instrumental]", cot, [0, 1, 63999])
    assert seq.text == GOLDEN_TEXT
    assert seq.input_ids == GOLDEN_IDS and len(seq.input_ids) == 76
    assert (seq.cot_start, seq.codes_start, seq.codes_end) == (41, 71, 74)
    # Tokenising the parts separately gives the same ids: every boundary is an added token.
    prefix = tok(seq.text[: seq.text.index("<|audio_code_0|>")]).input_ids
    assert prefix == GOLDEN_IDS[:71]
    short = L.render_training_sequence(
        tok, "calm piano", "[Instrumental]", cot, [0, 1, 63999], final_newline=False
    )
    assert short.input_ids == GOLDEN_IDS[:75] and short.codes_end == 74


def test_condition_dropout_training_sequence(tok) -> None:
    seq = L.render_training_sequence(tok, "ignored", "ignored", "ignored", [5, 6], True)
    assert seq.text == RENDER_F + "<|audio_code_5|><|audio_code_6|><|im_end|>\n"
    assert seq.input_ids[18:25] == [151644, 872, 198, 8996, 13872, 26149, 151645]
    assert seq.input_ids[seq.cot_start : seq.codes_start] == [151667, 271, 151668, 271]


def test_lm_template_renderings_of_the_en_sample(tok) -> None:
    en = SAMPLES[0]
    lm, given = en["lm"], en["input"]
    phase1 = P.build_lm_phase1_prompt(tok, given["captions"], given["lyrics"])
    assert phase1 == RENDER_A and len(tok(phase1).input_ids) == 74
    phase2 = P.build_lm_phase2_prompt(tok, given["captions"], given["lyrics"], lm["cot_text"])
    assert phase2 == RENDER_D
    ids = tok(phase2).input_ids
    assert len(ids) == 105 and ids[-4:] == [19, 198, 151668, 271]
    uncond = P.build_lm_phase2_uncond_prompt(tok, given["captions"], given["lyrics"])
    assert uncond == RENDER_F and len(tok(uncond).input_ids) == 33
    seq = L.render_training_sequence(
        tok, given["captions"], given["lyrics"], lm["cot_text"], G_CODES
    )
    assert seq.text == RENDER_G and len(seq.input_ids) == 112
    assert seq.input_ids[-9:] == [151668, 271, 151792, 197347, 151669, 215668, 152669, 151645, 198]
    assert RENDER_G.startswith(phase2)  # generation prefix == training prefix


@pytest.mark.parametrize("sample", SAMPLES, ids=IDS)
def test_fixture_messages_render_through_the_template(tok, sample: dict) -> None:
    lm, given = sample["lm"], sample["input"]
    for key in ("phase1", "phase1_uncond_default_negative", "format_mode"):
        entry = lm[key]
        rendered = tok.apply_chat_template(entry["messages"], **entry["apply_chat_template_kwargs"])
        assert rendered.startswith(SYSTEM_TURN if key != "format_mode" else "<|im_start|>system\n")
        assert rendered.endswith("<|im_end|>\n<|im_start|>assistant\n")
        for message in entry["messages"]:
            assert f"<|im_start|>{message['role']}\n{message['content']}<|im_end|>\n" in rendered
    assert P.build_lm_phase1_prompt(tok, given["captions"], given["lyrics"]) == (
        tok.apply_chat_template(
            lm["phase1"]["messages"], tokenize=False, add_generation_prompt=True
        )
    )
    assert P.build_lm_format_prompt(tok, given["captions"], given["lyrics"]) == (
        tok.apply_chat_template(
            lm["format_mode"]["messages"], tokenize=False, add_generation_prompt=True
        )
    )


@pytest.mark.parametrize("sample", SAMPLES, ids=IDS)
def test_fixture_phase2_is_prefix_plus_im_end(tok, sample: dict) -> None:
    """Pre-fix (fixture) rendering = our open-turn prompt + `<|im_end|>\\n`, for the conditional
    prompt and, with `legacy=True` user content, for both CFG branches."""
    lm, given = sample["lm"], sample["input"]
    caption, lyrics = given["captions"], given["lyrics"]

    def old(key: str) -> str:
        entry = lm[key]
        text = tok.apply_chat_template(entry["messages"], **entry["apply_chat_template_kwargs"])
        if not text.endswith("\n"):  # the old builder's rule; the real template already ends so
            text += entry["suffix_appended_after_template"]
        return text

    closing = "<|im_end|>\n"
    ours = P.build_lm_phase2_prompt(tok, caption, lyrics, lm["cot_text"])
    assert ours.endswith("</think>\n\n") and old("phase2") == ours + closing
    legacy = P.build_lm_phase2_uncond_prompt(tok, caption, lyrics, legacy=True)
    assert old("phase2_uncond_default_negative") == legacy + closing
    assert legacy.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    legacy = P.build_lm_phase2_uncond_prompt(tok, caption, lyrics, "harsh noise, distorted", True)
    assert old("phase2_uncond_custom_negative") == legacy + closing
    current = P.build_lm_phase2_uncond_prompt(tok, caption, lyrics)
    assert current == RENDER_F


def test_understand_and_inspiration_renderings(tok) -> None:
    codes = DATA["understand_mode"]["audio_codes"]
    prompt = P.build_lm_understand_prompt(tok, codes)
    assert prompt.endswith(f"<|im_start|>user\n{codes}<|im_end|>\n<|im_start|>assistant\n")
    ids = tok(prompt).input_ids
    assert L.audio_codes_from_ids(ids) == L.parse_audio_codes(codes) == G_CODES
    inspiration = P.build_lm_inspiration_prompt(tok, "a soft love song for a quiet evening")
    expected = tok.apply_chat_template(
        DATA["inspiration_mode"]["prompt"]["messages"], tokenize=False, add_generation_prompt=True
    )
    assert inspiration == expected


# --- loading folders and the text tokenizer ------------------------------------------------------


def test_load_saved_folder_behaves_the_same(tok, tmp_path: Path) -> None:
    loaded = L.build_lm_tokenizer(tmp_path / "lm")
    assert loaded(GOLDEN_TEXT).input_ids == GOLDEN_IDS
    assert loaded.chat_template == tok.chat_template
    assert len(loaded) == 217204 and loaded.eos_token_id == 151645
    assert len(loaded.all_special_tokens) == len(tok.all_special_tokens)
    messages = SAMPLES[0]["lm"]["phase1"]["messages"]
    assert P.render_chat(loaded, messages, True) == RENDER_A


def test_load_tokenizer_errors(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="tokenizer.json: missing"):
        L.load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not a readable tokenizer"):
        L.load_tokenizer(tmp_path)


def test_text_tokenizer_appends_endoftext(text_tok) -> None:
    assert len(text_tok) == L.TEXT_VOCAB_SIZE == 151669
    assert text_tok("hello").input_ids == [14990, 151643]
    assert text_tok("hello", add_special_tokens=False).input_ids == [14990]
    assert (text_tok.pad_token_id, text_tok.eos_token_id) == (151643, 151645)
    assert text_tok.padding_side == "right"
    caption = P.build_dit_caption_prompt("calm piano", {"bpm": 90})
    ids = text_tok(caption).input_ids
    # The prompt's own "<|endoftext|>\n" plus the one the post-processor appends.
    assert ids[-3:] == [151643, 198, 151643]
    # No audio-code tokens in this vocabulary.
    assert len(text_tok("<|audio_code_0|>").input_ids) > 3
    batch = text_tok(["a", "a b c"], padding="longest", return_tensors="pt")
    assert batch["input_ids"][0].tolist() == [64, 151643, 151643, 151643]
    assert batch["attention_mask"][0].tolist() == [1, 1, 0, 0]
