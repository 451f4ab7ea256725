"""Exact text prompts of ACE-Step 1.5: the DiT caption/lyric strings, the 5 Hz LM chat messages
(phase 1 CoT, phase 2 codes, their CFG-unconditional variants, understand / format / inspiration
modes), the YAML CoT block, `parse_lm_output`, and Side-Step's caption/trigger-word rules.

Every string here is checked byte for byte against `tests/fixtures/prompts/*.json` (recorded from
upstream ACE-Step `82252c2` and Side-Step `ecd13bd`). LM prompts are rendered by the
tokenizer's own chat template and nothing is assembled by hand: the open assistant turn of phase 2
is the template's rendering with its closing `<|im_end|>\\n` cut off (`render_open_assistant`),
the layout the LM was trained on (upstream PR #1127/#1128).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import yaml

# --- constants (upstream acestep/constants.py and llm_inference.py) ------------------------------

SFT_GEN_PROMPT = "# Instruction\n{}\n\n# Caption\n{}\n\n# Metas\n{}<|endoftext|>\n"
LYRIC_PROMPT = "# Languages\n{}\n\n# Lyric\n{}<|endoftext|>"
DEFAULT_DIT_INSTRUCTION = "Fill the audio semantic mask based on the given conditions:"
DEFAULT_LM_INSTRUCTION = "Generate audio semantic tokens based on the given conditions:"
DEFAULT_LM_UNDERSTAND_INSTRUCTION = (
    "Understand the given musical conditions and describe the audio semantics accordingly:"
)
DEFAULT_LM_INSPIRED_INSTRUCTION = (
    "Expand the user's input into a more detailed and specific musical description:"
)
DEFAULT_LM_REWRITE_INSTRUCTION = (
    "Format the user's input into a more detailed and specific musical description:"
)
TASK_INSTRUCTIONS: dict[str, str] = {
    "text2music": "Fill the audio semantic mask based on the given conditions:",
    "repaint": "Repaint the mask area based on the given conditions:",
    "cover": "Generate audio semantic tokens based on the given conditions:",
    "extract": "Extract the {TRACK_NAME} track from the audio:",
    "extract_default": "Extract the track from the audio:",
    "lego": "Generate the {TRACK_NAME} track based on the audio context:",
    "lego_default": "Generate the track based on the audio context:",
    "complete": "Complete the input track with {TRACK_CLASSES}:",
    "complete_default": "Complete the input track:",
}
DEFAULT_META_STRING = "- bpm: N/A\n- timesignature: N/A\n- keyscale: N/A\n- duration: 30 seconds\n"
DEFAULT_DURATION_S = 30
NOT_AVAILABLE = "N/A"
INSTRUMENTAL_LYRICS = "[Instrumental]"
UNKNOWN_LANGUAGE = "unknown"
# The LM's CFG "no condition" text; also the training-time condition-dropout user message.
DEFAULT_NEGATIVE_PROMPT = "NO USER INPUT"
# Empty reasoning as the chat template renders it (`<think>\n` + '' + `\n</think>`).
EMPTY_COT = "<think>\n\n</think>"
# Keys `format_cot` writes, in the order yaml sorts them; `genres` is parsed but never written.
COT_KEYS = ("bpm", "caption", "duration", "keyscale", "language", "timesignature")
PARSED_KEYS = ("bpm", "caption", "duration", "genres", "keyscale", "language", "timesignature")
# Text-encoder tokenizer limits the inference handler uses (tokens; truncation on).
CAPTION_MAX_TOKENS = 256
LYRIC_MAX_TOKENS = 2048
TAG_POSITIONS = ("prepend", "append", "replace")
IM_END = "<|im_end|>"

Message = dict[str, str]


class ChatTemplater(Protocol):
    """What the LM builders need from a tokenizer (any transformers tokenizer qualifies)."""

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...


# --- DiT caption and lyric prompts ---------------------------------------------------------------


def format_instruction(instruction: str) -> str:
    """Upstream appends a colon when the instruction lacks one."""
    return instruction if instruction.endswith(":") else instruction + ":"


def task_instruction(task: str, track: str | None = None, track_classes: str | None = None) -> str:
    """The DiT instruction of a task; `extract`/`lego` name a track, `complete` track classes."""
    if task in ("extract", "lego"):
        if track:
            return TASK_INSTRUCTIONS[task].replace("{TRACK_NAME}", track)
        return TASK_INSTRUCTIONS[f"{task}_default"]
    if task == "complete":
        if track_classes:
            return TASK_INSTRUCTIONS[task].replace("{TRACK_CLASSES}", track_classes)
        return TASK_INSTRUCTIONS["complete_default"]
    if task not in TASK_INSTRUCTIONS:
        raise ValueError(f"unknown task {task!r}; expected one of {sorted(TASK_INSTRUCTIONS)}")
    return TASK_INSTRUCTIONS[task]


def build_dit_metadata(
    bpm: int | str | None,
    keyscale: str | None,
    timesignature: str | None,
    duration: float | None = None,
) -> dict[str, Any]:
    """The handler's metadata dict: missing values become "N/A"; a duration (seconds, > 0) is
    written as "<int> seconds" (truncated, 12.7 -> "12 seconds"); no duration -> no key, so
    `metas_to_string` falls back to 30 seconds."""
    meta: dict[str, Any] = {"bpm": bpm if bpm else NOT_AVAILABLE}
    meta["keyscale"] = keyscale if keyscale and keyscale.strip() else NOT_AVAILABLE
    ts = timesignature or ""
    meta["timesignature"] = ts if ts.strip() and ts != NOT_AVAILABLE else NOT_AVAILABLE
    if duration is not None and float(duration) > 0:
        meta["duration"] = f"{int(float(duration))} seconds"
    return meta


def metas_to_string(meta: Mapping[str, Any] | str | None) -> str:
    """`- bpm: …\\n- timesignature: …\\n- keyscale: …\\n- duration: … seconds\\n`. A string is used
    as given, None gives the all-N/A default; dict aliases follow upstream (tempo, time_signature,
    key/scale, length)."""
    if meta is None:
        return DEFAULT_META_STRING
    if isinstance(meta, str):
        return meta
    bpm = meta.get("bpm", meta.get("tempo", NOT_AVAILABLE))
    ts = meta.get("timesignature", meta.get("time_signature", NOT_AVAILABLE))
    ks = meta.get("keyscale", meta.get("key", meta.get("scale", NOT_AVAILABLE)))
    duration = meta.get("duration", meta.get("length", DEFAULT_DURATION_S))
    if isinstance(duration, int | float):
        duration = f"{int(duration)} seconds"
    elif not isinstance(duration, str):
        duration = f"{DEFAULT_DURATION_S} seconds"
    return f"- bpm: {bpm}\n- timesignature: {ts}\n- keyscale: {ks}\n- duration: {duration}\n"


_SFT_CAPTION = re.compile(r"#\s*Caption\s*\n(.*?)(?:\n\s*#\s*Metas|$)", re.DOTALL)


def extract_caption_from_sft_format(caption: str) -> str:
    """A caption pasted as a whole SFT prompt keeps only its `# Caption` body."""
    if "# Instruction" in caption and "# Caption" in caption:
        match = _SFT_CAPTION.search(caption)
        if match:
            return match.group(1).strip()
    return caption


def build_dit_caption_prompt(
    caption: str,
    metas: Mapping[str, Any] | str | None = None,
    instruction: str | None = None,
) -> str:
    """SFT_GEN_PROMPT filled in (instruction, caption, metas): the caption-branch text that the
    Qwen3-Embedding tokenizer encodes (max 256 tokens)."""
    instr = format_instruction(instruction or DEFAULT_DIT_INSTRUCTION)
    return SFT_GEN_PROMPT.format(instr, caption, metas_to_string(metas))


def normalize_lyrics(lyrics: str | None, instrumental: bool = False) -> str:
    """`[Instrumental]` for instrumental tracks and empty lyrics (the dataset/training rule);
    inference passes lyrics through `build_lyric_prompt` unchanged."""
    if instrumental or not (lyrics or "").strip():
        return INSTRUMENTAL_LYRICS
    return lyrics or ""


def build_lyric_prompt(lyrics: str, language: str | None) -> str:
    """`# Languages\\n{lang}\\n\\n# Lyric\\n{lyrics}<|endoftext|>` (lyric branch, max 2048 tokens).
    An empty language becomes "unknown" (upstream would leave the header line empty)."""
    return LYRIC_PROMPT.format(language or UNKNOWN_LANGUAGE, lyrics)


def build_dit_text_inputs(
    caption: str,
    lyrics: str,
    language: str | None = "en",
    metas: Mapping[str, Any] | str | None = None,
    instruction: str | None = None,
    extract_sft_caption: bool = True,
) -> tuple[str, str]:
    """(caption prompt, lyric prompt) as the inference handler builds them. A metas dict with a
    non-empty `caption`/`language` overrides the arguments. `extract_sft_caption=False` is
    upstream's `build_dit_inputs` helper, which skips the SFT-caption extraction."""
    text = extract_caption_from_sft_format(caption) if extract_sft_caption else caption
    if isinstance(metas, Mapping):
        text = str(metas["caption"]) if metas.get("caption") else text
        language = str(metas["language"]) if metas.get("language") else language
    return build_dit_caption_prompt(text, metas, instruction), build_lyric_prompt(lyrics, language)


