"""The "compiled" decode engine's logic on the CPU. On CUDA it is the static step compiled by
Inductor, then captured in a CUDA graph; off CUDA it is "static" unless the private test flag
`_compile_off_cuda_for_tests` names a backend, and then the compiled step runs uncaptured. These
tests compile with Inductor itself (its C++ CPU backend, inference only): the same graph
capture, decompositions and cache-write reinplacing the GPU gets, minus Triton and the capture
(which `test_lm_graph.py` covers). The first compile costs ~17 s on a cold Inductor cache (~4 s
warm); every test here shares that one graph (two rows, the 1024 bucket, the tiny LM's shapes)."""

from __future__ import annotations

import logging

import pytest
import torch
from test_lm_graph import planner_matches_eager
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from hotstep_ray.audition import lm_decode
from hotstep_ray.audition.lm_decode import Stepper, decode_sdpa, resolve_mode

pytestmark = pytest.mark.slow  # Inductor compiles every case from scratch
ROWS = [list(range(100, 130)), list(range(200, 212))]  # CFG: two rows of unequal length
TOKENS = [torch.tensor(t) for t in range(5, 25)]  # 20 decode steps


@pytest.fixture
def compile_on_cpu(monkeypatch):
    """Inductor off CUDA, scalar C++ kernels (no vector ISA probe: a cold compile ~17 s, not
    ~35 s, on the 2-core box; the graph, its fusions and its in-place cache writes are the same)."""
    monkeypatch.setattr(lm_decode, "_compile_off_cuda_for_tests", "inductor")
    with torch._inductor.config.patch({"cpp.vec_isa_ok": False}):
        yield


def _run(stepper: Stepper) -> list[torch.Tensor]:
    # a captured step returns its static output buffer (overwritten by the next replay): clone
    return [stepper.start(ROWS, len(TOKENS))] + [stepper.step(t).clone() for t in TOKENS]


def test_compiled_is_cuda_only_unless_the_test_flag_is_set(monkeypatch):
    assert resolve_mode("compiled", "cuda") == "compiled"
    assert resolve_mode("compiled", "cpu") == "static"  # the policy: no compile off CUDA
    assert resolve_mode("auto", "cuda") == "graph"  # auto stays on the uncompiled graphs
    monkeypatch.setattr(lm_decode, "_compile_off_cuda_for_tests", "aot_eager")
    assert resolve_mode("compiled", "cpu") == "compiled"
    assert resolve_mode("graph", "cpu") == "static"


def test_decode_attention_is_transformers_sdpa_for_one_query_token():
    """The compiled step's attention (GQA heads grouped, K/V never repeated) computes what
    transformers' sdpa computes for a decode step outside compile, and is that sdpa otherwise."""

    class Attention(torch.nn.Module):
        num_key_value_groups = 4
        is_causal = True

    generator = torch.Generator().manual_seed(0)
    key, value = (torch.randn(2, 2, 64, 16, generator=generator) for _ in range(2))
    mask = torch.rand(2, 1, 1, 64, generator=generator) > 0.3
    mask[:, :, :, 0] = True
    query = torch.randn(2, 8, 1, 16, generator=generator)
    got, _ = decode_sdpa(Attention(), query, key, value, mask, scaling=0.25)
    want, _ = sdpa_attention_forward(Attention(), query, key, value, mask, scaling=0.25)
    assert got.shape == (2, 1, 8, 16)
    # Grouped [2, 2, 4, 16] queries vs transformers' per-head call: other kernel shapes, so other
    # summation orders on another CPU. Logits 0.25 q.k (16 terms) and the 64-key softmax-weighted
    # sum of |v| <~ 4 carry ~u (sqrt(16) + sqrt(64)) max|v| ~ 3e-6 (u = eps_f32 / 2); a head
    # mapped to the wrong KV group misses by O(|v|).
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    prefill = torch.randn(2, 8, 5, 16, generator=generator)
    causal = torch.ones(2, 1, 5, 64, dtype=torch.bool).tril()
    got, _ = decode_sdpa(Attention(), prefill, key, value, causal, scaling=0.25)
    want, _ = sdpa_attention_forward(Attention(), prefill, key, value, causal, scaling=0.25)
    torch.testing.assert_close(got, want, rtol=0, atol=0)  # the very same call: bit-identical


def test_compiled_stepper_gives_the_static_hidden_states(planner, compile_on_cpu):
    model = planner.base.model
    expected = _run(Stepper(model, "static"))
    compiled = Stepper(model, "compiled")
    got = _run(compiled)
    assert compiled.mode == "compiled" and compiled._compiled is not None
    # Inductor's scalar C++ kernels vs eager's vectorised ones. The step returns the final
    # RMSNorm's output (RMS 1 over 32 features, |h| <~ 6) of the 2-layer tiny LM, whose reductions
    # (<= 64 features, <= 50 positions; Σ K ~ 5e2) carry ~u sqrt(Σ K) ~ 1.4e-6 of |h|
    # (u = eps_f32 / 2): <~ 8e-6 at the largest |h|.
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    # a second request on the same stepper (counters rewound by `start`) reuses the compile
    step = compiled._compiled
    again = _run(compiled)
    assert compiled._compiled is step
    for a, b in zip(again, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    # the attention override is scoped to the compiled calls
    assert model.config._attn_implementation == "sdpa"


def test_failed_compile_falls_back_without_losing_steps(
    planner, compile_on_cpu, monkeypatch, caplog
):
    """A compiled step that dies after writing the cache (as a capture failing after its
    warm-up steps would) leaves the counters rewound, logs a warning, and the stepper decodes on
    uncompiled (on CUDA it would try "graph" first, then "static")."""
    model = planner.base.model
    expected = _run(Stepper(model, "static"))

    def broken_compile(self: Stepper) -> None:
        def step(ids, mask, positions):
            self._forward(ids, self._masks(mask), positions, self.cache)  # advances the counters
            raise RuntimeError("inductor: no compiler here")

        self._compiled = step

    monkeypatch.setattr(Stepper, "_compile", broken_compile)
    stepper = Stepper(model, "compiled")
    with caplog.at_level(logging.WARNING, logger=lm_decode.__name__):
        got = _run(stepper)
    assert stepper.mode == "static" and stepper._compiled is None
    assert "compiled LM decode step failed" in caplog.text
    for a, b in zip(got, expected, strict=True):  # static both sides: bit-identical in-process
        torch.testing.assert_close(a, b)


def test_compiled_planner_gives_the_eager_codes(planner, compile_on_cpu):
    steppers = planner_matches_eager(planner, "compiled", temperature=0)
    assert all(s._compiled is not None for s in steppers)
