"""Every DiT export loads every adapted module in each loader a user would hand it to.

Two module trees take DiT adapters: diffusers' `AceStepTransformer1DModel` (what this project
loads; `to_q` … `to_out.0`) and the official decoder (`q_proj` … `o_proj`: ACE-Step, Side-Step,
ComfyUI). peft and LyCORIS match keys to the tree they are given and skip the rest silently, so
each test counts the modules a loader took against the 44 the tiny DiT adapts (4 layers x
(4 self-attention + 4 cross-attention + 3 MLP)), then checks the output moved to the trained one.

The official decoder's code is no dependency here. `official_tree` re-registers the tiny
transformer's attention modules under the official names; under `layers.*` (where every adapted
module lives) that is the official decoder's tree, and the forward stays diffusers' own.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from diffusers.models.transformers.ace_step_transformer import AceStepAttention
from peft.tuners.tuners_utils import BaseTunerLayer
from safetensors.torch import load_file
from test_dit_support import tiny_dit_dir_fixture  # noqa: F401  (fixture)

from hotstep_ray.core import safetensors_header
from hotstep_ray.core.storage import Storage
from hotstep_ray.models.acestep_dit import load_acestep_dit
from hotstep_ray.training import adapters, dit_export, export
from hotstep_ray.training.adapters import AdapterSpec

LORA = AdapterSpec(kind="lora", rank=4, alpha=8)  # scale 2: an alpha-blind loader would halve it
LOKR = AdapterSpec(kind="lokr", rank=8, alpha=4, factor=4)  # full and low-rank w2 factors
ADAPTED = 44  # tiny DiT: 4 layers x 11 Linear modules (attention q, k, v, o twice, MLP 3)
MLP_ONLY = 12  # what a loader takes from a file under the other tree's names
# Output error relative to the adapter's own effect: BF16 factors are rounded by <= 2^-9 each,
# so a full-strength load is off by a few 2^-9; half strength or a missing module is O(0.1-1).
FULL_STRENGTH = 2e-2


# -- models --------------------------------------------------------------------------------------
@pytest.fixture(scope="module", name="base_dit")
def base_dit_fixture(tiny_dit_dir):
    """The tiny turbo transformer as the project loads it (CPU, float32)."""
    models = load_acestep_dit(tiny_dit_dir / "turbo", device="cpu", dtype=torch.float32)
    return models.transformer


_IDENTITY = torch.nn.Identity()


class _OfficialNamedAttention(AceStepAttention):
    """An `AceStepAttention` whose children carry the official names; the diffusers processor
    still reads `to_q` … `to_out` and `norm_q`/`norm_k`, so those become aliases. Dropout after
    `o_proj` is p=0 in diffusers and absent in the official code: an identity."""

    to_q = property(lambda self: self.q_proj)
    to_k = property(lambda self: self.k_proj)
    to_v = property(lambda self: self.v_proj)
    to_out = property(lambda self: (self.o_proj, _IDENTITY))
    norm_q = property(lambda self: self.q_norm)
    norm_k = property(lambda self: self.k_norm)


def official_tree(model: torch.nn.Module) -> torch.nn.Module:
    renames = {"to_q": "q_proj", "to_k": "k_proj", "to_v": "v_proj", "norm_q": "q_norm"}
    renames["norm_k"] = "k_norm"
    for module in list(model.modules()):
        if isinstance(module, AceStepAttention):
            children = module._modules
            for old, new in renames.items():
                children[new] = children.pop(old)
            children["o_proj"] = children.pop("to_out")[0]
            module.__class__ = _OfficialNamedAttention
    return model


def dit_output(model: torch.nn.Module) -> torch.Tensor:
    generator = torch.Generator().manual_seed(5)
    frames = 8
    inputs = {
        "hidden_states": torch.randn(1, frames, 64, generator=generator),
        "timestep": torch.rand(1, generator=generator),
        "timestep_r": torch.rand(1, generator=generator),
        "encoder_hidden_states": torch.randn(1, 6, 64, generator=generator),
        "context_latents": torch.randn(1, frames, 128, generator=generator),
    }
    with torch.no_grad():
        return model(**inputs).sample


def full_strength_error(got: torch.Tensor, want: torch.Tensor, base: torch.Tensor) -> float:
    """0 = the trained outputs, 1 = the base's (no adapter), 0.5 = half strength."""
    return ((got - want).abs().max() / (want - base).abs().max()).item()


