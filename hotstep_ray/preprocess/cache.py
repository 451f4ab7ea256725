"""The tensor cache on storage: one `<stem>.safetensors` per sample plus three variant files.

    tensors/<slug>/<variant_key>/
      <stem>.safetensors      per-sample tensors (below); metadata in the safetensors header
      <stem>.pt               optional, Side-Step's layout (torch.save of plain tensors + dict)
      preprocess_meta.json    variant key, models, fingerprint, options, per-sample entries
      lm_codes.jsonl          one line per good sample: 5 Hz codes + the LM prompt fields
      channel_stats.json      per-channel mean/std of target_latents over every frame

Tensors of `<stem>.safetensors` (T latent frames at 25 Hz, L condition tokens, H = condition
width, 2048 for the real models; float tensors in the run's dtype, F32 or BF16):

    target_latents                [T, 64]   VAE posterior sample of the 48 kHz stereo song
    attention_mask                [T]       ones (float; kept for Side-Step-style readers)
    context_latents               [T, 128]  silence_latent[:T] ‖ ones(64)
    encoder_hidden_states         [L, H]    packed condition: lyric | 1 timbre | text; no pads
    encoder_attention_mask        [L]       ones
    encoder_hidden_states_genre   [Lg, H]   optional: the condition with caption text = genre
    encoder_attention_mask_genre  [Lg]      optional
    audio_codes                   [T5]      int64 FSQ codes at 5 Hz, T5 = ceil(T / 5)

Header metadata (all strings): `format`, the scalar fields of `SampleMeta` (prompts, sizes,
source facts) as text, and `json` holding the same dict with its real types. Nothing here is
ever unpickled: safetensors is read with `safetensors.torch.load`, and the `.pt` files are
written for Side-Step only.

The header is the sample's own record: its `settings_hash` (the run settings, model fingerprint
and the sample's prompt fields, `plan.settings_hash`) and `checksum` (of the source file) say what
the file was made from, whatever preprocess_meta.json claims. The planner checks it before it
counts a file as cached (a killed run with other settings may have overwritten the file since the
meta was written) and rebuilds a meta entry from it for a file a killed run wrote but never got to
record (`entry_from_file`), so a rerun keeps every song that landed.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors

from hotstep_ray.core import safetensors_header
from hotstep_ray.core.contracts import LATENT_HZ
from hotstep_ray.core.errors import HotstepError
from hotstep_ray.core.storage import Storage
from hotstep_ray.preprocess.items import EncodedSample
from hotstep_ray.preprocess.sample_job import FORMAT, SampleJob

CODES_FILE = "lm_codes.jsonl"
STATS_FILE = "channel_stats.json"
STD_FLOOR_VAR = 1e-10  # variance floor of channel_stats (HOT-Step's)
# What lm_codes.jsonl carries besides sample_id, file and codes: the LM prompt's inputs.
CODE_LINE_FIELDS = (
    "caption",
    "genre",
    "lyrics",
    "bpm",
    "keyscale",
    "timesignature",
    "language",
    "is_instrumental",
    "custom_tag",
    "tag_position",
    "duration_s",
    "repeat",
)
PT_KEYS = (
    "target_latents",
    "attention_mask",
    "encoder_hidden_states",
    "encoder_attention_mask",
    "context_latents",
)
# The source facts `stages.decode_job` records (checksum + `stages.audio_facts`): part of both
# the header and the meta entry.
SOURCE_FACTS = (
    "checksum",
    "source_rate_hz",
    "source_channels",
    "source_duration_s",
    "truncated",
    "gain_db",
)
# The header fields a meta entry repeats, in the entry's order.
_ENTRY_FIELDS = (
    "t_latent",
    "s_total",
    "s_text",
    "s_lyric",
    "s_text_genre",
    "n_codes",
    "duration_s",
    "repeat",  # the DiT trainer's per-song epoch weight
)
_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}
_TAGS = {torch.float32: "F32", torch.bfloat16: "BF16", torch.int64: "I64", torch.float16: "F16"}


@dataclass
class SampleOutputs:
    """What one processed sample leaves behind: its meta entry, its codes line and its files."""

    entry: dict[str, Any]
    codes_line: str = ""
    files: dict[str, bytes] | None = None  # file name -> bytes, written by `write_outputs`


def file_checksum(storage: Storage, key: str) -> str:
    digest = hashlib.sha256()
    with storage.open(key) as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _own(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # A fresh compact tensor: a row sliced from a batch still owns the whole batch's storage,
    # which torch.save would write out in full.
    return tensor.to(dtype=dtype, copy=True).contiguous()


def sample_tensors(encoded: EncodedSample, dtype: str) -> dict[str, torch.Tensor]:
    cast = _DTYPES[dtype]
    frames = encoded.target_latents.shape[0]
    tensors = {
        "target_latents": _own(encoded.target_latents, cast),
        "attention_mask": torch.ones(frames, dtype=cast),
        "context_latents": _own(encoded.context_latents, cast),
        "encoder_hidden_states": _own(encoded.encoder_hidden_states, cast),
        "encoder_attention_mask": torch.ones(encoded.encoder_hidden_states.shape[0], dtype=cast),
        "audio_codes": _own(encoded.audio_codes, torch.int64),
    }
    if encoded.genre_hidden_states is not None:
        genre = encoded.genre_hidden_states
        tensors["encoder_hidden_states_genre"] = _own(genre, cast)
        tensors["encoder_attention_mask_genre"] = torch.ones(genre.shape[0], dtype=cast)
    return tensors


def channel_sums(latents: torch.Tensor) -> dict[str, Any]:
    """Per-channel sums of [T, 64] latents (float64), mergeable across samples."""
    values = latents.double()
    return {
        "frames": int(values.shape[0]),
        "sum": values.sum(dim=0).tolist(),
        "sumsq": (values * values).sum(dim=0).tolist(),
    }


def merge_channel_stats(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """channel_stats.json: mean and std (biased, variance floored at 1e-10) of every channel
    over all frames of all good samples."""
    stats = [e["stats"] for e in entries if e.get("ok") and e.get("stats")]
    frames = sum(s["frames"] for s in stats)
    if not frames:
        return {"channel_mean": [], "channel_std": [], "n_samples": 0, "n_frames": 0}
    total = torch.tensor([s["sum"] for s in stats], dtype=torch.float64).sum(dim=0)
    total_sq = torch.tensor([s["sumsq"] for s in stats], dtype=torch.float64).sum(dim=0)
    mean = total / frames
    var = (total_sq / frames - mean * mean).clamp_min(STD_FLOOR_VAR)
    return {
        "channel_mean": mean.tolist(),
        "channel_std": var.sqrt().tolist(),
        "n_samples": len(stats),
        "n_frames": frames,
    }


def _header(meta: dict[str, Any]) -> dict[str, str]:
    flat = {"format": FORMAT, "json": json.dumps(meta, ensure_ascii=False, sort_keys=True)}
    for key, value in meta.items():
        if isinstance(value, str):
            flat[key] = value
        elif isinstance(value, bool | int | float) or value is None:
            flat[key] = "" if value is None else json.dumps(value)
    return flat


def safetensors_bytes(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> bytes:
    """The safetensors format written deterministically: header keys and tensors in name order
    (the library's writer orders metadata through a Rust HashMap, so two processes writing the
    same tensors produce different bytes; the cache wants equal bytes for equal content)."""
    header: dict[str, Any] = {"__metadata__": dict(sorted(metadata.items()))}
    blobs, offset = [], 0
    for name in sorted(tensors):
        tensor = tensors[name].detach().contiguous().cpu()
        data = tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
        header[name] = {
            "dtype": _TAGS[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)  # the data section starts 8-byte aligned
    return len(text).to_bytes(8, "little") + text + b"".join(blobs)


def pt_bytes(tensors: dict[str, torch.Tensor], metadata: dict[str, Any]) -> bytes:
    """Side-Step's `<stem>.pt`: torch.save of the five training tensors + its pass-1 metadata
    dict (plain str/int/bool/None values, so `torch.load(weights_only=True)` reads it)."""
    buffer = io.BytesIO()
    # Through JSON first: pickle memoises repeated objects by identity, so the same dict built
    # two ways (plain path vs a Ray row) would otherwise give different bytes.
    plain = json.loads(json.dumps(metadata, ensure_ascii=False))
    torch.save({**{k: tensors[k] for k in PT_KEYS}, "metadata": plain}, buffer)
    return buffer.getvalue()


def build_outputs(
    job: SampleJob,
    encoded: EncodedSample,
    prepared: dict[str, Any],
    prompts: dict[str, str | None],
    plan_info: dict[str, Any],
) -> SampleOutputs:
    """The files and meta entry of one encoded sample (no I/O). `prepared`: the audio facts
    (`audio_facts`); `prompts`: caption/lyric/genre prompt text; `plan_info`: run-wide facts
    (variant_key, model_variant, fingerprint, dtype, sidestep_pt)."""
    dtype = plan_info["dtype"]
    tensors = sample_tensors(encoded, dtype)
    frames = int(encoded.target_latents.shape[0])
    record = job.record
    meta = {
        "sample_id": job.sample_id,
        "rel_path": job.rel_path,
        "audio_path": job.audio_path,
        "variant_key": plan_info["variant_key"],
        "model_variant": plan_info["model_variant"],
        "model_fingerprint": plan_info["fingerprint"],
        "dtype": dtype,
        "latent_hz": LATENT_HZ,
        "t_latent": frames,
        "s_total": int(encoded.encoder_hidden_states.shape[0]),
        "s_text": encoded.s_text,
        "s_lyric": encoded.s_lyric,
        "s_text_genre": encoded.s_text_genre,
        "n_codes": int(encoded.audio_codes.shape[0]),
        "duration_s": frames / LATENT_HZ,
        "caption_prompt": prompts["caption"],
        "lyric_prompt": prompts["lyric"],
        "genre_prompt": prompts.get("genre") or "",
        "caption": record.get("caption") or "",
        "genre": record.get("genre") or "",
        "lyrics": record.get("lyrics") or "",
        "bpm": record.get("bpm"),
        "keyscale": record.get("keyscale") or "",
        "timesignature": record.get("timesignature") or "",
        "language": record.get("language") or "",
        "is_instrumental": bool(record.get("is_instrumental", False)),
        "custom_tag": record.get("custom_tag") or "",
        "tag_position": job.tag_position,
        "prompt_override": record.get("prompt_override") or "",
        "use_genre": job.use_genre,
        "repeat": int(record.get("repeat") or 1),
        "settings_hash": job.settings_hash,
        **prepared,
    }
    safetensors_data = safetensors_bytes(tensors, _header(meta))
    files = {f"{job.stem}.safetensors": safetensors_data}
    pt_file = None
    if plan_info["sidestep_pt"]:
        pt_file = f"{job.stem}.pt"
        files[pt_file] = pt_bytes(tensors, job.pt_metadata)
    stats = channel_sums(tensors["target_latents"])
    entry = sample_entry(job, meta, prepared, pt_file, len(safetensors_data), stats)
    line = {"sample_id": job.sample_id, "file": entry["file"]}
    line["codes"] = encoded.audio_codes.tolist()
    line.update({key: meta[key] for key in CODE_LINE_FIELDS})
    codes_line = json.dumps(line, ensure_ascii=False)
    return SampleOutputs(entry=entry, codes_line=codes_line, files=files)


def sample_entry(
    job: SampleJob,
    header: dict[str, Any],
    prepared: dict[str, Any],
    pt_file: str | None,
    size: int,
    stats: dict[str, Any],
) -> dict[str, Any]:
    """The meta entry of a good sample: `header` its typed header metadata, `size` its
    safetensors file's bytes, `stats` its `channel_sums`."""
    return {
        **_job_entry(job),
        "ok": True,
        "error": "",
        "file": f"{job.stem}.safetensors",
        "pt_file": pt_file,
        **{name: header[name] for name in _ENTRY_FIELDS},
        "bytes": size,
        "stats": stats,
        **prepared,
    }


