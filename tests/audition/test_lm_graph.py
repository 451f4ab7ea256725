"""The CUDA-graph decode engine's logic on the CPU: a stand-in graph that replays the captured
step exactly as a real one would (reading only the static buffers, nothing run at capture) gives
the same codes as eager decoding, with the constrained-decoding rules intact."""

from __future__ import annotations

import pytest
import torch

from hotstep_ray.audition import lm_decode
from hotstep_ray.audition import planner as planner_module
from hotstep_ray.audition.lm_decode import Stepper, resolve_mode
from hotstep_ray.audition.planner import PlannerLM
from hotstep_ray.audition.schemas import LmRequest
from hotstep_ray.models.lm_tokenizer import AUDIO_CODE_BASE_ID, IM_END_ID


class StandInGraph:
    """What `torch.cuda.graph` records: the step's work, replayed on demand into `out`."""

    def __init__(self, stepper: Stepper, out: torch.Tensor) -> None:
        self.stepper, self.out, self.replays = stepper, out, 0

    def replay(self) -> None:
        self.out.copy_(self.stepper._static_step())
        self.replays += 1


def stand_in_capture(self: Stepper) -> None:
    """Stepper._capture on the CPU: two warm-up steps (which advance the cache's write counters,
    as on the GPU; `_replay` must rewind them), then a "capture" that runs nothing."""
    for _ in range(2):
        probe = self._static_step()
    self.step_out = torch.empty_like(probe)
    self._graph = StandInGraph(self, self.step_out)


@pytest.fixture
def graph_on_cpu(monkeypatch):
    """Let Stepper keep mode "graph" on the CPU, with the stand-in capture."""
    monkeypatch.setattr(lm_decode, "resolve_mode", lambda mode, device: mode)
    monkeypatch.setattr(planner_module, "resolve_mode", lambda mode, device: mode)
    monkeypatch.setattr(Stepper, "_capture", stand_in_capture)


def test_resolve_mode_defaults_to_graphs_on_cuda_only():
    assert resolve_mode("auto", "cuda") == "graph"
    assert resolve_mode("auto", "cpu") == "eager"
    assert resolve_mode("graph", "cpu") == "static"  # no CUDA graphs off the GPU
    assert resolve_mode("compiled", "cuda") == "compiled"
    assert resolve_mode("compiled", "cpu") == "static"  # compiled = compiled step + CUDA graph
    assert resolve_mode("static", "cpu") == "static"
    with pytest.raises(ValueError, match="decode mode"):
        resolve_mode("turbo", "cpu")


def test_graph_stepper_replays_the_static_steps(planner, graph_on_cpu):
    rows = [list(range(100, 130)), list(range(200, 212))]  # CFG: two rows of unequal length
    tokens = [torch.tensor(t) for t in (5, 6, 7, 8)]
    reference = Stepper(planner.base.model, "static")
    expected = [reference.start(rows, 8)] + [reference.step(t) for t in tokens]
    graph = Stepper(planner.base.model, "graph")
    # a graph step returns its static output buffer (overwritten by the next replay): clone
    got = [graph.start(rows, 8)] + [graph.step(t).clone() for t in tokens]
    assert graph.mode == "graph" and graph._graph.replays == len(tokens)
    # the stand-in replays the same static step in this process: bit-identical (the defaults'
    # float32 slack is never used)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b)
    # a second request on the same stepper reuses the one capture
    again = [graph.start(rows, 8)] + [graph.step(t).clone() for t in tokens]
    assert graph._graph.replays == 2 * len(tokens)
    for a, b in zip(again, expected, strict=True):
        torch.testing.assert_close(a, b)


def planner_matches_eager(planner, mode: str, **sampling) -> list:
    """A seeded CFG request through the `mode` engine gives the eager engine's codes, exactly
    duration x 5 code tokens then <|im_end|> (constrained decoding); returns its steppers."""
    eager = PlannerLM(planner.base.model, planner.tokenizer, lm_size="0.6B", decode_mode="eager")
    other = PlannerLM(planner.base.model, planner.tokenizer, lm_size="0.6B", decode_mode=mode)
    assert other.decode_mode == mode
    request = LmRequest(
        caption="dark synthwave",
        lyrics="[verse]\nneon",
        bpm=120,
        keyscale="C major",
        timesignature="4",
        duration=3,
        lm_seed=11,
        cfg_scale=2.0,
        **sampling,
    )
    want = eager.plan(request)
    got = other.plan(request)
    assert got.result.codes == want.result.codes
    assert len(got.token_ids) == 16 and got.token_ids[-1] == IM_END_ID
    assert all(AUDIO_CODE_BASE_ID <= t < AUDIO_CODE_BASE_ID + 64000 for t in got.token_ids[:-1])
    steppers = list(other.base.steppers.values())
    assert steppers and all(s.mode == mode for s in steppers)
    return steppers


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.85, "top_k": 8}])
def test_graph_planner_gives_the_eager_codes(planner, graph_on_cpu, sampling):
    steppers = planner_matches_eager(planner, "graph", **sampling)
    assert all(s._graph is not None for s in steppers)