def tuner_paths(model: torch.nn.Module) -> list[str]:
    """Module paths peft wrapped (peft's and diffusers' loaders both inject peft layers)."""
    paths = [p for p, m in model.named_modules() if isinstance(m, BaseTunerLayer)]
    return sorted(p.removeprefix("base_model.model.") for p in paths)


# -- the trainer's export ------------------------------------------------------------------------
class Exported:
    """A randomized adapter on the tiny DiT, exported by the trainer's own `export_adapter`, with
    the trained and base outputs to compare each loader's result with."""

    def __init__(self, base_dit, tmp_path, randomize, spec: AdapterSpec) -> None:
        self.base_dit = base_dit
        trained = adapters.inject(copy.deepcopy(base_dit), spec)
        randomize(trained, std=0.1)
        self.paths = sorted(adapters.adapter_info(trained).paths)
        self.official_paths = sorted(
            export.rename_path(p, export.ACESTEP_OFFICIAL_NAMES) for p in self.paths
        )
        self.written = dit_export.export_adapter(
            trained,
            Storage(tmp_path),
            spec.kind,
            kind=spec.kind,
            base_model="acestep-v15-turbo",
            variant="turbo",
            trigger="gunship",
            trigger_position="prepend",
            zero_groups=(),
            target_mlp=True,
        )
        self.run = tmp_path / spec.kind
        self.diffusers = self.run / export.DIFFUSERS_NAMES_DIR
        self.want, self.base = dit_output(trained), dit_output(base_dit)

    def fresh(self) -> torch.nn.Module:
        return copy.deepcopy(self.base_dit)

    def error(self, model: torch.nn.Module) -> float:
        return full_strength_error(dit_output(model), self.want, self.base)


@pytest.fixture(name="lora_export")
def lora_export_fixture(base_dit, tmp_path, randomize) -> Exported:
    return Exported(base_dit, tmp_path, randomize, LORA)


@pytest.fixture(name="lokr_export")
def lokr_export_fixture(base_dit, tmp_path, randomize) -> Exported:
    return Exported(base_dit, tmp_path, randomize, LOKR)


def test_dit_exports_write_official_names_and_a_diffusers_names_copy(lora_export, lokr_export):
    assert len(lora_export.paths) == ADAPTED
    sub = export.DIFFUSERS_NAMES_DIR
    assert lora_export.written == [
        f"lora/{sub}/adapter_config.json",
        f"lora/{sub}/adapter_model.safetensors",
        "lora/adapter_config.json",
        "lora/adapter_model.safetensors",
    ]
    assert lokr_export.written == [
        f"lokr/{sub}/lokr_weights.safetensors",
        "lokr/lokr_weights.safetensors",
    ]
    for folder, names in (
        (lora_export.run, lora_export.official_paths),
        (lora_export.diffusers, lora_export.paths),
    ):
        config = json.loads((folder / export.LORA_CONFIG_FILE).read_text())
        assert sorted(config["target_modules"]) == names

    # the same tensors and metadata (trigger included) under either set of names
    def official(path: str) -> str:
        return export.rename_path(path, export.ACESTEP_OFFICIAL_NAMES)

    for run, weights in (
        (lora_export, export.LORA_WEIGHTS_FILE),
        (lokr_export, export.LOKR_WEIGHTS_FILE),
    ):
        primary, ours = load_file(run.run / weights), load_file(run.diffusers / weights)
        if run is lora_export:
            renamed = {
                f"{export.PEFT_PREFIX}{p}": f"{export.PEFT_PREFIX}{official(p)}" for p in run.paths
            }
        else:
            renamed = {export.lycoris_name(p): export.lycoris_name(official(p)) for p in run.paths}
        assert len(primary) == len(ours)
        for key, tensor in ours.items():
            stem, suffix = next((s, key[len(s) :]) for s in renamed if key.startswith(s + "."))
            assert torch.equal(primary[renamed[stem] + suffix], tensor), key
        meta = safetensors_header.metadata_of((run.run / weights).read_bytes())
        meta_ours = safetensors_header.metadata_of((run.diffusers / weights).read_bytes())
        assert meta_ours["hot_step_trigger"] == meta["hot_step_trigger"] == "gunship"
        assert meta_ours.keys() == meta.keys()


