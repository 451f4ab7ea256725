"""The ACE-Step 1.5 tokenizers, rebuilt offline from the Qwen3 base files in `assets/qwen3/`.

LM tokenizer (acestep-5Hz-lm-*): Qwen3 byte-level BPE (151,643 tokens), the 26 Qwen3 added tokens
at 151643-151668, then `<|audio_code_0|>`..`<|audio_code_65534|>` at 151669 + N (special).
Vocab 217,204. eos `<|im_end|>` 151645, pad `<|endoftext|>` 151643, no bos/unk, nothing added on
encode. `save_lm_tokenizer` writes the seven files of the official `acestep-5Hz-lm-0.6B` folder
byte for byte (SHA-256 in LM_TOKENIZER_SHA256).

Text tokenizer (Qwen3-Embedding-0.6B, the DiT's caption/lyric encoder): the same BPE and 26 added
tokens (vocab 151,669) whose post-processor APPENDS `<|endoftext|>` on every encode with
add_special_tokens=True (the transformers default); its tokenizer.json is byte-identical to the
official one (TEXT_TOKENIZER_SHA256).

transformers 5's `AutoTokenizer.from_pretrained` spends ~25 s on the LM folder (65k added tokens
go through a quadratic list check), so `load_tokenizer` reads `tokenizer.json` directly (~2 s).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from tokenizers import Tokenizer, processors
from transformers import PreTrainedTokenizerFast

from hotstep_ray.models import prompts
from hotstep_ray.models.errors import CheckpointError

ASSETS = Path(__file__).parent / "assets" / "qwen3"

PAD_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"
PAD_ID = 151643
IM_START_ID = 151644
IM_END_ID = 151645  # eos of the LM
THINK_ID = 151667
THINK_END_ID = 151668
AUDIO_CODE_BASE_ID = 151669
NUM_AUDIO_CODE_TOKENS = 65535  # <|audio_code_0..65534|> exist as tokens...
NUM_VALID_AUDIO_CODES = 64000  # ...but only 0..63999 are FSQ indices (8*8*8*5*5*5)
TEXT_VOCAB_SIZE = 151669
LM_VOCAB_SIZE = AUDIO_CODE_BASE_ID + NUM_AUDIO_CODE_TOKENS  # 217204
MODEL_MAX_LENGTH = 131072

# Qwen3's added tokens in id order from 151643, with their `special` flag. `<think>`/`</think>`
# are NOT special, so decode(skip_special_tokens=True) keeps them but drops the codes.
QWEN3_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
# Qwen3's `additional_special_tokens`: the special added tokens except <|endoftext|>.
QWEN3_EXTRA_SPECIAL = tuple(text for text, special in QWEN3_ADDED_TOKENS[1:] if special)

# The Qwen2 pre-tokenizer split (contractions, letters, single digits, punctuation, newlines).
SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_BYTE_LEVEL = {"add_prefix_space": False, "trim_offsets": False, "use_regex": False}

# Published SHA-256 of the official LM tokenizer files (ACE-Step/acestep-5Hz-lm-0.6B @ 148d8ea0).
LM_TOKENIZER_SHA256 = {
    "chat_template.jinja": "a55ee1b1660128b7098723e0abcd92caa0788061051c62d51cbe87d9cf1974d8",
    "tokenizer_config.json": "6cd70cdd89425971794f5235562edcc608b0629a6c4686ae51a8b8c8b8ba5e95",
    "special_tokens_map.json": "76e233bfc357b0b03d7b6e6ba8e799244f358552575a7cdadb78d3d19106b298",
    "added_tokens.json": "db08b66a515fb5d6acca0b3492d25bb44e0deda6241fc1113ac0679d40558c48",
    "tokenizer.json": "35af56c3f5cb3ea2cc578aa28a8937770981d504f183ac5c8c38baf4bbd4af4d",
    "vocab.json": "ca10d7e9fb3ed18575dd1e277a2579c16d108e32f27439684afa0e10b1440910",
    "merges.txt": "8831e4f1a044471340f7c0a83d7bd71306a5b867e95fd870f74d0c5308a904d5",
}
# Qwen3-Embedding-0.6B files whose published hashes this rebuild reproduces; its
# tokenizer_config.json is not pinned anywhere public, so ours is written in the LM's format.
TEXT_TOKENIZER_SHA256 = {
    "tokenizer.json": "def76fb086971c7867b829c23a26261e38d9d74e02139253b38aeb9df8b4b50a",
    "special_tokens_map.json": "76862e765266b85aa9459767e33cbaf13970f327a0e88d1c65846c2ddd3a1ecd",
    "added_tokens.json": "c0284b582e14987fbd3d5a2cb2bd139084371ed9acbae488829a1c900833c680",
    "chat_template.jinja": "87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5",
    "vocab.json": "ca10d7e9fb3ed18575dd1e277a2579c16d108e32f27439684afa0e10b1440910",
    "merges.txt": "8831e4f1a044471340f7c0a83d7bd71306a5b867e95fd870f74d0c5308a904d5",
}

_AUDIO_CODE = re.compile(r"<\|audio_code_(\d+)\|>")


# --- audio-code tokens ---------------------------------------------------------------------------


def audio_code_token(n: int) -> str:
    """`<|audio_code_N|>`; N in 0..65534 (only < 64000 are valid FSQ codes)."""
    if not 0 <= n < NUM_AUDIO_CODE_TOKENS:
        raise ValueError(f"audio code {n} outside 0..{NUM_AUDIO_CODE_TOKENS - 1}")
    return f"<|audio_code_{n}|>"


def audio_code_id(n: int) -> int:
    """Token id of code N: 151669 + N."""
    audio_code_token(n)
    return AUDIO_CODE_BASE_ID + n


def audio_codes_text(codes: Iterable[int]) -> str:
    """Codes as the concatenated token string the LM reads and writes (no separators)."""
    return "".join(audio_code_token(int(n)) for n in codes)


def parse_audio_codes(text: str, clamp: bool = False) -> list[int]:
    """Every `<|audio_code_N|>` in `text`, in order. `clamp=True` maps N into the valid FSQ range
    0..63999 like upstream's code-string parser; otherwise N is returned as written."""
    codes = [int(m) for m in _AUDIO_CODE.findall(text)]
    if clamp:
        codes = [min(max(n, 0), NUM_VALID_AUDIO_CODES - 1) for n in codes]
    return codes


