"""Where every artifact lives under the storage root. Only this module spells out paths.

    datasets/<slug>/dataset_meta.json        the dataset summary (our own record)
    datasets/<slug>/dataset.json             the built, Side-Step-readable dataset
    datasets/<slug>/labels/<sample_id>.json  studio-private label store (sources, analyzer output)
    tensors/<slug>/<variant_key>/            preprocessed tensor cache
    adapters/lm-06b|lm-17b|lm-4b/<artist>/<run>/   5 Hz LM adapters, by base size
    adapters/dit-<shorthand>/<artist>/<run>/       DiT adapters, by base model
    adapters/mm3-lm-adapters/<run>/                MM3 LM adapters
    adapters/mm3-dit/<artist>/<run>/               MM3 (MiniMax-Music3) DiT LoRAs
    jobs/<job_id>/job.json, jobs/<job_id>/events.jsonl
    previews/<preview_id>/

A run folder is named `YYYY-MM-DD_HH-MM-SS` (local time), so name order is time order. Legacy forms
(an adapter directly in the artist folder, flat `lm/<name>-<size>`, DiT folders at the adapters root)
are read by `resolve_adapter` but never written.
"""

from __future__ import annotations

import re
import time
from datetime import datetime

from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage

ADAPTER_WEIGHT_FILES = ("adapter_model.safetensors", "lokr_weights.safetensors")
LM_SIZE_FOLDERS = {"0.6B": "lm-06b", "1.7B": "lm-17b", "4B": "lm-4b"}
# The 5 Hz codes of a tensor cache, `tensors/<slug>/<variant_key>/lm_codes.jsonl` (preprocess writes
# it, train-lm and LM calibration read it).
LM_CODES_FILE = "lm_codes.jsonl"
MM3_LM_FOLDER = "mm3-lm-adapters"
MM3_DIT_FOLDER = "mm3-dit"  # one MM3 DiT release, so no per-base shorthand
MM3_DIT_WEIGHTS = "mm3_lora.safetensors"  # the filtered ComfyUI-format file of an MM3 run
RUN_STAMP_FORMAT = "%Y-%m-%d_%H-%M-%S"
_RUN_STAMP_RE = re.compile(r"^\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2}(-[0-9a-z]+)?$")
_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
# Inside a run folder: its kept milestone adapters (`milestones/<name>/`), and the DiT adapter's
# copy under diffusers' module names (docs/ADAPTERS.md says which loader reads which).
MILESTONE_DIR = "milestones"
DIFFUSERS_NAMES_DIR = "diffusers_names"
# ... and its resumable state (adapter, optimizer, RNG), which both trainers write there; the LM
# removes it once the run is exported
RUN_CHECKPOINT_DIR = "checkpoint"
# Where Ray Train keeps its own state of a `--ray` run (its checkpoints and results), one folder
# per run (`ray_run_dir`).
RAY_RESULTS = "ray_results"

# Exact DiT model stems (after quant-suffix stripping) and their adapter-folder shorthand.
_DIT_SHORTHANDS = {
    "acestep-v15-merge-base-sft-turbo-xl-thirds": "dit-xl-thirds",
    "acestep-v15-merge-base-turbo-xl-ta-0.5": "dit-xl-base-turbo",
    "acestep-v15-xl-sftturbo50": "dit-xl-sft-turbo",
    "acestep-v15-merge-base-sft-xl-ta-0.5": "dit-xl-base-sft",
    "acestep-v15-merge-sft-turbo-xl-ta-0.3": "dit-xl-sft-turbo-ta03",
    "acestep-v15-merge-sft-turbo-xl-ta-0.7": "dit-xl-sft-turbo-ta07",
    "acestep-v15-merge-base-sft-turbo-xl-thirds-convrot-ref": "dit-xl-thirds-convrot",
    "acestep-v15-xl-base": "dit-xl-base",
    "acestep-v15-xl-sft": "dit-xl-sft",
    "acestep-v15-xl-turbo": "dit-xl-turbo",
    "acestep-v15-base": "dit-base",
    "acestep-v15-sft": "dit-sft",
    "acestep-v15-turbo": "dit-turbo",
    "acestep-v15-sftturbo50": "dit-sft-turbo",
    "acestep-v15-turbo-continuous": "dit-turbo-continuous",
    "acestep-v15-turbo-shift1": "dit-turbo-shift1",
    "acestep-v15-turbo-shift3": "dit-turbo-shift3",
    "sa3-dit": "dit-sa3",
}
_QUANT_SUFFIX = re.compile(
    r"-(BF16|F16|F32|MXFP4|NVFP4|IQ\d\w*|Q\d\w*)$",
    re.IGNORECASE,
)