# -- LoRA ----------------------------------------------------------------------------------------
def test_lora_peft_from_pretrained_on_the_diffusers_transformer(lora_export):
    from peft import PeftModel

    model = lora_export.fresh()
    PeftModel.from_pretrained(model, str(lora_export.diffusers)).eval()
    assert tuner_paths(model) == lora_export.paths
    assert lora_export.error(model) < FULL_STRENGTH

    # Why the copy exists: the official-name folder wraps only the shared MLP names here.
    mlp_only = lora_export.fresh()
    PeftModel.from_pretrained(mlp_only, str(lora_export.run))
    assert len(tuner_paths(mlp_only)) == MLP_ONLY


def test_lora_diffusers_pipeline_load_lora_weights(lora_export):
    from diffusers import AceStepPipeline

    model = lora_export.fresh()
    # only the transformer matters to the LoRA loader; the other parts are optional at init
    pipe = AceStepPipeline(
        vae=None,
        text_encoder=None,
        tokenizer=None,
        transformer=model,
        condition_encoder=None,
        scheduler=None,
    )
    pipe.load_lora_weights(str(lora_export.run), adapter_name="hs")  # converts q_proj -> to_q
    assert tuner_paths(model) == lora_export.paths
    assert lora_export.error(model) < FULL_STRENGTH

    # The trap docs/ADAPTERS.md warns of: the diffusers-names copy has no q_proj keys, so
    # diffusers does not convert it, keeps only `transformer.` keys and loads nothing (a warning).
    bare = lora_export.fresh()
    AceStepPipeline(None, None, None, bare, None, None).load_lora_weights(
        str(lora_export.diffusers)
    )
    assert tuner_paths(bare) == []


def test_lora_official_decoder_loaders_peft_and_comfyui_rules(lora_export):
    from peft import PeftModel

    # ACE-Step / Side-Step: peft on the official decoder.
    model = official_tree(lora_export.fresh())
    PeftModel.from_pretrained(model, str(lora_export.run)).eval()
    assert tuner_paths(model) == lora_export.official_paths
    assert lora_export.error(model) < FULL_STRENGTH

    # ComfyUI's ACEStep15 map (`comfy/lora.py`): `base_model.model.<path>` -> decoder
    # `<path>.weight`; ΔW = lora_B @ lora_A (no `.alpha` key: scale 1).
    comfy = official_tree(lora_export.fresh())
    params = dict(comfy.named_parameters())
    key_map = {f"base_model.model.{k.removesuffix('.weight')}": k for k in params}
    tensors = load_file(lora_export.run / export.LORA_WEIGHTS_FILE)
    stems = {k.rsplit(".", 2)[0] for k in tensors}
    assert sorted(stems - key_map.keys()) == []  # ComfyUI would log "lora key not loaded"
    assert len(stems) == ADAPTED
    with torch.no_grad():
        for stem in stems:
            up, down = tensors[f"{stem}.lora_B.weight"], tensors[f"{stem}.lora_A.weight"]
            params[key_map[stem]] += up.float() @ down.float()
    assert lora_export.error(comfy) < FULL_STRENGTH


# -- LoKR ----------------------------------------------------------------------------------------
def _lycoris(model: torch.nn.Module, path) -> list[str]:
    """`create_lycoris_from_weights` + `apply_to`, as ACE-Step's LoKR loader; returns the names
    of the modules LyCORIS built (it skips a key whose module the model lacks, silently)."""
    from lycoris import create_lycoris_from_weights

    network, _ = create_lycoris_from_weights(1.0, str(path), model)
    network.apply_to()
    return sorted(lora.lora_name for lora in network.loras)


