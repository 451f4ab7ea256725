"""Every adapter under the storage root, per-adapter trigger words, and the trigger stamper.

Ids are storage keys relative to `adapters/`: `lm-06b/<artist>/<run>`, `dit-turbo/<artist>/<run>`,
legacy `lm-06b/<artist>` (weights in the artist folder), `lm/<artist>-<size>` and `<artist>` (a
DiT folder at the adapters root). A request may also name `lm-06b/<artist>` (newest run) or just
`<artist>` (under the serving model's own base folder).

Trigger resolution per adapter: manual override -> embedded safetensors metadata
(`hot_step_trigger`, else `modelspec.trigger_phrase`; position `hot_step_trigger_position`) ->
folder-name fallback (the artist folder) -> none. A stack may mix placements: any `replace` wins
outright, else `w1, w2, caption` for prepends and `caption, w3` for appends, deduplicated, and a
word already in the caption is not added again.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime

from pydantic.alias_generators import to_camel

from hotstep_ray.audition.errors import NotFoundError
from hotstep_ray.audition.schemas import TriggerInfo
from hotstep_ray.core import layout, safetensors_header
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage

ROOT = "adapters"
SIZE_OF_FOLDER = {folder: size for size, folder in layout.LM_SIZE_FOLDERS.items()}
TRIGGER_KEYS = ("hot_step_trigger", "hot_step_trigger_position", "modelspec.trigger_phrase")


@dataclass
class AdapterEntry:
    id: str  # key under adapters/
    kind: str  # lm | dit
    base_folder: str  # lm-06b, dit-turbo, lm (legacy) or "" (legacy DiT at the root)
    base: str  # LM size ("0.6B") or DiT shorthand ("dit-turbo"); "" when unknown
    artist: str
    run: str  # run stamp, "" for a legacy unversioned adapter
    legacy: bool
    format: str  # lora | lokr
    weights: str  # weights file name
    size_bytes: int
    trained_at: str  # ISO local time from the run stamp, else the file's mtime
    trigger: TriggerInfo

    def to_json_dict(self) -> dict:
        """camelCase keys (`baseFolder`, `sizeBytes`, `trainedAt`), as every other route and the
        trigger's own contract."""
        out = {to_camel(name): value for name, value in asdict(self).items()}
        out["trigger"] = self.trigger.to_json_dict()
        return out


# -- safetensors header ----------------------------------------------------------------------
# -- triggers ---------------------------------------------------------------------------------
def folder_word(key: str) -> str:
    """The folder-name trigger of an adapter folder key: the artist folder (the parent of a
    run stamp), without a legacy `-<size>` suffix; "" for a base folder or nothing usable."""
    parts = [p for p in key.strip("/").split("/") if p]
    if parts and parts[-1] in layout.ADAPTER_WEIGHT_FILES:
        parts = parts[:-1]
    if parts and parts[-1] == layout.DIFFUSERS_NAMES_DIR:  # the run's diffusers-names copy
        parts = parts[:-1]
    if len(parts) >= 2 and parts[-2] == layout.MILESTONE_DIR:  # `<run>/milestones/<name>`
        parts = parts[:-2]
    if parts and layout.is_run_stamp(parts[-1]):
        parts = parts[:-1]
    if not parts:
        return ""
    word = parts[-1]
    for size in layout.LM_SIZE_FOLDERS:
        word = word.removesuffix(f"-{size}")
    if word in (ROOT, "lm") or word in SIZE_OF_FOLDER or word.startswith("dit-"):
        return ""
    return word


def embedded_trigger(meta: Mapping[str, str]) -> tuple[str, str] | None:
    word = meta.get("hot_step_trigger") or meta.get("modelspec.trigger_phrase") or ""
    if not word.strip():
        return None
    position = meta.get("hot_step_trigger_position") or "prepend"
    return word.strip(), position if position in ("prepend", "append", "replace") else "prepend"