# -- per-row tokens (batched requests) ------------------------------------------------------------
ROWS = [list(range(100, 130)), list(range(300, 318)), list(range(200, 212)), list(range(400, 425))]


def _per_row_tokens(steps: int) -> list[torch.Tensor]:
    """[4] tokens per step: pairs (0, 2) and (1, 3) share one, as batched CFG rows do."""
    return [torch.tensor([5 + k, 40 + 3 * k, 5 + k, 40 + 3 * k]) for k in range(steps)]


def test_per_row_tokens_static_matches_eager(planner):
    tokens = _per_row_tokens(10)
    eager = Stepper(planner.base.model, "eager")
    expected = [eager.start(ROWS, 10)] + [eager.step(t) for t in tokens]
    static = Stepper(planner.base.model, "static")
    got = [static.start(ROWS, 10)] + [static.step(t) for t in tokens]
    assert static.step_ids.shape == (4, 1)
    # The static (padded, masked) cache vs eager's growing one: other kernel shapes and orders.
    # Hidden states are the final RMSNorm's output (RMS 1 over 32 features, |h| <~ 6) of the
    # 2-layer tiny LM, whose reductions (<= 64 features, <= 50 positions; Σ K ~ 5e2) carry
    # ~u sqrt(Σ K) ~ 1.4e-6 of |h| (u = eps_f32 / 2): <~ 8e-6 at the largest |h|.
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    # a 0-d token is still fed to every row: the same as the [B] tensor repeating it
    shared, spelled = Stepper(planner.base.model, "static"), Stepper(planner.base.model, "static")
    shared.start(ROWS, 2)
    spelled.start(ROWS, 2)
    # the same ids buffer and step either way: bit-identical
    torch.testing.assert_close(shared.step(torch.tensor(7)), spelled.step(torch.full((4,), 7)))
    with pytest.raises(ValueError, match="expected"):
        shared.step(torch.tensor([1, 2]))


def test_graph_stepper_replays_per_row_tokens(planner, graph_on_cpu):
    """One captured step serves 0-d and [B] tokens alike: both land in the [B, 1] ids buffer."""
    tokens = _per_row_tokens(4) + [torch.tensor(9)] + _per_row_tokens(2)
    reference = Stepper(planner.base.model, "static")
    expected = [reference.start(ROWS, 8)] + [reference.step(t) for t in tokens]
    graph = Stepper(planner.base.model, "graph")
    got = [graph.start(ROWS, 8)] + [graph.step(t).clone() for t in tokens]
    assert graph.mode == "graph" and graph._graph.replays == len(tokens)
    for a, b in zip(got, expected, strict=True):  # the same static step replayed: bit-identical
        torch.testing.assert_close(a, b)


def test_graph_planner_batches_like_eager(planner, graph_on_cpu):
    eager = PlannerLM(planner.base.model, planner.tokenizer, lm_size="0.6B", decode_mode="eager")
    graph = PlannerLM(planner.base.model, planner.tokenizer, lm_size="0.6B", decode_mode="graph")
    pinned = {"bpm": 120, "keyscale": "C major", "timesignature": "4", "top_k": 8}
    requests = [
        LmRequest(caption=caption, duration=duration, lm_seed=seed, **pinned)
        for caption, duration, seed in (("dark synthwave", 2, 1), ("lofi", 3, 2), ("a", 1, 3))
    ]
    want = [r.codes for r in eager.generate_batch(requests)]
    assert [r.codes for r in graph.generate_batch(requests)] == want
    (stepper,) = graph.base.steppers.values()
    assert stepper.mode == "graph" and stepper.static_rows == 6 and stepper._graph is not None


def test_compiled_step_takes_per_row_tokens(planner, monkeypatch):
    """The compiled step reads the same [B, 1] ids buffer: per-row tokens need no recompile
    (the shapes of `test_lm_compiled.py`, so its Inductor compile is reused when warm)."""
    monkeypatch.setattr(lm_decode, "_compile_off_cuda_for_tests", "inductor")
    rows = [list(range(100, 130)), list(range(200, 212))]
    tokens = [torch.tensor([5 + k, 900 - k]) for k in range(6)] + [torch.tensor(3)]
    reference = Stepper(planner.base.model, "static")
    expected = [reference.start(rows, 20)] + [reference.step(t) for t in tokens]
    with torch._inductor.config.patch({"cpp.vec_isa_ok": False}):
        compiled = Stepper(planner.base.model, "compiled")
        got = [compiled.start(rows, 20)] + [compiled.step(t).clone() for t in tokens]
    assert compiled.mode == "compiled" and compiled._compiled is not None
    for a, b in zip(got, expected, strict=True):  # other kernels: the round-off bound above
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