def check_name(name: str, what: str = "name") -> str:
    """Names that become folder names: `^[A-Za-z0-9._-]{1,64}$`, no leading dot."""
    if not _NAME_RE.match(name) or name.startswith("."):
        raise InputError(f"invalid {what} {name!r}: use 1-64 of A-Z a-z 0-9 . _ -, no leading dot")
    return name


def slugify(name: str) -> str:
    """Lowercase, `[a-z0-9-_]`, runs of other characters collapsed to one `-`, at most 64."""
    slug = re.sub(r"[^a-z0-9_-]+", "-", name.lower())
    slug = re.sub(r"-{2,}", "-", slug).strip("-_")[:64].strip("-_")
    return slug or "dataset"


def dit_shorthand(model_name: str) -> str:
    """Adapter folder of a DiT base: `acestep-v15-xl-turbo-BF16.gguf` -> `dit-xl-turbo`."""
    stem = model_name.rsplit("/", 1)[-1]
    if stem.lower().endswith(".gguf"):
        stem = stem[: -len(".gguf")]
    stem = _QUANT_SUFFIX.sub("", stem)
    if not stem:
        return "dit-unknown-base"
    if stem in _DIT_SHORTHANDS:
        return _DIT_SHORTHANDS[stem]
    rest = stem.removeprefix("acestep-v15-").replace(".", "")
    return f"dit-{rest}" if rest else "dit-unknown-base"


def run_stamp(now: float | None = None) -> str:
    return datetime.fromtimestamp(time.time() if now is None else now).strftime(RUN_STAMP_FORMAT)


# -- datasets ----------------------------------------------------------------------------------
def dataset_dir(slug: str) -> str:
    return f"datasets/{check_name(slug, 'dataset slug')}"


def dataset_meta(slug: str) -> str:
    return f"{dataset_dir(slug)}/dataset_meta.json"


def dataset_json(slug: str) -> str:
    return f"{dataset_dir(slug)}/dataset.json"


def label_record(slug: str, sample_id: str) -> str:
    return f"{dataset_dir(slug)}/labels/{check_name(sample_id, 'sample id')}.json"


def dataset_tensors(slug: str) -> str:
    """`tensors/<slug>`: the folder of a dataset's tensor caches, one per variant."""
    return f"tensors/{check_name(slug, 'dataset slug')}"


def tensor_dir(slug: str, variant_key: str) -> str:
    return f"{dataset_tensors(slug)}/{check_name(variant_key, 'variant key')}"


PREPROCESS_META_FILE = "preprocess_meta.json"  # in a tensor dir: what preprocess wrote, per sample
# The manifest of an MM3 cache (`tensors/<slug>/mm3-...`): its songs are no ACE-Step DiT's input.
MM3_CACHE_MANIFEST = "mm3_cache.json"


def preprocess_meta(tensors_dir: str) -> str:
    """`<tensors_dir>/preprocess_meta.json` of a tensor cache folder (`tensor_dir`)."""
    return f"{tensors_dir}/{PREPROCESS_META_FILE}"


def job_dir(job_id: str) -> str:
    return f"jobs/{check_name(job_id, 'job id')}"


def job_record(job_id: str) -> str:
    return f"{job_dir(job_id)}/job.json"


def job_events(job_id: str) -> str:
    return f"{job_dir(job_id)}/events.jsonl"


def job_result(job_id: str) -> str:
    """What a job returned (studio jobs, the main job): artifacts and numbers as JSON."""
    return f"{job_dir(job_id)}/result.json"