def audio_codes_from_ids(ids: Iterable[int]) -> list[int]:
    """The codes among token ids (other ids are skipped)."""
    return [i - AUDIO_CODE_BASE_ID for i in ids if AUDIO_CODE_BASE_ID <= i < LM_VOCAB_SIZE]


# --- building the tokenizer.json and the side files ----------------------------------------------


def _added_token(token_id: int, content: str, special: bool) -> dict:
    return {
        "id": token_id,
        "content": content,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": special,
    }


def _added_tokens(with_audio_codes: bool) -> list[tuple[str, bool]]:
    tokens = list(QWEN3_ADDED_TOKENS)
    if with_audio_codes:
        tokens += [(f"<|audio_code_{n}|>", True) for n in range(NUM_AUDIO_CODE_TOKENS)]
    return tokens


def _read_merges() -> list[list[str]]:
    lines = (ASSETS / "merges.txt").read_text(encoding="utf-8").split("\n")
    # First line is "#version: 0.2"; each merge is "left right" (byte-level symbols, no spaces).
    return [line.split(" ") for line in lines[1:] if line]


def _backend(with_audio_codes: bool) -> Tokenizer:
    """The `tokenizers` object, built from a JSON spec so every flag is explicit (the Python
    constructors of ByteLevel decoders ignore their flags; the official file has them false)."""
    added = _added_tokens(with_audio_codes)
    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            _added_token(PAD_ID + i, text, special) for i, (text, special) in enumerate(added)
        ],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": SPLIT_REGEX},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {"type": "ByteLevel", **_BYTE_LEVEL},
            ],
        },
        "post_processor": {"type": "ByteLevel", **_BYTE_LEVEL},
        "decoder": {"type": "ByteLevel", **_BYTE_LEVEL},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": json.loads((ASSETS / "vocab.json").read_text(encoding="utf-8")),
            "merges": _read_merges(),
        },
    }
    backend = Tokenizer.from_str(json.dumps(spec, ensure_ascii=False))
    if not with_audio_codes:
        # Qwen3-Embedding appends <|endoftext|> to every sequence (single "$A <eot>",
        # pair "$A $B <eot>", all type id 0), after the byte-level step.
        template = processors.TemplateProcessing(
            single="$A:0 <|endoftext|>:0",
            pair="$A:0 $B:0 <|endoftext|>:0",
            special_tokens=[(PAD_TOKEN, PAD_ID)],
        )
        backend.post_processor = processors.Sequence(
            [processors.ByteLevel(**_BYTE_LEVEL), template]
        )
    return backend


