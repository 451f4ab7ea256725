"""Run reference cases (official ACE-Step outputs) against our loader and ops.

A cases folder holds `cases.json` and one `<case>.safetensors` per case with `in.*` inputs and
`out.*` official outputs. Floats pass when |a - b| <= atol + rtol * |b| everywhere; indices,
masks, levels and `cfg_dropped` must match exactly. A case kind we do not know is a failure
("unsupported"), never a silent skip.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from hotstep_ray.models import acestep_ops as ops
from hotstep_ray.models.acestep_dit import AceStepModels, load_acestep_dit
from hotstep_ray.models.errors import CheckpointError

Tensors = dict[str, torch.Tensor]
_EXACT_MARKERS = ("indices", "mask", "levels", "cfg_dropped")


@dataclass
class CaseResult:
    name: str
    kind: str  # the dispatch prefix, e.g. "dit", "gen_base"; "unsupported" when unknown
    status: str  # pass | fail | unsupported | error
    max_abs_err: float = math.nan  # over every compared tensor
    worst: str | None = None  # the tensor with the largest error
    errors: dict[str, float] = field(default_factory=dict)  # tensor -> max abs error
    message: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "status": self.status,
            "max_abs_err": self.max_abs_err,
            "worst": self.worst,
            "errors": self.errors,
            "message": self.message,
        }


def _condition(models: AceStepModels, data: Tensors) -> tuple[torch.Tensor, torch.Tensor]:
    return ops.encode_condition(
        models,
        data["in.text_hidden_states"],
        data["in.text_attention_mask"],
        data["in.lyric_hidden_states"],
        data["in.lyric_attention_mask"],
        data["in.refer_audio_acoustic_hidden_states_packed"],
        data["in.refer_audio_order_mask"],
    )


def _context(models: AceStepModels, data: Tensors) -> torch.Tensor:
    return ops.build_context_latents(
        models,
        data["in.src_latents"],
        data["in.chunk_masks"],
        data.get("in.is_covers"),
        data.get("in.attention_mask"),
    )


def _run_dit(models: AceStepModels, data: Tensors, params: dict) -> Tensors:
    # The DiT ignores attention masks upstream (dit_masks_ignored): none are passed.
    velocity = models.transformer(
        hidden_states=data["in.hidden_states"],
        timestep=data["in.timestep"],
        timestep_r=data["in.timestep_r"],
        encoder_hidden_states=data["in.encoder_hidden_states"],
        context_latents=data["in.context_latents"],
        return_dict=False,
    )[0]
    return {"out.velocity": velocity}


def _run_encoder(models: AceStepModels, data: Tensors, params: dict) -> Tensors:
    states, mask = _condition(models, data)
    return {"out.encoder_hidden_states": states, "out.encoder_attention_mask": mask}


def _run_timbre(models: AceStepModels, data: Tensors, params: dict) -> Tensors:
    embeddings, mask = models.condition_encoder.timbre_encoder(
        data["in.refer_audio_acoustic_hidden_states_packed"], data["in.refer_audio_order_mask"]
    )
    return {"out.timbre_embs_unpack": embeddings, "out.timbre_embs_mask": mask}


def _run_tokenize(models: AceStepModels, data: Tensors, params: dict) -> Tensors:
    result = ops.tokenize(models, data["in.latents"], data.get("in.attention_mask"))
    return {
        "out.quantized": result.quantized,
        "out.indices": result.indices,
        "out.pooled_attention_mask": result.pooled_mask,
    }


def _run_detokenize(models: AceStepModels, data: Tensors, params: dict) -> Tensors:
    quantized = models.audio_tokenizer.quantizer.get_output_from_indices(data["in.indices"])
    return {
        "out.quantized_from_indices": quantized,
        "out.latents_25hz": ops.codes_to_latents(models, data["in.indices"]),
    }


def _run_fsq(models: AceStepModels, data: Tensors, params: dict) -> Tensors:
    quantizer = models.audio_tokenizer.quantizer
    if "in.x" in data:  # the raw ResidualFSQ forward
        quantized, indices = quantizer(data["in.x"])
        return {"out.quantized": quantized, "out.indices": indices}
    indices = data["in.indices"]
    codes = ops.fsq_indices_to_codes(quantizer, indices)
    return {
        "out.levels": ops.fsq_indices_to_levels(quantizer, indices),
        "out.codes": ops.fsq_levels_to_codes(
            quantizer, ops.fsq_indices_to_levels(quantizer, indices)
        ),
        "out.indices_roundtrip": ops.fsq_codes_to_indices(quantizer, codes),
        # [N] -> [1, N, 1] (batch, time, quantizer) -> [N, H]
        "out.project_out": quantizer.get_output_from_indices(indices.view(1, -1, 1))[0],
    }


def _run_train(models: AceStepModels, data: Tensors, params: dict) -> Tensors:
    conditions, _ = _condition(models, data)
    context = _context(models, data)
    batch = ops.TrainBatch(data["in.x0"], conditions, context)
    with torch.random.fork_rng(devices=[]):  # leave the caller's global RNG untouched
        torch.manual_seed(int(params["rng_seed"]))
        step = ops.training_forward(models, batch, cfg_ratio=float(params["cfg_ratio"]))
    return {
        "out.loss": step.loss.reshape(1),
        "out.noise": step.noise,
        "out.t": step.t,
        "out.t_draw_a": step.t_draw_a,
        "out.t_draw_b": step.t_draw_b,
        "out.cfg_uniform": step.cfg_uniform,
        "out.cfg_dropped": step.cfg_dropped,
        "out.x_t": step.x_t,
        "out.target_v": step.target_v,
        "out.pred_v": step.pred_v,
        "out.encoder_hidden_states_used": step.encoder_hidden_states,
        "out.context_latents": context,
    }


def _run_turbo(models: AceStepModels, data: Tensors, params: dict) -> Tensors:
    conditions, _ = _condition(models, data)
    result = ops.turbo_generate(
        models,
        conditions,
        _context(models, data),
        seed=params["seed"],
        shift=float(params.get("shift", 3.0)),
        timesteps=params.get("timesteps"),
    )
    return {"out.target_latents": result.latents, "out.initial_noise": result.initial_noise}


def _run_base(models: AceStepModels, data: Tensors, params: dict) -> Tensors:
    conditions, _ = _condition(models, data)
    result = ops.base_generate(
        models,
        conditions,
        _context(models, data),
        seed=params["seed"],
        steps=int(params.get("infer_steps", 30)),
        guidance_scale=float(params.get("diffusion_guidance_scale", 7.0)),
        shift=float(params.get("shift", params.get("shift_passed", 1.0))),
        cfg_interval_start=float(params.get("cfg_interval_start", 0.0)),
        cfg_interval_end=float(params.get("cfg_interval_end", 1.0)),
        timesteps=params.get("timesteps"),
    )
    return {
        "out.target_latents": result.latents,
        "out.initial_noise": result.initial_noise,
        "out.t_schedule": result.schedule,
    }


# Longest prefix first: "enc_timbre_" must win over "enc_".
RUNNERS: dict[str, Callable[[AceStepModels, Tensors, dict], Tensors]] = {
    "enc_timbre_": _run_timbre,
    "train_fwd_": _run_train,
    "gen_turbo_": _run_turbo,
    "gen_base_": _run_base,
    "gen_sft_": _run_base,
    "detok_": _run_detokenize,
    "dit_": _run_dit,
    "enc_": _run_encoder,
    "tok_": _run_tokenize,
    "fsq_": _run_fsq,
}


def case_kind(case: dict[str, Any]) -> str | None:
    """The runner prefix for a case, from its name; `upstream_call` is the fallback for a case
    whose name carries no known prefix (generation cases need their name: turbo or base)."""
    name = str(case.get("name", ""))
    for prefix in RUNNERS:
        if name.startswith(prefix):
            return prefix
    call = str(case.get("upstream_call", ""))
    fallbacks = (
        ("AceStepTimbreEncoder.forward", "enc_timbre_"),
        ("training loss", "train_fwd_"),
        ("(model.decoder)", "dit_"),
        ("(model.encoder)", "enc_"),
    )
    return next((prefix for marker, prefix in fallbacks if marker in call), None)


def _exact(name: str, reference: torch.Tensor) -> bool:
    """Indices, levels and flags are compared exactly; so are 0/1 masks stored as floats. A float
    tensor merely *derived* from indices (`quantized_from_indices`) is a float output: it gets the
    tolerance, since its last bits depend on the matmul's thread count."""
    if not reference.is_floating_point():
        return True
    return name.endswith("mask") or name.rsplit(".", 1)[-1] in _EXACT_MARKERS