def resolve_trigger(
    storage: Storage,
    folder: str,
    override: TriggerInfo | None = None,
    folder_fallback: bool = True,
) -> TriggerInfo:
    """The trigger of the adapter in `folder` (a storage key): override, embedded, folder, none."""
    if override is not None and override.word.strip():
        return TriggerInfo(
            word=override.word.strip(), placement=override.placement, source="override", path=folder
        )
    key = layout.weights_key(storage, folder)
    if key is not None:
        found = embedded_trigger(safetensors_header.read_metadata(storage, key))
        if found:
            return TriggerInfo(word=found[0], placement=found[1], source="embedded", path=folder)
    word = folder_word(folder) if folder_fallback else ""
    if word:
        return TriggerInfo(word=word, placement="prepend", source="folder", path=folder)
    return TriggerInfo(source="none", path=folder)


def _present(caption: str, word: str) -> bool:
    return word.lower() in caption.lower()


def apply_triggers(caption: str, specs: Iterable[TriggerInfo], skip_present: bool = True) -> str:
    """Apply a stack of triggers to a caption (see the module docstring)."""
    specs = [s for s in specs if s.word.strip() and s.source != "none"]
    replace = [s.word for s in specs if s.placement == "replace"]
    if replace:
        return ", ".join(dict.fromkeys(replace))
    front = [s.word for s in specs if s.placement == "prepend"]
    back = [s.word for s in specs if s.placement == "append"]
    if skip_present:
        front = [w for w in front if not _present(caption, w)]
        back = [w for w in back if not _present(caption, w)]
    front, back = list(dict.fromkeys(front)), [w for w in dict.fromkeys(back) if w not in front]
    return ", ".join([*front, caption] if caption else front) + "".join(f", {w}" for w in back)


# -- resolving a requested id ----------------------------------------------------------------
def _check_id(adapter_id: str) -> list[str]:
    parts = [p for p in adapter_id.strip().strip("/").split("/") if p]
    if not parts or len(parts) > 3:
        raise InputError(f"adapter id {adapter_id!r}: expected <base>/<artist>[/<run>] or <artist>")
    for part in parts:
        layout.check_name(part, "adapter id part")
    return parts


def resolve_lm_adapter(storage: Storage, adapter_id: str, lm_size: str) -> str:
    """Storage key of an LM adapter for an LM of `lm_size`; NotFoundError when absent,
    InputError when it was trained on another LM size."""
    parts = _check_id(adapter_id)
    own = layout.LM_SIZE_FOLDERS[lm_size]
    if parts[0] == "lm" and len(parts) == 2:  # legacy lm/<artist>-<size>
        size = next((s for s in layout.LM_SIZE_FOLDERS if parts[1].endswith(f"-{s}")), None)
        if size and size != lm_size:
            raise InputError(
                f"adapter {adapter_id!r} was trained on the {size} LM; this is {lm_size}"
            )
        key = f"{ROOT}/{parts[0]}/{parts[1]}"
        if layout.has_weights(storage, key):
            return key
        raise NotFoundError(f"LM adapter {adapter_id!r} not found")
    if parts[0] in SIZE_OF_FOLDER:
        if parts[0] != own:
            raise InputError(
                f"adapter {adapter_id!r} was trained on the {SIZE_OF_FOLDER[parts[0]]} LM; "
                f"this planner serves {lm_size}"
            )
        parts = parts[1:]
    return _resolve_under(storage, f"{ROOT}/{own}", parts, adapter_id, "LM")