def _job_entry(job: SampleJob) -> dict[str, Any]:
    return {
        "sample_id": job.sample_id,
        "rel_path": job.rel_path,
        "audio_path": job.audio_path,
        "src_size": job.src_size,
        "src_mtime_ns": job.src_mtime_ns,
        "settings_hash": job.settings_hash,
    }


def failed_outputs(
    job: SampleJob, error: str, prepared: dict[str, Any] | None = None
) -> SampleOutputs:
    entry = {**_job_entry(job), **(prepared or {}), "ok": False, "error": error, "file": None}
    entry["pt_file"] = None
    return SampleOutputs(entry=entry)


def write_outputs(
    storage: Storage, tensor_dir: str, job: SampleJob, outputs: SampleOutputs
) -> None:
    """Write a sample's files atomically, the safetensors last; drop a stale `.pt` the run no
    longer produces. The safetensors header is what a rerun trusts, so a `.pt` is rewritten
    only once the old safetensors is gone: a run killed between the two writes leaves no header
    that vouches for another run's `.pt`."""
    files = dict(outputs.files or {})
    main = f"{job.stem}.safetensors"
    data = files.pop(main, None)
    if files:
        storage.delete(f"{tensor_dir}/{main}")
    for name, blob in files.items():
        storage.write_bytes(f"{tensor_dir}/{name}", blob)
    if data is not None:
        storage.write_bytes(f"{tensor_dir}/{main}", data)
    if outputs.entry.get("ok") and not outputs.entry.get("pt_file"):
        storage.delete(f"{tensor_dir}/{job.stem}.pt")