# --- Side-Step text prompt and trigger word ------------------------------------------------------


def apply_custom_tag(text: str, tag: str | None, position: str = "prepend") -> str:
    """Side-Step's trigger word: prepend -> "tag, text", append -> "text, tag", replace -> "tag";
    empty text gives the bare tag, an empty tag leaves the text alone. Unknown positions raise
    (Side-Step silently ignores them)."""
    if position not in TAG_POSITIONS:
        raise ValueError(f"tag position {position!r}: expected one of {TAG_POSITIONS}")
    if not tag:
        return text
    if position == "replace" or not text:
        return tag
    return f"{tag}, {text}" if position == "prepend" else f"{text}, {tag}"


def sidestep_caption_text(
    caption: str | None,
    genre: str | None,
    prompt_override: str | None = None,
    use_genre: bool = False,
) -> str:
    """Caption or genre: override "genre"/"caption" wins; else genre when this sample was drawn
    for genre (falling back to the caption when the genre is empty)."""
    caption, genre = caption or "", genre or ""
    if prompt_override == "genre":
        return genre
    if prompt_override == "caption" or not use_genre:
        return caption
    return genre or caption


def sidestep_metas_string(bpm: Any, timesignature: Any, keyscale: Any, duration: Any = 0) -> str:
    """Side-Step's metas: `value or "N/A"` (so 0 and "" are N/A) and the duration written raw."""
    return (
        f"- bpm: {bpm or NOT_AVAILABLE}\n- timesignature: {timesignature or NOT_AVAILABLE}\n"
        f"- keyscale: {keyscale or NOT_AVAILABLE}\n- duration: {duration} seconds\n"
    )