def job_meta(job_id: str) -> str:
    """The studio's own record of a job (runner, actor name, options)."""
    return f"{job_dir(job_id)}/_meta.json"


def job_loss_plot(job_id: str) -> str:
    """The main job's loss chart (PNG)."""
    return f"{job_dir(job_id)}/loss.png"


def job_side_events(job_id: str, name: str) -> str:
    """A stage's own event log inside a studio job (e.g. the Ray Train worker's), folded in."""
    return f"{job_dir(job_id)}/{check_name(name, 'event log name')}.jsonl"


TINY_CHECKPOINTS = "checkpoints/tiny"  # the main job's tiny checkpoint tree on a local root


def preview_dir(preview_id: str) -> str:
    return f"previews/{check_name(preview_id, 'preview id')}"


# -- adapters ----------------------------------------------------------------------------------
def lm_adapter_base(lm_size: str) -> str:
    if lm_size not in LM_SIZE_FOLDERS:
        raise InputError(f"unknown LM size {lm_size!r}; expected one of {list(LM_SIZE_FOLDERS)}")
    return f"adapters/{LM_SIZE_FOLDERS[lm_size]}"


def dit_adapter_base(dit_model: str) -> str:
    return f"adapters/{dit_shorthand(dit_model)}"


def weights_key(storage: Storage, folder: str) -> str | None:
    """The adapter weights file in `folder` (LoRA's, else LoKR's), None when it holds none."""
    for name in ADAPTER_WEIGHT_FILES:
        key = f"{folder}/{name}" if folder else name
        if storage.exists(key):
            return key
    return None


def has_weights(storage: Storage, key: str) -> bool:
    return any(storage.exists(f"{key}/{name}") for name in ADAPTER_WEIGHT_FILES)


def ray_run_name(run_key: str) -> str:
    """Ray Train's name of the run in `run_key`: the whole key, "/" as "_", so no two runs share
    it (two artists' runs may share a stamp). Every worker and restart of the run, and a later
    `--ray` resume into the same folder, use it."""
    return run_key.strip("/").replace("/", "_")


def ray_run_dir(run_key: str) -> str:
    """Ray Train's folder of the run in `run_key`, whether or not one was written."""
    return f"{RAY_RESULTS}/{ray_run_name(run_key)}"


def new_run_dir(storage: Storage, base: str, artist: str, now: float | None = None) -> str:
    """A fresh run folder key under `<base>/<artist>/`; collisions get `-2` … `-99`, then a
    base-36 millisecond suffix, so two runs in one second never share a folder."""
    parent = f"{base}/{check_name(artist, 'artist')}"
    stamp = run_stamp(now)
    if not storage.exists(f"{parent}/{stamp}"):
        return f"{parent}/{stamp}"
    for n in range(2, 100):
        if not storage.exists(f"{parent}/{stamp}-{n}"):
            return f"{parent}/{stamp}-{n}"
    return f"{parent}/{stamp}-{_base36(int(time.time() * 1000))}"