def resolve_dit_adapter(storage: Storage, adapter_id: str, dit_model: str) -> str:
    """Storage key of a DiT adapter for the DiT folder `dit_model` (e.g. acestep-v15-turbo)."""
    parts = _check_id(adapter_id)
    own = layout.dit_shorthand(dit_model)
    if parts[0].startswith("dit-"):
        if parts[0] != own:
            raise InputError(f"adapter {adapter_id!r} was trained on {parts[0]}; this DiT is {own}")
        parts = parts[1:]
    elif len(parts) == 1 and layout.has_weights(storage, f"{ROOT}/{parts[0]}"):
        return f"{ROOT}/{parts[0]}"  # legacy: a DiT adapter folder at the adapters root
    return _resolve_under(storage, f"{ROOT}/{own}", parts, adapter_id, "DiT")


def _resolve_under(
    storage: Storage, base: str, parts: list[str], adapter_id: str, what: str
) -> str:
    if len(parts) == 2:
        key = f"{base}/{parts[0]}/{parts[1]}"
        if layout.has_weights(storage, key):
            return key
    elif len(parts) == 1:
        key = layout.resolve_adapter(storage, base, parts[0])
        if key:
            return key
    raise NotFoundError(f"{what} adapter {adapter_id!r} not found under {base}/")


# -- listing ----------------------------------------------------------------------------------
def _trained_at(storage: Storage, run: str, weights: str) -> str:
    if run:
        try:
            stamp = run.split("-")[:5]  # drop a collision suffix
            return datetime.strptime("-".join(stamp), layout.RUN_STAMP_FORMAT).isoformat()
        except ValueError:
            pass
    mtime = storage.mtime_ns(weights)
    return datetime.fromtimestamp(mtime / 1e9).isoformat(timespec="seconds") if mtime else ""


def _entry(
    storage: Storage,
    folder: str,
    kind: str,
    base_folder: str,
    base: str,
    artist: str,
    run: str,
    legacy: bool,
) -> AdapterEntry | None:
    weights = layout.weights_key(storage, folder)
    if weights is None:
        return None
    files = [k for k in storage.list(folder) if not storage.is_dir(k) and not k.endswith(".bak")]
    size = sum(storage.size(k) for k in files)
    return AdapterEntry(
        id=folder.removeprefix(f"{ROOT}/"),
        kind=kind,
        base_folder=base_folder,
        base=base,
        artist=artist,
        run=run,
        legacy=legacy,
        format="lora" if weights.endswith(layout.ADAPTER_WEIGHT_FILES[0]) else "lokr",
        weights=weights.rsplit("/", 1)[-1],
        size_bytes=size,
        trained_at=_trained_at(storage, run, weights),
        trigger=resolve_trigger(storage, folder),
    )


def _dirs(storage: Storage, key: str) -> list[str]:
    return [
        k
        for k in storage.list(key)
        if not k.rsplit("/", 1)[-1].startswith(".") and storage.is_dir(k)
    ]


def list_adapters(storage: Storage) -> list[AdapterEntry]:
    """Every LM and DiT adapter (runs, legacy forms), sorted by id."""
    found: list[AdapterEntry | None] = []
    for base_key in _dirs(storage, ROOT):
        name = base_key.rsplit("/", 1)[-1]
        if name in SIZE_OF_FOLDER or name.startswith("dit-"):
            kind = "lm" if name in SIZE_OF_FOLDER else "dit"
            base = SIZE_OF_FOLDER.get(name, name)
            for artist_key in _dirs(storage, base_key):
                artist = artist_key.rsplit("/", 1)[-1]
                found.append(_entry(storage, artist_key, kind, name, base, artist, "", True))
                for run_key in _dirs(storage, artist_key):
                    run = run_key.rsplit("/", 1)[-1]
                    found.append(_entry(storage, run_key, kind, name, base, artist, run, False))
        elif name == "lm":
            for legacy_key in _dirs(storage, base_key):
                artist = legacy_key.rsplit("/", 1)[-1]
                size = next((s for s in layout.LM_SIZE_FOLDERS if artist.endswith(f"-{s}")), "")
                found.append(_entry(storage, legacy_key, "lm", "lm", size, artist, "", True))
        elif name != layout.MM3_LM_FOLDER:
            found.append(_entry(storage, base_key, "dit", "", "", name, "", True))
    return sorted((e for e in found if e is not None), key=lambda e: e.id)