def compare(
    name: str, ours: torch.Tensor, reference: torch.Tensor, atol: float, rtol: float
) -> tuple[float, bool, str]:
    """(max abs error, passed, note) for one output tensor."""
    ours = ours.detach().cpu()
    if tuple(ours.shape) != tuple(reference.shape):
        return math.inf, False, f"{name}: shape {list(ours.shape)} != {list(reference.shape)}"
    if ours.numel() == 0:
        return 0.0, True, ""
    diff = (ours.double() - reference.double()).abs()
    worst = float(diff.max())
    if math.isnan(worst):  # NaN compares false everywhere: report it as the worst error
        return math.inf, False, f"{name}: NaN in the output"
    if _exact(name, reference):  # values only: int32 vs int64 indices hold the same codes
        ok = bool((diff == 0).all())
        note = "" if ok else f"{name}: {int((diff != 0).sum())} values differ (exact match needed)"
        return worst, ok, note
    ok = bool((diff <= atol + rtol * reference.double().abs()).all())
    return worst, ok, "" if ok else f"{name}: max abs error {worst:.3g} above tolerance"


def run_case(
    models: AceStepModels, case: dict[str, Any], cases_dir: Path, atol: float, rtol: float
) -> CaseResult:
    name = str(case.get("name", "?"))
    prefix = case_kind(case)
    if prefix is None:
        return CaseResult(name, "unsupported", "unsupported", message="unknown case kind")
    kind = prefix.rstrip("_")
    path = cases_dir / str(case.get("file", f"{name}.safetensors"))
    try:
        data = load_file(str(path))
        with torch.no_grad():
            outputs = RUNNERS[prefix](models, data, case.get("params") or {})
    except Exception as exc:  # a broken case or checkpoint must show up as a failed row
        return CaseResult(name, kind, "error", message=f"{type(exc).__name__}: {exc}")
    references = {key: value for key, value in data.items() if key.startswith("out.")}
    unchecked = sorted(set(references) - set(outputs))
    if not references:
        return CaseResult(name, kind, "fail", message="case has no out.* tensors")
    result = CaseResult(name, kind, "pass", max_abs_err=0.0)
    notes = [f"not produced: {', '.join(unchecked)}"] if unchecked else []
    for key in sorted(set(references) & set(outputs)):
        error, ok, note = compare(key, outputs[key], references[key], atol, rtol)
        result.errors[key] = error
        if error > result.max_abs_err:
            result.max_abs_err, result.worst = error, key
        if not ok:
            notes.append(note)
    if notes:
        result.status = "fail"
        result.message = "; ".join(notes)
    return result


def verify_cases(
    checkpoint_dir: str | Path,
    cases_dir: str | Path,
    atol: float = 1e-4,
    rtol: float = 1e-4,
) -> list[CaseResult]:
    """Load the checkpoint (float32, CPU: the cases were recorded that way) and run every case
    listed in `cases_dir/cases.json`, in file order."""
    cases_dir = Path(cases_dir)
    index = cases_dir / "cases.json"
    if not index.is_file():
        raise CheckpointError(f"{index}: file not found")
    try:
        cases = json.loads(index.read_text())["cases"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"{index}: expected a JSON object with a 'cases' list ({exc})"
        ) from exc
    models = load_acestep_dit(checkpoint_dir, device="cpu", dtype=torch.float32)
    return [run_case(models, case, cases_dir, atol, rtol) for case in cases]