def build_sidestep_text_prompt(
    sample: Mapping[str, Any], tag_position: str = "prepend", use_genre: bool = False
) -> str:
    """Side-Step's `build_simple_prompt` for one dataset record (caption, genre, custom_tag or
    trigger, prompt_override, bpm, timesignature, keyscale, duration)."""
    text = sidestep_caption_text(
        sample.get("caption"), sample.get("genre"), sample.get("prompt_override"), use_genre
    )
    tag = sample.get("custom_tag") or sample.get("trigger") or ""
    text = apply_custom_tag(text, tag, tag_position)
    metas = sidestep_metas_string(
        sample.get("bpm"),
        sample.get("timesignature"),
        sample.get("keyscale"),
        sample.get("duration", 0),
    )
    return build_dit_caption_prompt(text, metas, DEFAULT_DIT_INSTRUCTION)


# --- LM metadata, CoT YAML, output parsing -------------------------------------------------------


def lm_user_metadata(
    bpm: Any = None,
    keyscale: str | None = None,
    timesignature: str | None = None,
    duration: Any = None,
) -> dict[str, Any]:
    """The metas a user fixed (upstream generate_music glue): bpm > 0 and duration > 0 as ints,
    keyscale / timesignature stripped unless empty or "n/a"."""
    meta: dict[str, Any] = {}
    for key, value in (("bpm", bpm), ("duration", duration)):
        try:
            number = float(value) if value is not None else 0.0
        except (TypeError, ValueError):
            continue
        if number > 0:
            meta[key] = int(number)
    for key, value in (("keyscale", keyscale), ("timesignature", timesignature)):
        clean = (value or "").strip()
        if clean and clean.lower() != "n/a":
            meta[key] = clean
    return {k: meta[k] for k in ("bpm", "keyscale", "timesignature", "duration") if k in meta}


