"""Exported adapters load at full strength in peft, diffusers, ComfyUI's rules and LyCORIS."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from hotstep_ray.core import safetensors_header
from hotstep_ray.core.storage import Storage
from hotstep_ray.training import adapters, export
from hotstep_ray.training.adapters import AdapterSpec

LORA = AdapterSpec(kind="lora", rank=4, alpha=8)  # scale 2: an alpha-blind loader would halve it
LOKR = AdapterSpec(kind="lokr", rank=8, alpha=4, factor=4)  # full (forced α=8) + low-rank (α=4)
# full_strength_error of a BF16 export: each factor rounded by <= 2^-9 relative, so ΔW·x is off
# by a few 2^-9 of its own size; 2e-2 ~ 10 x 2^-9, while a loader at half strength gives 0.5.
BF16_FULL_STRENGTH = 2e-2


def full_strength_error(got: torch.Tensor, want: torch.Tensor, base: torch.Tensor) -> float:
    """Output error relative to the adapter's own effect (0.5 = loaded at half strength)."""
    return ((got - want).abs().max() / (want - base).abs().max()).item()


def test_peft_folder_loads_with_peft_from_pretrained(tmp_path, make_toy, toy_inputs, randomize):
    from peft import PeftModel

    trained = adapters.inject(make_toy(0), LORA)
    randomize(trained)
    storage = Storage(tmp_path)
    written = export.export_lora(trained, storage, "run", trigger="gunship", metadata={"x": 1})
    assert written == ["run/adapter_config.json", "run/adapter_model.safetensors"]
    config = json.loads((tmp_path / "run/adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 4, 4)
    assert "layers.0.self_attn.to_out.0" in config["target_modules"]
    assert not any("trigger" in key for key in config)  # never in adapter_config.json
    tensors = load_file(tmp_path / "run/adapter_model.safetensors")
    assert all(t.dtype == torch.bfloat16 for t in tensors.values())
    assert all(k.startswith("base_model.model.layers.") for k in tensors)
    assert tensors["base_model.model.layers.1.mlp.down_proj.lora_A.weight"].shape == (4, 128)
    assert not any(k.endswith(".alpha") for k in tensors)

    want, base = trained(*toy_inputs), make_toy(0)(*toy_inputs)
    peft_model = PeftModel.from_pretrained(make_toy(0), str(tmp_path / "run")).eval()
    from_peft = peft_model(*toy_inputs)
    assert full_strength_error(from_peft, want, base) < BF16_FULL_STRENGTH  # BF16 rounding only
    ours = export.load_exported(make_toy(0), storage, "run")
    # the same BF16 values in the same peft layers and kernels, in this process: ulp-level slack
    torch.testing.assert_close(ours(*toy_inputs), from_peft, rtol=1e-6, atol=1e-6)


def _tiny_dit(seed: int):
    from diffusers import AceStepTransformer1DModel

    torch.manual_seed(seed)
    return AceStepTransformer1DModel(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        in_channels=24,
        audio_acoustic_hidden_dim=8,
        sliding_window=4,
    ).eval()


def _dit_output(model) -> torch.Tensor:
    generator = torch.Generator().manual_seed(5)
    inputs = {
        "hidden_states": torch.randn(1, 8, 8, generator=generator),
        "timestep": torch.rand(1, generator=generator),
        "timestep_r": torch.rand(1, generator=generator),
        "encoder_hidden_states": torch.randn(1, 5, 32, generator=generator),
        "context_latents": torch.randn(1, 8, 16, generator=generator),
    }
    with torch.no_grad():
        return model(**inputs).sample


def comfy_apply(model, tensors: dict[str, torch.Tensor], renames) -> None:
    """ComfyUI's documented rules on our diffusers-named test model: `base_model.model.<path>`
    names decoder weight `<path>.weight` (ACEStep15 map; official names, mapped back to the test
    model's), and ΔW = lora_B @ lora_A · (`<prefix>.alpha` / rank if present, else 1)."""
    params = dict(model.named_parameters())
    prefixes = {k.removesuffix(".lora_A.weight") for k in tensors if k.endswith(".lora_A.weight")}
    with torch.no_grad():
        for prefix in prefixes:
            up = tensors[f"{prefix}.lora_B.weight"].float()
            down = tensors[f"{prefix}.lora_A.weight"].float()
            alpha = tensors.get(f"{prefix}.alpha")
            scale = float(alpha) / down.shape[0] if alpha is not None else 1.0
            path = export.rename_path(
                prefix.removeprefix(export.PEFT_PREFIX), export.inverse(renames)
            )
            params[f"{path}.weight"] += scale * up @ down


def test_dit_lora_loads_at_full_strength_in_diffusers_and_comfyui(tmp_path, randomize):
    from diffusers.loaders.lora_pipeline import AceStepLoraLoaderMixin

    trained = adapters.inject(_tiny_dit(0), LORA)  # default targets: attn q,k,v,o + MLP
    assert len(adapters.adapter_info(trained).paths) == 2 * 11
    randomize(trained, std=0.1)
    want, base = _dit_output(trained), _dit_output(_tiny_dit(0))
    rename = export.ACESTEP_OFFICIAL_NAMES
    export.export_lora(trained, tmp_path, "run", rename=rename)
    weights = tmp_path / "run" / export.LORA_WEIGHTS_FILE
    tensors = load_file(weights)
    assert "base_model.model.layers.0.self_attn.o_proj.lora_B.weight" in tensors
    assert "base_model.model.layers.1.cross_attn.q_proj.lora_A.weight" in tensors
    assert "base_model.model.layers.1.mlp.gate_proj.lora_A.weight" in tensors
    assert not any(".to_" in k for k in tensors)

    # diffusers: its ACE-Step loader converts q_proj -> to_q and ignores adapter_config.json.
    state = AceStepLoraLoaderMixin.lora_state_dict(str(weights.parent), weight_name=weights.name)
    diffusers_model = _tiny_dit(0)
    diffusers_model.load_lora_adapter(dict(state), prefix="transformer", adapter_name="hs")
    assert full_strength_error(_dit_output(diffusers_model), want, base) < BF16_FULL_STRENGTH

    # ComfyUI's key and alpha rules.
    comfy_model = _tiny_dit(0)
    comfy_apply(comfy_model, tensors, rename)
    assert full_strength_error(_dit_output(comfy_model), want, base) < BF16_FULL_STRENGTH

    # Negative control: an unfolded B (α only in adapter_config) loads at half strength there.
    unfolded = {k: v / 2 if k.endswith("lora_B.weight") else v for k, v in tensors.items()}
    half = _tiny_dit(0)
    half.load_lora_adapter(
        AceStepLoraLoaderMixin.lora_state_dict(unfolded), prefix="transformer", adapter_name="hs"
    )
    assert full_strength_error(_dit_output(half), want, base) > 0.3  # half strength: ~0.5

    # Our own reader with the same rename gives the trainer's outputs back.
    reloaded = export.load_exported(_tiny_dit(0), tmp_path, "run", rename=rename)
    assert full_strength_error(_dit_output(reloaded), want, base) < BF16_FULL_STRENGTH


def _probe_delta(module: torch.nn.Linear) -> torch.Tensor:
    """ΔW `[out, in]` of a Linear whose forward LyCORIS replaced: f(I) − I·Wᵀ − b."""
    eye = torch.eye(module.in_features)
    with torch.no_grad():
        return (module(eye) - F.linear(eye, module.weight, module.bias)).T


def _rel_fro(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def test_lokr_export_loads_into_lycoris_with_the_same_delta(tmp_path, make_toy, randomize):
    trained = adapters.inject(make_toy(0), LOKR)
    randomize(trained)
    export.export_lokr(trained, tmp_path, "run", extra_config={"target_mlp": True})
    path = tmp_path / "run" / export.LOKR_WEIGHTS_FILE
    tensors = load_file(path)
    assert all(t.dtype == torch.bfloat16 for t in tensors.values())
    assert tensors["lycoris_layers_0_self_attn_to_out_0.lokr_w2"].shape == (16, 16)
    assert tensors["lycoris_layers_1_mlp_up_proj.lokr_w2_a"].shape == (32, 8)
    # LK5: alpha is a 0-dim BF16 whose bit pattern is the writer's own rounding of the alpha.
    forced, kept = (
        tensors["lycoris_layers_0_self_attn_to_q.alpha"],
        tensors["lycoris_layers_0_mlp_gate_proj.alpha"],
    )
    assert forced.shape == () and forced.view(torch.int16) == torch.tensor(8.0).bfloat16().view(
        torch.int16
    )
    assert kept.view(torch.int16) == torch.tensor(4.0).bfloat16().view(torch.int16)
    meta = safetensors_header.metadata_of(path.read_bytes())
    assert (meta["format"], meta["algo"]) == ("lycoris", "lokr")
    config = json.loads(meta["lokr_config"])
    assert (config["linear_dim"], config["linear_alpha"], config["factor"]) == (8, 4, 4)
    assert config["target_mlp"] is True and config["decompose_both"] is False

    _lycoris_reproduces_the_delta(trained, tmp_path, make_toy, config)


def test_lokr_with_both_factors_split_loads_into_lycoris(tmp_path, make_toy, randomize):
    """decompose_both at a dim below half of w1's sides: w1 and w2 both low-rank (w1_a/w1_b,
    w2_a/w2_b), the path the default dim 512 never takes at the real model's sizes."""
    spec = AdapterSpec(kind="lokr", rank=2, alpha=2, factor=8, decompose_both=True)
    trained = adapters.inject(make_toy(0), spec)
    randomize(trained)
    export.export_lokr(trained, tmp_path, "run", extra_config={"target_mlp": True})
    path = tmp_path / "run" / export.LOKR_WEIGHTS_FILE
    names = {key.rsplit(".", 1)[1] for key in load_file(path) if "to_q" in key}
    assert names == {"lokr_w1_a", "lokr_w1_b", "lokr_w2_a", "lokr_w2_b", "alpha"}
    config = json.loads(safetensors_header.metadata_of(path.read_bytes())["lokr_config"])
    assert config["decompose_both"] is True
    _lycoris_reproduces_the_delta(trained, tmp_path, make_toy, config)


def _lycoris_reproduces_the_delta(trained, tmp_path, make_toy, config) -> None:
    """The export reloads (ours) and loads in LyCORIS both from its weights and from a network
    built from `lokr_config`, each giving the trained ΔW per adapted module."""
    from lycoris import create_lycoris, create_lycoris_from_weights

    path = tmp_path / "run" / export.LOKR_WEIGHTS_FILE
    exported = adapters.delta_weights(export.load_exported(make_toy(0), tmp_path, "run"))
    trained_delta = adapters.delta_weights(trained)
    assert exported and exported.keys() == trained_delta.keys()
    from_weights = make_toy(0)
    network, _ = create_lycoris_from_weights(1.0, str(path), from_weights)
    network.apply_to()
    from_config = make_toy(0)
    network2 = create_lycoris(
        from_config,
        1.0,
        linear_dim=config["linear_dim"],
        linear_alpha=config["linear_alpha"],
        algo="lokr",
        factor=config["factor"],
        decompose_both=config["decompose_both"],
    )
    network2.apply_to()
    assert "unexpected keys" not in network2.load_weights(str(path))
    for module_path, delta in exported.items():
        # BF16 factors: 2 to 4 roundings of <= 2^-9 per ΔW entry, more where a rank-2 product
        # cancels; none of it depends on the CPU (round-to-nearest casts)
        assert _rel_fro(delta, trained_delta[module_path]) < 1e-2
        for lycoris_model in (from_weights, from_config):
            lycoris_delta = _probe_delta(lycoris_model.get_submodule(module_path))
            # the probe f(I) - I·Wᵀ - b cancels W: float32 rounding of 2^-24·|W| per entry, a few
            # 1e-4 of the rank-2 split's small ΔW; GEMMs with I are exact and the adds IEEE-rounded,
            # so it is the same on every CPU. A wrong factor, scale or layout is O(1).
            assert _rel_fro(lycoris_delta, delta) < 1e-3, module_path


@pytest.mark.parametrize("kind", ["lora", "lokr"])
@pytest.mark.parametrize("position", ["prepend", "append", "replace", None])
def test_trigger_metadata_per_position(tmp_path, make_toy, kind, position):
    model = adapters.inject(make_toy(0), LORA if kind == "lora" else LOKR)
    trigger = None if position is None else "gunship unicorn"
    export.export_adapter(model, tmp_path, trigger=trigger, trigger_position=position or "prepend")
    embedded = export.read_trigger(tmp_path)
    if position in ("prepend", "append"):
        assert embedded == {
            "hot_step_trigger": "gunship unicorn",
            "hot_step_trigger_position": position,
            "modelspec.trigger_phrase": "gunship unicorn",
        }
    else:
        assert embedded == {}
    if kind == "lora":
        assert "hot_step" not in (tmp_path / export.LORA_CONFIG_FILE).read_text()
    with pytest.raises(ValueError):
        export.trigger_metadata("x", "middle")  # type: ignore[arg-type]


def test_delta_report_flags_a_group_above_five_percent(make_toy, randomize):
    model = adapters.inject(make_toy(0), LORA)
    randomize(model, std=0.01)
    quiet = export.delta_report(model)
    assert [row["group"] for row in quiet] == ["q", "k", "v", "o", "gate", "up", "down"]
    assert not any(row["flagged"] for row in quiet) and quiet[0]["modules"] == 4
    with torch.no_grad():
        for key, param in adapters.adapter_parameters(model).items():
            if ".to_q.lora_B" in key:
                param.mul_(50)
    loud = {row["group"]: row for row in export.delta_report(model)}
    assert loud["q"]["flagged"] and loud["q"]["median"] > 0.05  # x50 puts q past the 5% flag
    assert not any(row["flagged"] for group, row in loud.items() if group != "q")


def test_zero_groups_drop_q_and_k_at_export(tmp_path, make_toy, randomize):
    model = adapters.inject(make_toy(0), LORA)
    randomize(model)
    export.export_lora(model, tmp_path, drop_groups=("q", "k"))
    deltas = adapters.delta_weights(export.load_exported(make_toy(0), tmp_path))
    for path, delta in deltas.items():
        dropped = export.projection_kind(path) in ("q", "k")
        assert (delta.abs().max() == 0) == dropped, path
    assert export.projection_kind("model.layers.3.self_attn.o_proj") == "o"
    assert export.projection_kind("layers.0.cross_attn.to_out.0") == "o"


@pytest.mark.parametrize("spec", [LORA, LOKR], ids=["lora", "lokr"])
def test_reload_into_a_differently_scaled_adapter_keeps_delta(
    tmp_path, make_toy, toy_inputs, randomize, spec
):
    trained = adapters.inject(make_toy(0), spec)
    randomize(trained)
    export.export_adapter(trained, tmp_path)
    bare = export.load_exported(make_toy(0), tmp_path)  # injected from the file's own config
    other = adapters.inject(make_toy(0), spec.model_copy(update={"alpha": 1.0}))  # other α/r
    export.load_exported(other, tmp_path)
    # the file's B times the scale ratio (float32, <= 1 ulp off): outputs a few ulp apart
    torch.testing.assert_close(other(*toy_inputs), bare(*toy_inputs), rtol=1e-5, atol=1e-6)
    want, base = trained(*toy_inputs), make_toy(0)(*toy_inputs)
    assert full_strength_error(bare(*toy_inputs), want, base) < BF16_FULL_STRENGTH


def test_a_held_best_is_the_adapter_then_and_loads_back_exactly(make_toy, randomize):
    """`dit_export.hold_best`: the held state is the adapter at the hold (later steps do not
    reach it), and `load_adapter_state` puts it back exactly (copies: no arithmetic, so
    equality is exact)."""
    from hotstep_ray.training import dit_export

    model = adapters.inject(make_toy(0), AdapterSpec(kind="lokr", rank=4, alpha=4, factor=2))
    randomize(model)
    held = dit_export.hold_best(model, epoch=1, ma5=2.0)
    then = adapters.adapter_state_dict(model)
    with torch.no_grad():
        for _, p in adapters.trainable_parameters(model):
            p.add_(1.0)  # a later step
    assert all(torch.equal(held.state[k], then[k]) for k in then)
    assert not all(torch.equal(adapters.adapter_state_dict(model)[k], then[k]) for k in then)
    adapters.load_adapter_state(model, held.state)
    assert all(torch.equal(adapters.adapter_state_dict(model)[k], then[k]) for k in then)
