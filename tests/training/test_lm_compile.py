"""torch.compile of the LM decoder layers: no graph breaks, the eager loss and gradients, the modes.

The GPU runs these graphs through Inductor's Triton code; here the same capture runs on the CPU:
`torch._dynamo.explain` for graph breaks, Inductor with scalar C++ kernels (`cpp.simdlen` 1, as in
`test_dit_train.py`) or `aot_eager` (dynamo + AOTAutograd, no code generation) for the numbers.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import torch._dynamo as dynamo
import torch._functorch.config as functorch_config
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounter, CompileCounterWithBackend
from transformers import Qwen3Config, Qwen3ForCausalLM

from hotstep_ray.core.contracts import TrainLmOptions
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage
from hotstep_ray.training import (
    adapters,
    compiling,
    lm,
    lm_data,
    lm_loss,
    lm_save,
    lm_setup,
    lm_spec,
)
from hotstep_ray.training.adapters import AdapterSpec
from hotstep_ray.training.speed import SpeedOptions

pytestmark = pytest.mark.slow  # Inductor compiles every case from scratch
VOCAB = 96
CODES_KEY = "tensors/band/v1/lm_codes.jsonl"


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """One thread (2-core box, see test_lm_loss.py) and an empty dynamo cache per test: the
    compiled layers of one test must not serve, or count against, another's."""
    before = torch.get_num_threads()
    budget = functorch_config.activation_memory_budget  # process-wide: set by compiled setups
    torch.set_num_threads(1)
    dynamo.reset()
    dynamo.utils.counters.clear()
    yield
    dynamo.reset()
    torch.set_num_threads(before)
    functorch_config.activation_memory_budget = budget


def _tiny_qwen3(
    attention: str = "sdpa", checkpointed: int = 0, layers: int = 2, kind: str = "lora"
):
    """A 32-wide Qwen3 with LoRA r4 (or LoKR, factor 4) on q/k/v/o/gate/up/down (nonzero
    factors, so every one gets a gradient), in training mode."""
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        tie_word_embeddings=True,
    )
    config._attn_implementation = "sdpa"
    model = Qwen3ForCausalLM(config).float()
    targets = adapters.LM_ATTENTION_TARGETS + adapters.MLP_TARGETS
    spec = AdapterSpec(kind=kind, rank=4, alpha=8, factor=4, targets=targets)
    adapters.inject(model, spec)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for param in adapters.adapter_parameters(model).values():
            param.copy_(0.1 * torch.randn(param.shape, generator=generator))
    lm_loss.set_attention(model, attention)
    lm_loss.set_layer_checkpointing(model.model.layers, checkpointed)
    return model.train()