def test_lokr_lycoris_on_the_diffusers_transformer(lokr_export):
    model = lokr_export.fresh()
    taken = _lycoris(model, lokr_export.diffusers / export.LOKR_WEIGHTS_FILE)
    assert taken == sorted(export.lycoris_name(p) for p in lokr_export.paths)
    assert lokr_export.error(model) < FULL_STRENGTH

    # Why the copy exists: the official-name file gives this model its MLP modules only.
    mlp_only = lokr_export.fresh()
    assert len(_lycoris(mlp_only, lokr_export.run / export.LOKR_WEIGHTS_FILE)) == MLP_ONLY


def test_lokr_official_decoder_loaders_lycoris_and_comfyui_map(lokr_export):
    path = lokr_export.run / export.LOKR_WEIGHTS_FILE
    model = official_tree(lokr_export.fresh())
    taken = _lycoris(model, path)
    assert taken == sorted(export.lycoris_name(p) for p in lokr_export.official_paths)
    assert lokr_export.error(model) < FULL_STRENGTH

    # ComfyUI's ACEStep15 map: `lycoris_<path with _>` -> decoder `<path>.weight` (its LoKR
    # math is LyCORIS's: kron(w1, w2) times alpha / dim for a low-rank factor).
    comfy = official_tree(lokr_export.fresh())
    key_map = {export.lycoris_name(k.removesuffix(".weight")) for k, _ in comfy.named_parameters()}
    stems = {k.split(".", 1)[0] for k in load_file(path)}
    assert len(stems) == ADAPTED and stems <= key_map


def test_lokr_is_refused_by_the_diffusers_pipeline_loader(lokr_export):
    """diffusers' `AceStepLoraLoaderMixin` has no LoKr conversion and requires "lora" in every
    key: it refuses either LoKR file loudly (docs/ADAPTERS.md sends diffusers users to LyCORIS
    on `pipe.transformer`). Should diffusers learn ACE-Step LoKr, this fails: update the doc."""
    from diffusers import AceStepPipeline

    pipe = AceStepPipeline(None, None, None, lokr_export.fresh(), None, None)
    for folder in (lokr_export.run, lokr_export.diffusers):
        with pytest.raises(ValueError, match="lora"):
            pipe.load_lora_weights(str(folder), weight_name=export.LOKR_WEIGHTS_FILE)


# -- our own reader, and exports without a rename ------------------------------------------------
@pytest.mark.parametrize("kind", ["lora", "lokr"])
def test_load_exported_reads_both_copies(kind, request):
    run = request.getfixturevalue(f"{kind}_export")
    primary = export.load_exported(run.fresh(), run.run, rename=export.ACESTEP_OFFICIAL_NAMES)
    ours = export.load_exported(run.fresh(), run.diffusers)
    assert tuner_paths(ours) == tuner_paths(primary) == run.paths
    # the same BF16 tensors into the same layers: the same outputs, bit for bit
    torch.testing.assert_close(dit_output(ours), dit_output(primary), rtol=0, atol=0)
    assert run.error(ours) < FULL_STRENGTH


def test_no_copy_when_no_name_changes(tmp_path, make_toy):
    """The LM (no rename) and a rename that renames nothing write the one folder."""
    model = adapters.inject(make_toy(0), LORA)
    assert export.export_lora(model, tmp_path, "a", model_names_dir="copy") == [
        "a/adapter_config.json",
        "a/adapter_model.safetensors",
    ]
    lokr = adapters.inject(make_toy(0), LOKR)
    no_op = {"q_proj": "query"}  # the toy's names are diffusers': nothing matches
    assert export.export_lokr(lokr, tmp_path, "b", rename=no_op, model_names_dir="copy") == [
        "b/lokr_weights.safetensors"
    ]
    assert not (tmp_path / "a" / "copy").exists() and not (tmp_path / "b" / "copy").exists()