def _dump(obj: object) -> bytes:
    """transformers 4.x's JSON layout for tokenizer side files: indent 2, sorted keys, UTF-8,
    one trailing newline."""
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


def _token_dict(content: str) -> dict:
    return {
        "content": content,
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
    }


def tokenizer_files(with_audio_codes: bool = True) -> Mapping[str, bytes]:
    """File name -> bytes of the tokenizer folder (LM with audio codes, else Qwen3-Embedding).
    Cached per process (~45 MB for the LM) so writing a checkpoint tree stays fast."""
    return MappingProxyType(_tokenizer_files(with_audio_codes))


@functools.lru_cache(maxsize=2)
def _tokenizer_files(with_audio_codes: bool) -> dict[str, bytes]:
    added = _added_tokens(with_audio_codes)
    extra = [text for text, _ in added[26:]] if with_audio_codes else list(QWEN3_EXTRA_SPECIAL)
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(PAD_ID + i): {**_token_dict(text), "special": special}
            for i, (text, special) in enumerate(added)
        },
        "additional_special_tokens": extra,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS_TOKEN,
        "errors": "replace",
        "extra_special_tokens": {},
        "model_max_length": MODEL_MAX_LENGTH,
        "pad_token": PAD_TOKEN,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    template = "chat_template.jinja" if with_audio_codes else "chat_template_base.jinja"
    return {
        "tokenizer.json": _backend(with_audio_codes).to_str(pretty=True).encode("utf-8"),
        "tokenizer_config.json": _dump(config),
        "special_tokens_map.json": _dump(
            {
                "additional_special_tokens": extra,
                "eos_token": _token_dict(EOS_TOKEN),
                "pad_token": _token_dict(PAD_TOKEN),
            }
        ),
        "added_tokens.json": _dump({text: PAD_ID + i for i, (text, _) in enumerate(added)}),
        "chat_template.jinja": (ASSETS / template).read_bytes(),
        "vocab.json": (ASSETS / "vocab.json").read_bytes(),
        "merges.txt": (ASSETS / "merges.txt").read_bytes(),
    }


def _write_folder(out_dir: str | Path, files: Mapping[str, bytes]) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (out / name).write_bytes(data)
    return out


def save_lm_tokenizer(out_dir: str | Path) -> Path:
    """Write the LM tokenizer folder (7 files, byte-identical to the official 0.6B LM's)."""
    return _write_folder(out_dir, tokenizer_files(True))


def save_text_tokenizer(out_dir: str | Path) -> Path:
    """Write the Qwen3-Embedding tokenizer folder (tokenizer.json etc. as published)."""
    return _write_folder(out_dir, tokenizer_files(False))


# --- transformers tokenizers ---------------------------------------------------------------------


def _wrap(
    backend: Tokenizer | None,
    file: Path | None,
    chat_template: str | None,
    extra_special: Sequence[str],
    eos: str | None = EOS_TOKEN,
    pad: str | None = PAD_TOKEN,
    max_length: int = MODEL_MAX_LENGTH,
) -> PreTrainedTokenizerFast:
    source = {"tokenizer_object": backend} if backend is not None else {"tokenizer_file": str(file)}
    tokenizer = PreTrainedTokenizerFast(
        **source,
        eos_token=eos,
        pad_token=pad,
        chat_template=chat_template,
        model_max_length=max_length,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
    )
    # Set after construction: passing 65k extra special tokens to the constructor costs ~25 s in
    # transformers 5 (a list-membership check per token); the setter only stores the list.
    tokenizer.extra_special_tokens = list(extra_special)
    return tokenizer


def _from_files(
    files: Mapping[str, bytes], extra_special: Sequence[str]
) -> PreTrainedTokenizerFast:
    backend = Tokenizer.from_str(files["tokenizer.json"].decode("utf-8"))
    return _wrap(backend, None, files["chat_template.jinja"].decode("utf-8"), extra_special)


def build_lm_tokenizer(out_dir: str | Path | None = None) -> PreTrainedTokenizerFast:
    """The 5 Hz LM tokenizer with its chat template; also written to `out_dir` when given."""
    if out_dir is not None:
        return load_tokenizer(save_lm_tokenizer(out_dir))
    extra = [audio_code_token(n) for n in range(NUM_AUDIO_CODE_TOKENS)]
    return _from_files(tokenizer_files(True), extra)