def _examples(lengths: list[int], seed: int = 1) -> list[lm_data.LmExample]:
    generator = torch.Generator().manual_seed(seed)
    out = []
    for i, n in enumerate(lengths):
        ids = torch.randint(0, VOCAB, (n,), generator=generator).tolist()
        out.append(lm_data.LmExample(f"s{i}", tuple(ids), n // 3, n - 1, 0))
    return out


PACKED = _examples([21, 30])  # two songs in one row: the block-diagonal attention matters


def _layer_inputs(model, batch: lm_data.MicroBatch, index: int = 1):
    """(args, kwargs) that decoder layer `index` receives in the trainer's forward."""
    seen = {}

    def grab(module, args, kwargs):
        seen["args"], seen["kwargs"] = args, kwargs

    handle = model.model.layers[index].register_forward_pre_hook(grab, with_kwargs=True)
    try:
        with torch.no_grad():
            lm_loss.batch_loss(lm_loss.LmLossModule(model, 16), batch)
    finally:
        handle.remove()
    args = tuple(a.detach().requires_grad_(True) for a in seen["args"])  # as in training
    return args, seen["kwargs"]


@pytest.mark.parametrize("checkpointed", [0, 2], ids=["plain", "checkpointed"])
@pytest.mark.parametrize("attention", ["sdpa", "varlen", "eager"])
def test_a_lora_decoder_layer_compiles_to_one_graph(attention, checkpointed):
    """sdpa is the trainer's default, varlen the packed runs' (its CPU path: one SDPA with the
    segments' mask), eager the reference. Checkpointing is traced into the graph."""
    model = _tiny_qwen3(attention, checkpointed)
    batch = lm_data.collate(PACKED, ((0, 1),), pad_id=0, pad_multiple=64)
    args, kwargs = _layer_inputs(model, batch)
    report = dynamo.explain(model.model.layers[1])(*args, **kwargs)
    reasons = [str(b.reason).splitlines()[0] for b in report.break_reasons]
    assert report.graph_break_count == 0, reasons
    assert report.graph_count == 1


@pytest.mark.parametrize("checkpointed", [0, 2], ids=["plain", "checkpointed"])
def test_a_lokr_decoder_layer_with_merged_linears_is_one_graph_with_the_eager_gradients(
    checkpointed, record_merged
):
    """LoKR's merged forward (`MergedKron`, the GPU's path for >= 1024 rows; the threshold is
    lowered for this 51-token batch) in a decoder layer: no graph break, and compiled (aot_eager)
    gives the eager output and adapter gradients."""
    model = _tiny_qwen3("sdpa", checkpointed, kind="lokr")
    adapters.set_speed(model, SpeedOptions(kron_forward="merged", kron_merged_min_tokens=1))
    batch = lm_data.collate(PACKED, ((0, 1),), pad_id=0, pad_multiple=64)
    args, kwargs = _layer_inputs(model, batch)
    layer = model.model.layers[1]
    with record_merged() as calls, torch.no_grad():
        layer(*args, **kwargs)
    assert len(calls) == 7  # q, k, v, o, gate, up, down
    report = dynamo.explain(layer)(*args, **kwargs)
    reasons = [str(b.reason).splitlines()[0] for b in report.break_reasons]
    assert report.graph_break_count == 0, reasons
    assert report.graph_count == 1

    def run(call):
        out = call(*args, **kwargs)
        out = out[0] if isinstance(out, tuple) else out
        probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))
        (out * probe).sum().backward()
        grads = {  # layer 1's adapter: the only one this call reaches
            k: p.grad.clone() for k, p in adapters.trainable_parameters(model) if p.grad is not None
        }
        model.zero_grad(set_to_none=True)
        return out.detach(), grads

    dynamo.reset()
    eager_out, eager_grads = run(layer)
    compiled = torch.compile(layer, backend="aot_eager", dynamic=False, fullgraph=True)
    out, grads = run(compiled)
    # aot_eager runs the eager aten kernels in this process; only the traced backward may sum a
    # gradient's contributions in another order: a few ulp, far inside rtol 1e-5 (~80 ulp)
    torch.testing.assert_close(out, eager_out, rtol=1e-5, atol=1e-6)
    assert grads.keys() == eager_grads.keys() and len(eager_grads) >= 14  # w1 + w2 (or pairs) x 7
    assert all(".layers.1." in f".{key}" and g.abs().sum() > 0 for key, g in eager_grads.items())
    for key, eager in eager_grads.items():
        torch.testing.assert_close(grads[key], eager, rtol=1e-5, atol=1e-7, msg=key)  # as above


@torch.library.custom_op("hotstep_test::varlen_attn", mutates_args=())
def _flash_stand_in(
    q: torch.Tensor,  # [N, Hq, D]
    k: torch.Tensor,  # [N, Hkv, D]
    v: torch.Tensor,
    cu_q: torch.Tensor,
    cu_k: torch.Tensor,
    max_q: int,
    max_k: int,
    window_size: list[int],
    enable_gqa: bool,
    scale: float | None = None,
) -> torch.Tensor:
    """The flash varlen kernel's contract on the CPU, opaque to dynamo like the real op."""
    assert window_size == [-1, 0] and enable_gqa
    bounds = cu_q.tolist()
    assert max_q >= max(b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True))
    out = torch.empty_like(q)
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        heads = [x[a:b].transpose(0, 1) for x in (q, k, v)]  # [H, L, D]
        seg = F.scaled_dot_product_attention(*heads, is_causal=True, scale=scale, enable_gqa=True)
        out[a:b] = seg.transpose(0, 1)
    return out


@_flash_stand_in.register_fake
def _(q, k, v, cu_q, cu_k, max_q, max_k, window_size, enable_gqa, scale=None):
    return torch.empty_like(q)


def _stand_in(q, k, v, cu_q, cu_k, max_q, max_k, *, window_size, enable_gqa, scale):
    return _flash_stand_in(q, k, v, cu_q, cu_k, max_q, max_k, list(window_size), enable_gqa, scale)