def _base36(value: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while value:
        value, rem = divmod(value, 36)
        out = digits[rem] + out
    return out or "0"


def latest_run_dir(storage: Storage, artist_dir: str, skip_calibrated: bool = False) -> str | None:
    """The name-last run folder (not hidden) that holds weights, or None."""
    runs = []
    for key in storage.list(artist_dir):
        name = key.rsplit("/", 1)[-1]
        if name.startswith(".") or not storage.is_dir(key):
            continue
        if skip_calibrated and name.endswith("-calibrated"):
            continue
        if has_weights(storage, key):
            runs.append(key)
    return max(runs, key=lambda k: k.rsplit("/", 1)[-1]) if runs else None


def resolve_adapter(storage: Storage, base: str, artist: str) -> str | None:
    """Newest run of `artist` under an adapter base, falling back to the legacy forms:
    weights directly in the artist folder, then flat `adapters/lm/<artist>-<size>` (LM) or
    `adapters/<artist>` (DiT at the root)."""
    artist_dir = f"{base}/{check_name(artist, 'artist')}"
    newest = latest_run_dir(storage, artist_dir)
    if newest:
        return newest
    if has_weights(storage, artist_dir):
        return artist_dir
    folder = base.rsplit("/", 1)[-1]
    for size, size_folder in LM_SIZE_FOLDERS.items():
        if folder == size_folder and has_weights(storage, f"adapters/lm/{artist}-{size}"):
            return f"adapters/lm/{artist}-{size}"
    if folder.startswith("dit-") and has_weights(storage, f"adapters/{artist}"):
        return f"adapters/{artist}"
    return None


def is_run_stamp(name: str) -> bool:
    return bool(_RUN_STAMP_RE.match(name))


# -- MM3 DiT adapters ----------------------------------------------------------------------------
def mm3_dit_adapter_base() -> str:
    """`adapters/mm3-dit`: MM3 runs live in `<base>/<artist>/<run>/` beside, never inside, the
    ACE `dit-<shorthand>` folders, so no ACE reader ever picks an MM3 file up."""
    return f"adapters/{MM3_DIT_FOLDER}"


def latest_mm3_dit_run(storage: Storage, artist: str) -> str | None:
    """The name-last run folder of `artist` that holds `mm3_lora.safetensors`, or None."""
    artist_dir = f"{mm3_dit_adapter_base()}/{check_name(artist, 'artist')}"
    runs = [
        key
        for key in storage.list(artist_dir)
        if not key.rsplit("/", 1)[-1].startswith(".") and storage.exists(f"{key}/{MM3_DIT_WEIGHTS}")
    ]
    return max(runs, key=lambda k: k.rsplit("/", 1)[-1]) if runs else None


# -- MM3 LM (composer) adapters ------------------------------------------------------------------
def mm3_lm_adapter_base() -> str:
    """`adapters/mm3-lm-adapters`: flat run folders `<name>-<stamp>/` (HOT-Step's server layout),
    each a PEFT folder for the composer LM. The catalogue skips this folder (`list_adapters`), so
    no ACE reader picks an MM3 composer adapter up."""
    return f"adapters/{MM3_LM_FOLDER}"


def new_mm3_lm_run_dir(storage: Storage, name: str, now: float | None = None) -> str:
    """A fresh `adapters/mm3-lm-adapters/<name>-<stamp>` key; a clash gets `-2` … `-99`, then a
    base-36 millisecond suffix (as `new_run_dir`)."""
    stem = f"{mm3_lm_adapter_base()}/{check_name(name, 'adapter name')}-{run_stamp(now)}"
    if not storage.exists(stem):
        return stem
    for n in range(2, 100):
        if not storage.exists(f"{stem}-{n}"):
            return f"{stem}-{n}"
    return f"{stem}-{_base36(int(time.time() * 1000))}"


def latest_mm3_lm_run(storage: Storage, name: str) -> str | None:
    """The name-last `adapters/mm3-lm-adapters/<name>-<stamp>*` folder holding
    `adapter_model.safetensors`, or None."""
    prefix = f"{check_name(name, 'adapter name')}-"
    runs = [
        key
        for key in storage.list(mm3_lm_adapter_base())
        if key.rsplit("/", 1)[-1].startswith(prefix)
        and is_run_stamp(key.rsplit("/", 1)[-1][len(prefix) :])
        and storage.exists(f"{key}/{ADAPTER_WEIGHT_FILES[0]}")
    ]
    return max(runs, key=lambda k: k.rsplit("/", 1)[-1]) if runs else None


def find_lm_codes(storage: Storage, slug: str, variant: str = "") -> str:
    """Key of `tensors/<slug>/<variant>/lm_codes.jsonl`; without a variant, the only one present
    or the most recently written."""
    if variant:
        key = f"{tensor_dir(slug, variant)}/{LM_CODES_FILE}"
        if not storage.exists(key):
            raise InputError(f"{storage.url_of(key)}: missing (run preprocess for that variant)")
        return key
    parent = dataset_tensors(slug)
    found = [
        f"{d}/{LM_CODES_FILE}"
        for d in storage.list(parent)
        if storage.exists(f"{d}/{LM_CODES_FILE}")
    ]
    if not found:
        raise InputError(f"no {LM_CODES_FILE} under {storage.url_of(parent)}: run preprocess first")
    return max(found, key=storage.mtime_ns)