def build_text_tokenizer(out_dir: str | Path | None = None) -> PreTrainedTokenizerFast:
    """The Qwen3-Embedding tokenizer (no audio codes; appends <|endoftext|> on encode)."""
    if out_dir is not None:
        return load_tokenizer(save_text_tokenizer(out_dir))
    return _from_files(tokenizer_files(False), QWEN3_EXTRA_SPECIAL)


def _token_text(value: object) -> str | None:
    """Config files spell a token as a string or as an AddedToken dict with "content"."""
    if isinstance(value, dict):
        return value.get("content")
    return None if value is None else str(value)


def load_tokenizer(folder: str | Path) -> PreTrainedTokenizerFast:
    """A tokenizer folder in the official layout (tokenizer.json + tokenizer_config.json,
    chat template in chat_template.jinja or the config). Works for the LM and the text encoder."""
    folder = Path(folder)
    file = folder / "tokenizer.json"
    if not file.is_file():
        raise CheckpointError(f"{file}: missing (expected the tokenizers-format tokenizer file)")
    config_path = folder / "tokenizer_config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        config = {}
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{config_path}: unreadable ({exc})") from exc
    template_path = folder / "chat_template.jinja"
    template = (
        template_path.read_text(encoding="utf-8")
        if template_path.is_file()
        else config.get("chat_template")
    )
    extra = config.get("additional_special_tokens") or config.get("extra_special_tokens") or []
    try:
        return _wrap(
            None,
            file,
            template,
            [_token_text(t) for t in extra] if isinstance(extra, list) else [],
            eos=_token_text(config.get("eos_token", EOS_TOKEN)),
            pad=_token_text(config.get("pad_token", PAD_TOKEN)),
            max_length=int(config.get("model_max_length", MODEL_MAX_LENGTH)),
        )
    except Exception as exc:  # tokenizers raises plain Exceptions on malformed JSON
        raise CheckpointError(f"{file}: not a readable tokenizer ({exc})") from exc


load_lm_tokenizer = load_tokenizer
load_text_tokenizer = load_tokenizer


# --- training sequences --------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainingSequence:
    """One LM training sample. Token positions: [0, cot_start) is the prompt through
    `<|im_start|>assistant\\n`; cot_start is `<think>`; codes_start is the first code (right after
    `</think>\\n\\n`); codes_end is the closing `<|im_end|>`; a final `\\n` (198) follows it when
    the template's trailing newline is kept."""

    text: str
    input_ids: list[int]
    cot_start: int
    codes_start: int
    codes_end: int


def render_training_sequence(
    tokenizer: PreTrainedTokenizerFast,
    caption: str,
    lyrics: str,
    cot_text: str,
    codes: Sequence[int],
    drop_condition: bool = False,
    negative_prompt: str = prompts.DEFAULT_NEGATIVE_PROMPT,
    final_newline: bool = True,
) -> TrainingSequence:
    """The trained layout `…<|im_start|>assistant\\n<think>\\n{yaml}\\n</think>\\n\\n{codes}
    <|im_end|>\\n`, rendered by the chat template from [system, user, assistant = CoT + codes].
    `drop_condition=True` renders a CFG-dropout sample (user "NO USER INPUT", empty CoT).
    `final_newline=False` drops the trailing "\\n" (HOT-Step / Side-Step-fork sequences)."""
    assistant = (prompts.EMPTY_COT if drop_condition else cot_text) + audio_codes_text(codes)
    if drop_condition:
        messages = prompts.lm_phase2_uncond_messages(
            negative_prompt=negative_prompt, assistant=assistant
        )
    else:
        messages = prompts.lm_phase2_messages(caption, lyrics, assistant)
    text = prompts.render_chat(tokenizer, messages, add_generation_prompt=False)
    if not final_newline:
        text = text.removesuffix("\n")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    cot_start = ids.index(THINK_ID)
    codes_start = ids.index(THINK_END_ID) + 2  # `</think>` then "\n\n" (one token, 271)
    codes_end = len(ids) - (2 if final_newline else 1)
    if ids[codes_end] != IM_END_ID or codes_end - codes_start != len(codes):
        raise ValueError("chat template did not render the trained LM layout")
    return TrainingSequence(text, ids, cot_start, codes_start, codes_end)