def test_the_flash_varlen_path_compiles_once_for_any_song_boundaries(monkeypatch):
    """The CUDA branch of the varlen attention (flattening, GQA, kernel arguments) with a CPU
    stand-in for the kernel: no graph break, the mask path's output, and one graph for batches
    whose song boundaries and longest song differ but whose shapes do not."""
    model = _tiny_qwen3("varlen")
    examples = _examples([21, 30, 12, 40])
    groups = [((0, 1),), ((2, 3),)]  # widths 51 and 52 -> 64; longest song 30, then 40
    batches = [lm_data.collate(examples, g, pad_id=0, pad_multiple=64) for g in groups]
    module = lm_loss.LmLossModule(model, 16)
    with torch.no_grad():
        expected = [lm_loss.batch_loss(module, b) for b in batches]  # the mask path
    flash = lm_loss._FlashVarlen(
        _stand_in, {"window_size": (-1, 0), "enable_gqa": True}, True, True
    )
    monkeypatch.setattr(lm_loss, "_flash_for", lambda query: flash)
    counter = CompileCounter()
    lm_loss.compile_layers(model.model.layers, "default", backend=counter)
    with torch.no_grad():
        got = [lm_loss.batch_loss(module, b) for b in batches]
    assert not dynamo.utils.counters["graph_break"]
    assert counter.frame_count == 1  # both layers, both batches
    for a, b in zip(got, expected, strict=True):
        # per-segment SDPA against one masked SDPA: masked keys add exact zeros, the real ones
        # are summed in other blocks: an ulp or two per attention output; rel 1e-6 ~ 8 ulp
        assert a.item() == pytest.approx(b.item(), rel=1e-6)


def _loss_and_grads(model, batch: lm_data.MicroBatch):
    model.zero_grad(set_to_none=True)
    loss = lm_loss.batch_loss(lm_loss.LmLossModule(model, 16), batch)
    loss.backward()
    return loss.item(), {k: p.grad.clone() for k, p in adapters.trainable_parameters(model)}


def _assert_same(eager, compiled):
    # compiled graphs fuse and reorder float32 ops (and pad rows): a few ulp per op through two
    # layers and the head, ~1e-6 relative; wrong compiled gradients are O(1) off
    assert compiled[0] == pytest.approx(eager[0], rel=1e-5)
    assert eager[1].keys() == compiled[1].keys()
    for key, want in eager[1].items():
        error = ((compiled[1][key] - want).norm() / want.norm()).item()
        assert error < 1e-4, key  # fused fp32 rounding only


def test_inductor_layers_give_the_eager_loss_and_lora_gradients():
    """The trainer's default attention (sdpa) on two packed songs, layer 0 checkpointed, through
    Inductor with scalar C++ kernels (~20 s cold on one core, ~7 s from its disk cache): two graphs (layer 0 checkpointed,
    layer 1 plain). The compiled rows are padded to 64 tokens, the eager ones not at all: the
    padding changes nothing but the shape."""
    import torch._inductor.config as inductor_config

    eager = _loss_and_grads(_tiny_qwen3("sdpa", 1), lm_data.collate(PACKED, ((0, 1),), pad_id=0))
    model = _tiny_qwen3("sdpa", 1)
    lm_loss.compile_layers(model.model.layers, "default")
    assert all(layer._compiled_call_impl is not None for layer in model.model.layers)
    batch = lm_data.collate(PACKED, ((0, 1),), pad_id=0, pad_multiple=lm_loss.COMPILE_PAD_MULTIPLE)
    assert batch.input_ids.shape == (1, 64)
    with inductor_config.patch({"cpp.simdlen": 1}):
        compiled = _loss_and_grads(model, batch)
    _assert_same(eager, compiled)


def test_compiled_varlen_layers_with_checkpointing_give_the_eager_gradients():
    """varlen on two rows (three songs, one row padded), every layer checkpointed, `aot_eager`:
    the checkpoint inside the graph recomputes and still gives the eager gradients, and keeps
    less for the backward than the compiled layers without it."""
    examples = _examples([21, 30, 40])
    group = ((0, 1), (2,))
    eager = _loss_and_grads(
        _tiny_qwen3("varlen", 2), lm_data.collate(examples, group, pad_id=0, pad_multiple=1)
    )
    batch = lm_data.collate(examples, group, pad_id=0, pad_multiple=64)
    saved = {}
    for checkpointed in (2, 0):
        model = _tiny_qwen3("varlen", checkpointed)
        lm_loss.compile_layers(model.model.layers, "default", backend="aot_eager")
        compiled = _loss_and_grads(model, batch)  # compiles
        if checkpointed:
            _assert_same(eager, compiled)
        saved[checkpointed] = _saved_bytes(model, batch)
    assert saved[2] < 0.5 * saved[0]  # bytes kept for the backward: shapes only, no round-off


