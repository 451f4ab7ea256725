"""`hotstep-ray models make-random DIR`: a random ACE-Step 1.5 tree in the official layout.

Full-size parts are gigabytes, so the command runs here with `random_tree.tree_configs` swapped
for tiny configs of the same kinds (the writer takes its configs as data); the full-size configs
are checked on the meta device only (folder names, parameter counts, the disk-space estimate).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from hotstep_ray.cli.models_cmd import app
from hotstep_ray.core.contracts import MakeRandomOptions
from hotstep_ray.models import full_configs as fc
from hotstep_ray.models import random_tree as rt
from hotstep_ray.models.acestep_dit import load_acestep_dit
from hotstep_ray.models.discovery import discover
from hotstep_ray.models.errors import CheckpointError
from hotstep_ray.models.text_models import load_lm, load_text_encoder, load_vae
from hotstep_ray.models.tiny_dit import tiny_config
from hotstep_ray.models.tiny_tree import TINY_VAE

# The Qwen parts keep their real vocabularies (the tokenizers must fit) at 32 wide, 2 layers.
_SMALL_QWEN = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "max_window_layers": 2,
}


def tiny_configs(options: MakeRandomOptions) -> rt.TreeConfigs:
    """`tree_configs` at tiny size: the parts `options` asks for, in the same kinds."""
    lm = options.lm != "none"
    dit = {"2b": "turbo", "xl": "xl-turbo"}.get(options.dit)
    return rt.TreeConfigs(
        dit=tiny_config(dit) if dit else None,
        vae={"_class_name": "AutoencoderOobleck", **TINY_VAE} if options.vae else None,
        text_encoder={**fc.TEXT_ENCODER_CONFIG, **_SMALL_QWEN} if options.text_encoder else None,
        lm={**fc.LM_CONFIGS["0.6B"], **_SMALL_QWEN} if lm else None,
        lm_size=options.lm if lm else "",
    )


@pytest.fixture
def tiny(monkeypatch) -> None:
    monkeypatch.setattr(rt, "tree_configs", tiny_configs)


def _make(folder: Path, *args: str):
    argv = ["make-random", str(folder), "--device", "cpu", *args]
    return CliRunner().invoke(app, argv, terminal_width=200)


def test_help_lists_the_choices() -> None:
    # rich sizes the help to $COLUMNS: wide enough that no choice list wraps
    result = CliRunner().invoke(app, ["make-random", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for choices in ("2b|xl|none", "0.6B|1.7B|4B|none", "bf16|fp16|fp32"):
        assert choices in result.output
    for flag in ("--seed", "--force", "--no-vae", "--no-text-encoder", "--device"):
        assert flag in result.output
    assert "Default: 2b." in result.output and "Default: 1.7B." in result.output


def test_the_command_writes_a_tree_the_loaders_accept(tiny, tmp_path: Path) -> None:
    root = tmp_path / "random"
    result = _make(root, "--lm", "0.6B", "--seed", "3")
    assert result.exit_code == 0, result.output
    assert f"written: {root}" in result.output
    assert result.output.count("pass the loader's key check") == 4
    assert not (tmp_path / "random.partial").exists()
    found = {info.name: info for info in discover(root)}
    assert sorted(found) == [
        "Qwen3-Embedding-0.6B",
        "acestep-5Hz-lm-0.6B",
        "acestep-v15-turbo",
        "vae",
    ]
    assert all(info.usable and info.dtype == "bfloat16" for info in found.values())
    lm_config = json.loads((root / "acestep-5Hz-lm-0.6B" / "config.json").read_text())
    assert lm_config["torch_dtype"] == "bfloat16"
    # every part through the loaders that read real weights
    dit = load_acestep_dit(root / "acestep-v15-turbo", device="cpu")
    assert dit.variant.name == "turbo" and dit.silence_latent.shape == (1, rt.SILENCE_FRAMES, 64)
    assert (
        load_vae(root / "vae", device="cpu").config.decoder_channels == TINY_VAE["decoder_channels"]
    )
    assert load_text_encoder(root / "Qwen3-Embedding-0.6B", device="cpu").config.hidden_size == 32
    lm = load_lm(root / "acestep-5Hz-lm-0.6B", device="cpu")
    assert lm.lm_head.weight is lm.model.embed_tokens.weight  # tied, stored once


def test_parts_can_be_left_out_and_xl_picks_its_folder(tiny, tmp_path: Path) -> None:
    root = tmp_path / "xl"
    result = _make(root, "--dit", "xl", "--lm", "none", "--no-vae", "--no-text-encoder")
    assert result.exit_code == 0, result.output
    assert [info.name for info in discover(root)] == ["acestep-v15-xl-turbo"]
    assert load_acestep_dit(root / "acestep-v15-xl-turbo", device="cpu").variant.layout == "xl"
    nothing = _make(
        tmp_path / "none", "--dit", "none", "--lm", "none", "--no-vae", "--no-text-encoder"
    )
    assert nothing.exit_code == 2 and "nothing to write" in nothing.output
    assert not (tmp_path / "none").exists() and not (tmp_path / "none.partial").exists()


def test_a_non_empty_folder_needs_force(tiny, tmp_path: Path) -> None:
    root = tmp_path / "busy"
    (root / "mine").mkdir(parents=True)
    (root / "vae").mkdir()
    (root / "vae" / "old.txt").write_text("old")
    refused = _make(root, "--dit", "none", "--lm", "none", "--no-text-encoder")
    assert refused.exit_code == 2 and "not empty" in refused.output and "--force" in refused.output
    forced = _make(root, "--dit", "none", "--lm", "none", "--no-text-encoder", "--force")
    assert forced.exit_code == 0, forced.output
    assert (root / "mine").is_dir()  # folders it does not write stay
    assert not (root / "vae" / "old.txt").exists()  # the one it writes is replaced whole
    assert [info.name for info in discover(root) if info.usable] == ["vae"]
    assert not (tmp_path / "busy.partial").exists()


def test_an_interrupted_write_leaves_no_tree(tiny, tmp_path: Path, monkeypatch) -> None:
    def interrupted(*_args) -> None:
        raise KeyboardInterrupt

    monkeypatch.setitem(rt.WRITERS, "lm", interrupted)
    root = tmp_path / "cut"
    options = MakeRandomOptions(lm="0.6B", text_encoder=False)
    with pytest.raises(KeyboardInterrupt):  # after the DiT and the VAE are written
        rt.write_random_tree(root, rt.tree_configs(options), device="cpu")
    assert not root.exists() and not (tmp_path / "cut.partial").exists()


def test_same_seed_same_bytes(tiny, tmp_path: Path) -> None:
    options = MakeRandomOptions(dit="none", lm="0.6B", vae=False, text_encoder=False)
    files = []
    for name, seed in (("a", 5), ("b", 5), ("c", 6)):
        rt.write_random_tree(tmp_path / name, rt.tree_configs(options), seed=seed, device="cpu")
        files.append((tmp_path / name / "acestep-5Hz-lm-0.6B" / "model.safetensors").read_bytes())
    assert files[0] == files[1] and files[0] != files[2]


def test_the_key_check_catches_a_missing_or_reshaped_tensor(tiny, tmp_path: Path) -> None:
    root = tmp_path / "tree"
    options = MakeRandomOptions(lm="0.6B", vae=False, text_encoder=False)
    rt.write_random_tree(root, rt.tree_configs(options), device="cpu")
    lm_file = root / "acestep-5Hz-lm-0.6B" / "model.safetensors"
    tensors = load_file(str(lm_file))
    tensors.pop("model.norm.weight")
    save_file(tensors, str(lm_file))
    with pytest.raises(CheckpointError, match="missing tensor 'model.norm.weight'"):
        rt.check_part("lm", lm_file.parent)
    dit_file = root / "acestep-v15-turbo" / "model.safetensors"
    tensors = load_file(str(dit_file))
    name = next(
        key for key in sorted(tensors) if key.startswith("decoder.") and key.endswith("weight")
    )
    tensors[name] = tensors[name].flatten()[:3].clone()
    save_file(tensors, str(dit_file))
    with pytest.raises(CheckpointError, match="wrong shapes"):
        rt.check_part("dit", dit_file.parent)


def test_full_size_configs_and_the_space_check(tmp_path: Path, monkeypatch) -> None:
    """The real configs, planned on the meta device (nothing written)."""
    configs = rt.tree_configs(MakeRandomOptions(dit="xl", lm="4B"))
    parts = {part.folder: part for part in rt.plan_parts(configs)}
    assert sorted(parts) == [
        "Qwen3-Embedding-0.6B",
        "acestep-5Hz-lm-4B",
        "acestep-v15-xl-turbo",
        "vae",
    ]
    assert parts["acestep-v15-xl-turbo"].config == fc.DIT_XL_TURBO
    assert parts["acestep-5Hz-lm-4B"].config == fc.LM_CONFIGS["4B"]
    # the fact sheet's 4.99 B for XL, to its printed precision (millions)
    assert abs(parts["acestep-v15-xl-turbo"].params / 1e6 - 4990) <= 5
    default = rt.plan_parts(rt.tree_configs(MakeRandomOptions()))
    assert [part.folder for part in default][::3] == ["acestep-v15-turbo", "acestep-5Hz-lm-1.7B"]

    class Nearly:
        free = 10**9  # 1 GB: less than the 2B DiT alone

    monkeypatch.setattr(rt.shutil, "disk_usage", lambda _where: Nearly)
    with pytest.raises(rt.InputError, match="free, the tree needs"):
        rt.write_random_tree(tmp_path / "big", rt.tree_configs(MakeRandomOptions()), device="cpu")
    assert not (tmp_path / "big").exists() and not (tmp_path / "big.partial").exists()