# -- stamping older adapters -----------------------------------------------------------------
@dataclass
class StampResult:
    key: str
    trigger: str
    position: str
    source: str  # manual | folder
    current: dict[str, str]  # trigger keys found before
    changed: bool  # the metadata would change (or did)
    written: bool
    payload_sha256: str  # of the tensor bytes: identical before and after

    def to_json_dict(self) -> dict:
        return asdict(self)


def restamp(data: bytes, updates: Mapping[str, str]) -> bytes:
    """New safetensors bytes with `updates` merged into `__metadata__`; the tensor payload is
    copied untouched (offsets are relative to it) and the header is space-padded so the payload
    starts on an 8-byte boundary."""
    header, payload = safetensors_header.split(data)
    meta = dict(header.pop("__metadata__", None) or {})
    meta.update(updates)
    text = json.dumps({"__metadata__": meta, **header}, separators=(",", ":"), ensure_ascii=False)
    raw = text.encode("utf-8")
    raw += b" " * ((-(8 + len(raw))) % 8)
    return struct.pack("<Q", len(raw)) + raw + payload


def _weights_files(storage: Storage, key: str) -> list[str]:
    if key.endswith(".safetensors"):
        if not storage.exists(key):
            raise NotFoundError(f"{storage.url_of(key)} not found")
        return [key]
    names = set(layout.ADAPTER_WEIGHT_FILES)
    files = [k for k in storage.walk_files(key) if k.rsplit("/", 1)[-1] in names]
    if not files:
        raise NotFoundError(f"no adapter weights under {storage.url_of(key)}")
    return files


def stamp_triggers(
    storage: Storage,
    key: str = "",
    trigger: str | None = None,
    position: str = "prepend",
    write: bool = False,
) -> list[StampResult]:
    """Write the trigger triple into every adapter weights file at/under `key`. The word is
    `trigger`, else each adapter's folder name. Dry run unless `write`; when writing, the old
    file is kept as `<name>.bak` (never overwritten) and the new tensor payload is verified
    byte-identical (SHA-256) before the rename."""
    if position not in ("prepend", "append"):
        raise InputError(f"position {position!r}: stamp prepend or append (replace embeds nothing)")
    results = []
    for file_key in _weights_files(storage, key):
        word, source = (trigger.strip(), "manual") if trigger and trigger.strip() else ("", "")
        if not word:
            word, source = folder_word(storage.full_path(file_key)), "folder"
        data = storage.read_bytes(file_key)
        header, payload = safetensors_header.split(data)
        meta = header.get("__metadata__") or {}
        current = {k: meta[k] for k in TRIGGER_KEYS if k in meta}
        wanted = {}
        if word:
            wanted = {
                "hot_step_trigger": word,
                "hot_step_trigger_position": position,
                "modelspec.trigger_phrase": word,
            }
        changed = bool(wanted) and any(meta.get(k) != v for k, v in wanted.items())
        digest = hashlib.sha256(payload).hexdigest()
        written = False
        if write and changed:
            new = restamp(data, wanted)
            new_header, new_payload = safetensors_header.split(new)
            if hashlib.sha256(new_payload).hexdigest() != digest or (len(new) - len(payload)) % 8:
                raise RuntimeError(f"{file_key}: restamp changed the tensor bytes; nothing written")
            if {k: v for k, v in new_header.items() if k != "__metadata__"} != {
                k: v for k, v in header.items() if k != "__metadata__"
            }:
                raise RuntimeError(f"{file_key}: restamp changed the tensor index; nothing written")
            if not storage.exists(file_key + ".bak"):
                storage.write_bytes(file_key + ".bak", data)
            storage.write_bytes(file_key, new)
            written = True
        results.append(
            StampResult(file_key, word, position, source, current, changed, written, digest)
        )
    return results