def _saved_bytes(model, batch) -> int:
    """Bytes of activations the forward keeps for the backward (parameters not counted)."""
    params = {p.data_ptr() for p in model.parameters()}
    seen: set[int] = set()

    def pack(tensor):
        ptr = tensor.data_ptr()
        if ptr not in params and ptr not in seen:
            seen.add(ptr)
            pack.total += tensor.numel() * tensor.element_size()
        return tensor

    pack.total = 0
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = lm_loss.batch_loss(lm_loss.LmLossModule(model, 16), batch)
    loss.backward()
    return pack.total


def test_compile_modes_resolve_per_device_and_the_cpu_is_refused():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert lm_setup.compile_mode("auto", cpu) == "off"
    assert lm_setup.compile_mode("auto", cuda) == "default"
    assert lm_setup.compile_mode("off", cpu) == "off"
    assert lm_setup.compile_mode("reduce-overhead", cuda) == "reduce-overhead"
    for mode in ("default", "reduce-overhead"):
        with pytest.raises(InputError, match="needs a CUDA device.*use compile off or auto"):
            lm_setup.compile_mode(mode, cpu)
    with pytest.raises(InputError, match="expected auto, off, default or reduce-overhead"):
        lm_setup.compile_mode("max-autotune", cuda)
    # saved specs from before the modes: compile true/false
    assert lm_spec.LmEngine(compile=True).compile == "default"
    assert lm_spec.LmEngine(compile=False).compile == "off"
    # reduce-overhead on CUDA (with_graphs), off on CPUs
    assert lm_spec.LmEngine().compile == "auto"
    assert compiling.with_graphs("auto", "default", ckpt_layers=0) == "reduce-overhead"
    assert compiling.with_graphs("auto", "default", ckpt_layers=2) == "default"
    assert compiling.with_graphs("reduce-overhead", "reduce-overhead", 2) == "reduce-overhead"
    assert compiling.with_graphs("auto", "default", ckpt_layers=0, ddp=True) == "default"
    # padding: 64-token rows when compiled unless the engine says otherwise
    assert (
        lm_setup.row_multiple(lm_spec.LmEngine(), compiled=True)
        == lm_loss.COMPILE_PAD_MULTIPLE
        == 64
    )
    assert lm_setup.row_multiple(lm_spec.LmEngine(), compiled=False) == 1
    assert lm_setup.row_multiple(lm_spec.LmEngine(pad_multiple=128), compiled=True) == 128


def test_the_trainer_refuses_compile_on_the_cpu_before_loading_anything(tmp_path):
    spec = lm_spec.LmTrainSpec(
        options=TrainLmOptions(lm_size="0.6B", init_adapter=""),
        lm_dir=str(tmp_path / "no-such-lm"),  # never read: the refusal comes first
        codes_key=CODES_KEY,
        artist="band",
        engine=lm_spec.LmEngine(device="cpu", compile="default"),
    )
    with pytest.raises(InputError, match="compile 'default' needs a CUDA device"):
        lm_setup.setup_lm(spec, Storage(tmp_path / "data"))


def _graph_check():
    """bench/lm_graph_check.py: its tiny LM, songs and spec are this file's CPU runs."""
    path = Path(__file__).resolve().parents[2] / "bench" / "lm_graph_check.py"
    module_spec = importlib.util.spec_from_file_location("lm_graph_check", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


GRAPH_CHECK = _graph_check()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Storage]:
    """The tiny LM (real tokenizer, embeddings scaled up as in test_lm_train.py) and six short
    songs (91-216 tokens) whose rows pad to different 64-token widths."""
    return GRAPH_CHECK.prepare(tmp_path_factory.mktemp("lm-compile"))


def _run_spec(folder: Path, run: str, compile: str) -> lm_spec.LmTrainSpec:
    # layer 0 checkpointed; 64-token rows pinned: several row widths (several graphs); left at 0,
    # a 2-epoch run of short songs coarsens to one width (`lm_data.pick_pad_multiple`)
    return GRAPH_CHECK.spec(folder, compile, 2, "cpu", 1e-3, checkpointing="1", run=run)