def has_all_metas(meta: Mapping[str, Any] | None) -> bool:
    """Phase 1 is skipped when bpm, keyscale, timesignature and duration are all user-given."""
    return bool(meta) and all(k in meta for k in ("bpm", "keyscale", "timesignature", "duration"))


def metadata_for_phase2(
    user_metadata: Mapping[str, Any] | None, phase1_metadata: Mapping[str, Any] | None
) -> dict[str, Any]:
    """What phase 2's CoT is written from: the user's metas when complete, else phase 1's parse."""
    if has_all_metas(user_metadata):
        return {k: v for k, v in (user_metadata or {}).items() if v is not None}
    return dict(phase1_metadata or {})


def cot_yaml(metadata: Mapping[str, Any]) -> str:
    """The YAML body of the CoT: COT_KEYS only, sorted, `allow_unicode`; a timesignature "4/4"
    becomes 4 and digit strings become ints. yaml folds long captions at ~80 columns and quotes
    values that need it (e.g. containing ": ")."""
    items: dict[str, Any] = {}
    for key in COT_KEYS:
        value = metadata.get(key)
        if value is None:
            continue
        if key == "timesignature" and isinstance(value, str) and value.endswith("/4"):
            value = value.split("/")[0]
        if isinstance(value, str) and value.isdigit():
            value = int(value)
        items[key] = value
    if not items:
        return ""
    return yaml.dump(items, allow_unicode=True, sort_keys=True).strip()


def format_cot(metadata: Mapping[str, Any]) -> str:
    """`<think>\\n{yaml}\\n</think>` (upstream `_format_metadata_as_cot`); no metas ->
    `<think>\\n\\n</think>`."""
    return f"<think>\n{cot_yaml(metadata)}\n</think>"


_AUDIO_CODE_TEXT = re.compile(r"<\|audio_code_\d+\|>")
_REASONING = (
    re.compile(r"<think>(.*?)</think>", re.DOTALL),
    re.compile(r"<reasoning>(.*?)</reasoning>", re.DOTALL),
)


def _clean_caption(value: str) -> str:
    """Undo yaml's line folding: strip every line and join the non-empty ones with spaces.
    Quotes yaml added are kept, as upstream does."""
    return " ".join(line.strip() for line in value.split("\n") if line.strip())


def _field_value(key: str, raw: str) -> Any:
    if key in ("bpm", "duration"):
        try:
            return int(raw.strip())
        except ValueError:
            return raw.strip()
    if key == "caption":
        return _clean_caption(raw)
    return raw.strip()


def _reasoning_text(text: str) -> str:
    """The first think (or reasoning) block; when there is none, or it is empty, everything
    before the first audio code."""
    for pattern in _REASONING:
        match = pattern.search(text)
        if match:
            if match.group(1).strip():
                return match.group(1).strip()
            break
    return text.split("<|audio_code_")[0].strip()


def parse_lm_output(text: str) -> tuple[dict[str, Any], str]:
    """(metadata, audio-code string) from LM output: the known keys of the think block (bpm and
    duration as ints when they parse, caption unfolded, the rest stripped strings) and every
    `<|audio_code_N|>` concatenated. A line-based reader, not a YAML parser, like upstream."""
    codes = "".join(_AUDIO_CODE_TEXT.findall(text))
    metadata: dict[str, Any] = {}
    key: str | None = None
    lines: list[str] = []

    def flush() -> None:
        if key in PARSED_KEYS and lines:
            metadata[key] = _field_value(key, "\n".join(lines))

    for line in _reasoning_text(text).split("\n"):
        if line.strip().startswith("<"):
            continue
        if line and not line[0].isspace() and ":" in line:
            flush()
            name, first = line.split(":", 1)
            key, lines = name.strip().lower(), ([first] if first.strip() else [])
        elif line.startswith((" ", "\t")) and key:
            lines.append(line)
    flush()
    return metadata, codes


_LYRIC_HEADER = re.compile(r"^#\s*Lyrics?\s*\n", re.IGNORECASE)
_TRAILING_IM_END = re.compile(r"<\|im_end\|>\s*$")


def extract_lyrics_from_output(text: str) -> str:
    """Understand/inspiration output after `</think>`, without a leading `# Lyric` header and a
    trailing `<|im_end|>`. (Upstream's header regex misses "# Lyrics"; this one takes both.)"""
    if "</think>" not in text:
        return ""
    body = text.split("</think>", 1)[1].strip()
    body = _LYRIC_HEADER.sub("", body)
    return _TRAILING_IM_END.sub("", body).strip()