def read_header(storage: Storage, key: str) -> dict[str, Any] | None:
    """The typed header metadata (`json`) of a cached sample, reading only the header (no
    tensor bytes); None when the file is missing, truncated or not one of ours."""
    try:
        meta = json.loads(safetensors_header.read_metadata(storage, key).get("json") or "null")
    except (HotstepError, OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def entry_from_file(
    storage: Storage, key: str, job: SampleJob, header: dict[str, Any], pt_file: str | None
) -> dict[str, Any] | None:
    """The meta entry `build_outputs` made for the file at `key` (whose typed header is
    `header`), rebuilt from the file: what a killed run wrote but never recorded in the meta.
    Reads the tensors once, for the channel sums. None when the file does not hold them."""
    try:
        tensors, _ = read_sample(storage, key)
        prepared = {name: header[name] for name in SOURCE_FACTS}
        stats = channel_sums(tensors["target_latents"])
        return sample_entry(job, header, prepared, pt_file, storage.size(key), stats)
    except (HotstepError, OSError, ValueError, KeyError, SafetensorError):
        return None


def read_sample(storage: Storage, key: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(tensors, typed metadata) of one cached sample, without unpickling anything."""
    data = storage.read_bytes(key)
    tensors = load_safetensors(data)
    header, _ = safetensors_header.split(data)
    meta = json.loads((header.get("__metadata__") or {}).get("json", "{}"))
    return tensors, meta
