"""What the audition Serve app is built from, torch- and Ray-free so the CLI builds `audition
serve`'s options from it at start-up (`cli/audition_cmd.py`). The same contract is the `args` of
the shipped Serve configs (`serve_apps/audition.yaml`) and what the main job starts the app with;
`serve_app.py` wraps the engines in deployments around it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from hotstep_ray.core.contracts import AUDITION_DECODER_GPUS, AUDITION_DIT_GPUS, AUDITION_LM_GPUS

# The planner LM's step engines (`audition.lm_decode.MODES`, each described there).
DecodeMode = Literal["auto", "eager", "static", "graph", "compiled"]
MergeAdapters = Literal["auto", "on", "off"]


class AuditionAppConfig(BaseModel):
    """Everything the app needs; `serve run` passes these as `args`."""

    model_config = ConfigDict(extra="forbid")

    checkpoints: str = Field(description="The checkpoints/ folder.")
    data: str = Field(description="Storage root (adapters, previews).")
    device: str | None = Field(default=None, description="cuda or cpu.")
    dtype: str | None = Field(default=None, description="Weights' dtype: bf16, fp16 or fp32.")
    lm: str | None = Field(default=None, description="LM folder name under --checkpoints.")
    dit: str | None = Field(
        default=None, description="DiT folder for the codes detokenizer and the DiT audition."
    )
    enable_dit: bool = Field(default=True, description="Deploy the DiT audition (/dit-audition).")
    decode_mode: DecodeMode = Field(
        default="auto",
        description="LM decoding: auto (graph on CUDA, eager elsewhere), eager, static, graph "
        "(the step replayed in a CUDA graph) or compiled (Inductor's fused step in a CUDA graph: "
        "the fastest decode, once each warmed step has compiled at replica start; the shipped "
        "Serve configs ask for it). Off CUDA, graph and compiled run static.",
    )
    merge_adapters: MergeAdapters = Field(
        default="auto",
        description="Fold an LM adapter into a copy of the weights it adapts: on, off, or auto "
        "(on with graph and compiled, which then run the base's step, at its speed).",
    )
    warm_planner: bool = Field(
        default=True,
        description="graph and compiled: capture the 30 s and 240 s steps at replica start, not "
        "in the first requests.",
    )
    decoder_gpus: float = Field(
        default=AUDITION_DECODER_GPUS, ge=0, description="GPU share of each codes decoder replica."
    )
    lm_gpus: float = Field(
        default=AUDITION_LM_GPUS, ge=0, description="GPU share of each planner LM replica."
    )
    dit_gpus: float = Field(
        default=AUDITION_DIT_GPUS, ge=0, description="GPU share of each DiT audition replica."
    )
    replica_cpus: float = Field(default=0.5, ge=0, description="CPUs each model replica reserves.")
    cpu_threads: int = Field(
        default=1,
        ge=0,
        description="Torch threads per replica on the CPU (0 = torch's own count; more than one "
        "per core oversubscribes a small box).",
    )
    max_body_bytes: int = Field(
        default=1 << 20, ge=1, description="Largest request body; a larger one gets 413."
    )
    token: str | None = Field(
        default=None, description="Bearer token of every route but /health; None: $HOTSTEP_TOKEN."
    )