# --- LM chat messages ----------------------------------------------------------------------------


def system_message(instruction: str) -> Message:
    return {"role": "system", "content": f"# Instruction\n{instruction}\n\n"}


def caption_lyric_content(caption: str, lyrics: str) -> str:
    """The LM's user turn for generation: `# Caption\\n{caption}\\n\\n# Lyric\\n{lyrics}\\n`."""
    return f"# Caption\n{caption}\n\n# Lyric\n{lyrics}\n"


def is_meaningful_negative_prompt(negative_prompt: str | None) -> bool:
    """A negative prompt other than empty or the default "NO USER INPUT"."""
    clean = (negative_prompt or "").strip()
    return bool(clean) and clean != DEFAULT_NEGATIVE_PROMPT


def lm_phase1_messages(caption: str, lyrics: str) -> list[Message]:
    """Phase 1 (CoT metas): render with add_generation_prompt=True; the LM stops at </think>."""
    return [
        system_message(DEFAULT_LM_INSTRUCTION),
        {"role": "user", "content": caption_lyric_content(caption, lyrics)},
    ]


def lm_phase1_uncond_messages(
    lyrics: str, negative_prompt: str = DEFAULT_NEGATIVE_PROMPT
) -> list[Message]:
    """Phase 1 CFG branch: the negative prompt as caption, or no caption section at all."""
    if is_meaningful_negative_prompt(negative_prompt):
        content = caption_lyric_content(negative_prompt, lyrics)
    else:
        content = f"# Lyric\n{lyrics}\n"
    return [system_message(DEFAULT_LM_INSTRUCTION), {"role": "user", "content": content}]


def lm_phase2_messages(caption: str, lyrics: str, assistant: str) -> list[Message]:
    """[system, user, assistant]. `assistant` is the CoT (`format_cot`) for a generation prompt,
    or CoT + code tokens for a training sample."""
    return [*lm_phase1_messages(caption, lyrics), {"role": "assistant", "content": assistant}]


def lm_phase2_uncond_messages(
    caption: str = "",
    lyrics: str = "",
    negative_prompt: str = DEFAULT_NEGATIVE_PROMPT,
    assistant: str = EMPTY_COT,
    legacy: bool = False,
) -> list[Message]:
    """Phase 2 CFG branch / training condition dropout: the bare negative prompt (default
    "NO USER INPUT") as the whole user turn and an empty CoT. `legacy=True` is upstream's A/B
    switch `use_legacy_cfg_prompt`: the user turn keeps `# Caption` (negative prompt or the real
    caption) and `# Lyric`, as in the pre-fix fixture."""
    if legacy:
        shown = negative_prompt if is_meaningful_negative_prompt(negative_prompt) else caption
        user = caption_lyric_content(shown, lyrics)
    else:
        meaningful = is_meaningful_negative_prompt(negative_prompt)
        user = negative_prompt if meaningful else DEFAULT_NEGATIVE_PROMPT
    return [
        system_message(DEFAULT_LM_INSTRUCTION),
        {"role": "user", "content": user},
        {"role": "assistant", "content": assistant},
    ]


def _plain_uncond(negative_prompt: str | None) -> str:
    """Understand/format/inspiration CFG branches: the negative prompt as given, else empty."""
    return negative_prompt if negative_prompt and negative_prompt.strip() else ""


def lm_understand_messages(
    audio_codes: str, uncond: bool = False, negative_prompt: str = DEFAULT_NEGATIVE_PROMPT
) -> list[Message]:
    """Codes -> metas + lyrics. `audio_codes` is the `<|audio_code_N|>…` string."""
    user = _plain_uncond(negative_prompt) if uncond else audio_codes
    return [system_message(DEFAULT_LM_UNDERSTAND_INSTRUCTION), {"role": "user", "content": user}]


def lm_format_messages(
    caption: str, lyrics: str, uncond: bool = False, negative_prompt: str = DEFAULT_NEGATIVE_PROMPT
) -> list[Message]:
    """Rewrite mode; note the user turn has no trailing newline here."""
    user = (
        _plain_uncond(negative_prompt) if uncond else f"# Caption\n{caption}\n\n# Lyric\n{lyrics}"
    )
    return [system_message(DEFAULT_LM_REWRITE_INSTRUCTION), {"role": "user", "content": user}]