@pytest.fixture(scope="module")
def eager_run(tiny) -> lm_save.LmRunResult:
    folder, storage = tiny
    return lm.run_lm_training(_run_spec(folder, "eager", "off"), storage)


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_a_compiled_training_run_equals_the_eager_run(tiny, eager_run, mode, monkeypatch):
    """The trainer's compile path end to end on the CPU (the CUDA-only check patched away,
    `aot_eager` for Inductor): padded 64-token rows, layer 0 checkpointed, two micro-batches per
    step, the held-out songs evaluated eagerly (no graphs of their own), and the epoch losses of
    the eager run. reduce-overhead also keeps one `.grad` buffer per adapter parameter for the
    whole run (gradients never live in the CUDA-graph pool), each a view of one flat buffer."""
    folder, storage = tiny
    counter = CompileCounterWithBackend("aot_eager")
    compile_layers = lm_loss.compile_layers

    def on_cpu(layers, mode):
        compile_layers(layers, mode, backend=counter)

    monkeypatch.setattr(lm_setup, "compile_mode", lambda requested, device: requested)
    monkeypatch.setattr(lm_loss, "compile_layers", on_cpu)
    functorch_config.activation_memory_budget = 1.0
    setup = lm_setup.setup_lm(_run_spec(folder, mode, mode), storage)
    assert setup.compile == mode and setup.pad_multiple == 64
    # the engine's budget reaches AOTAutograd's partitioner before any graph is partitioned
    assert functorch_config.activation_memory_budget == lm_spec.LmEngine().activation_budget == 0.8
    shapes = {(len(g), lm_data.row_width(setup.examples, g, 64)) for g in setup.groups}
    assert len(shapes) >= 2 and all(width % 64 == 0 for _, width in shapes)
    params = [p for _, p in adapters.trainable_parameters(setup.model)]
    buffers = [p.grad.data_ptr() if p.grad is not None else None for p in params]
    assert all(buffers) == (mode == "reduce-overhead")
    state = lm.train_lm(setup)
    # per shape: layer 0 (checkpointed, input without grad) and layer 1; none for the held out
    assert counter.frame_count == 2 * len(shapes)
    eager = eager_run.log
    compiled = [row["loss"] for row in state.history]
    # the per-step ulp differences of the compiled layers, carried through 2 epochs of AdamW
    assert compiled == pytest.approx([row["loss"] for row in eager["epochs"]], rel=1e-4)
    held = [row["loss"] for row in state.holdout]
    assert held == pytest.approx([row["loss"] for row in eager["holdout"]["epochs"]], rel=1e-4)
    if mode == "reduce-overhead":
        assert [p.grad.data_ptr() for p in params] == buffers
        # one flat buffer behind every gradient, clipped and zeroed as one (`FlatGrads`)
        assert setup.grad_flats is not None and setup.grad_flats.backs()
        assert [b.numel() for b in setup.grad_flats.buffers] == [sum(p.numel() for p in params)]
    else:
        assert setup.grad_flats is None
    log = lm_save.train_log(setup, state)
    assert log["config"]["compile"] == mode and log["config"]["pad_multiple"] == 64


def test_activation_budget_is_validated_and_set_process_wide():
    compiling.set_activation_budget(0.5)
    assert functorch_config.activation_memory_budget == 0.5
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="activation budget"):
            compiling.set_activation_budget(bad)
    assert functorch_config.activation_memory_budget == 0.5  # a refused value changes nothing
    with pytest.raises(ValueError):  # the engine refuses it before anything runs
        lm_spec.LmEngine(activation_budget=0)


def test_a_compiled_run_picks_its_row_width_multiple(tiny, monkeypatch):
    """Left to the trainer (pad_multiple 0), a compiled run weighs compiles against padding:
    two epochs of six short songs compile one width instead of several, and the memory plan
    sizes the coarser rows."""
    folder, storage = tiny
    monkeypatch.setattr(lm_setup, "compile_mode", lambda requested, device: requested)
    monkeypatch.setattr(lm_loss, "compile_layers", lambda layers, mode: None)
    spec = _run_spec(folder, "picked", "default")
    spec = spec.model_copy(update={"engine": spec.engine.model_copy(update={"pad_multiple": 0})})
    setup = lm_setup.setup_lm(spec, storage)
    fine = lm_data.compiled_shapes(setup.examples, setup.groups, 64)
    picked = lm_data.compiled_shapes(setup.examples, setup.groups, setup.pad_multiple)
    assert setup.pad_multiple > 64 and len(picked) < len(fine)
    widest = max(
        len(g) * lm_data.row_width(setup.examples, g, setup.pad_multiple) for g in setup.groups
    )
    assert setup.vram.tokens == widest