def lm_inspiration_messages(
    query: str,
    instrumental: bool = False,
    uncond: bool = False,
    negative_prompt: str = DEFAULT_NEGATIVE_PROMPT,
) -> list[Message]:
    """Simple mode: `{query}\\n\\ninstrumental: true|false`; an empty query becomes
    "NO USER INPUT" (as upstream's create_sample_from_query does before building the prompt)."""
    if uncond:
        user = _plain_uncond(negative_prompt)
    else:
        text = query if query and query.strip() else DEFAULT_NEGATIVE_PROMPT
        user = f"{text}\n\ninstrumental: {'true' if instrumental else 'false'}"
    return [system_message(DEFAULT_LM_INSPIRED_INSTRUCTION), {"role": "user", "content": user}]


# --- rendering through the chat template ---------------------------------------------------------


def render_chat(
    tokenizer: ChatTemplater, messages: Sequence[Message], add_generation_prompt: bool
) -> str:
    return tokenizer.apply_chat_template(
        list(messages), tokenize=False, add_generation_prompt=add_generation_prompt
    )


def render_open_assistant(tokenizer: ChatTemplater, messages: Sequence[Message]) -> str:
    """The template's rendering of a conversation ending in an assistant message, with the
    closing `<|im_end|>\\n` cut so the turn stays open; for a CoT it ends
    `…assistant\\n<think>\\n{cot}\\n</think>\\n\\n`. The template normalises the think block:
    "<think>\\n</think>" and "<think>\\n\\n</think>" both give `<think>\\n\\n</think>\\n\\n`."""
    if not messages or messages[-1]["role"] != "assistant":
        raise ValueError("render_open_assistant needs a conversation ending in an assistant turn")
    text = render_chat(tokenizer, messages, add_generation_prompt=False)
    closing = IM_END + "\n"
    if not text.endswith(closing):
        raise ValueError(f"chat template did not close the assistant turn with {closing!r}")
    return text[: -len(closing)]


def build_lm_phase1_prompt(tokenizer: ChatTemplater, caption: str, lyrics: str) -> str:
    return render_chat(tokenizer, lm_phase1_messages(caption, lyrics), True)


def build_lm_phase1_uncond_prompt(
    tokenizer: ChatTemplater, lyrics: str, negative_prompt: str = DEFAULT_NEGATIVE_PROMPT
) -> str:
    return render_chat(tokenizer, lm_phase1_uncond_messages(lyrics, negative_prompt), True)


def build_lm_phase2_prompt(
    tokenizer: ChatTemplater, caption: str, lyrics: str, cot_text: str
) -> str:
    """Codes-phase prompt: the open assistant turn ending `</think>\\n\\n`; the LM then emits
    `<|audio_code_N|>`… and stops with `<|im_end|>`."""
    return render_open_assistant(tokenizer, lm_phase2_messages(caption, lyrics, cot_text))


def build_lm_phase2_uncond_prompt(
    tokenizer: ChatTemplater,
    caption: str = "",
    lyrics: str = "",
    negative_prompt: str = DEFAULT_NEGATIVE_PROMPT,
    legacy: bool = False,
) -> str:
    messages = lm_phase2_uncond_messages(caption, lyrics, negative_prompt, legacy=legacy)
    return render_open_assistant(tokenizer, messages)


def build_lm_understand_prompt(
    tokenizer: ChatTemplater,
    audio_codes: str,
    uncond: bool = False,
    negative_prompt: str = DEFAULT_NEGATIVE_PROMPT,
) -> str:
    return render_chat(
        tokenizer, lm_understand_messages(audio_codes, uncond, negative_prompt), True
    )


def build_lm_format_prompt(
    tokenizer: ChatTemplater,
    caption: str,
    lyrics: str,
    uncond: bool = False,
    negative_prompt: str = DEFAULT_NEGATIVE_PROMPT,
) -> str:
    messages = lm_format_messages(caption, lyrics, uncond, negative_prompt)
    return render_chat(tokenizer, messages, True)


def build_lm_inspiration_prompt(
    tokenizer: ChatTemplater,
    query: str,
    instrumental: bool = False,
    uncond: bool = False,
    negative_prompt: str = DEFAULT_NEGATIVE_PROMPT,
) -> str:
    messages = lm_inspiration_messages(query, instrumental, uncond, negative_prompt)
    return render_chat(tokenizer, messages, True)
