"""Gradients as views of one flat buffer (`training.flat_grads`): autograd accumulates into the
views, and the clip, zeroing and all-reduce over the buffers equal torch's per-tensor ones."""

from __future__ import annotations

import math
import time

import pytest
import torch

from hotstep_ray.training import flat_grads
from hotstep_ray.training.flat_grads import FlatGrads


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(16, 64), (64, 16), (4, 4), (6, 4), (1024,)]
    return [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in shapes]


def _loss(params: list[torch.nn.Parameter], scale: float) -> torch.Tensor:
    return sum(scale * (p**2).sum() + p.sum() for p in params)


def test_autograd_accumulates_into_the_views() -> None:
    params = _params()
    flats = FlatGrads(params)
    assert len(flats.buffers) == 1 and flats.buffers[0].numel() == sum(p.numel() for p in params)
    assert not flats.buffers[0].any() and flats.backs()
    _loss(params, 1.0).backward()
    _loss(params, 0.5).backward()  # a second micro-batch adds in place
    for p in params:
        # (2 + 1)·p + 1 + 1: a few roundings of |3p + 2| < 15 in both, inside float32's defaults
        torch.testing.assert_close(p.grad, 3.0 * p.detach() + 2.0)
        assert p.grad._base is flats.buffers[0]
    assert flats.backs()
    flats.zero_()
    assert all(not p.grad.any() for p in params) and flats.backs()
    params[2].grad = None
    assert not flats.backs()
    params[2].grad = flats.buffers[0][1024 + 1024 : 1024 + 1024 + 16].view(4, 4)
    assert not flats.backs()  # the same memory, but not the view it was given
    params[2].grad = torch.zeros_like(params[2])  # a buffer of its own: not a view any more
    assert not flats.backs()


@pytest.mark.parametrize("max_norm", [1.0, 1e6, math.inf])
def test_clip_equals_torchs_clip_grad_norm(max_norm: float) -> None:
    mine, theirs = _params(1), _params(1)
    flats = FlatGrads(mine)
    for p, q in zip(mine, theirs, strict=True):
        grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()))
        p.grad.copy_(grad)
        q.grad = grad.clone()
    got = flats.clip_(max_norm)
    want = torch.nn.utils.clip_grad_norm_(theirs, max_norm)
    # float32 norms of 3,112 squares in two orders (one flat buffer; per tensor, then over the
    # norms): cascaded sums, a few ulp each; rtol 1e-6 ~ 8 ulp
    torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    for p, q in zip(mine, theirs, strict=True):
        # each scaled by max_norm / (norm + 1e-6): those scales are an ulp or two apart
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-7)
    if max_norm == 1.0:  # it did clip: norm·scale = 1 - 1e-6/norm, plus a few ulp
        assert torch.linalg.vector_norm(flats.buffers[0]) == pytest.approx(1.0, rel=1e-5)


def test_one_buffer_per_dtype_and_a_norm_over_all() -> None:
    params = _params(2) + [torch.nn.Parameter(torch.ones(8, dtype=torch.float64))]
    flats = FlatGrads(params)
    assert [b.dtype for b in flats.buffers] == [torch.float32, torch.float64]
    for p in params:
        p.grad.fill_(1.0)
    total = flats.clip_(math.inf)
    # sums of ones are exact below 2^24, the sqrt correctly rounded: ulp-level (default rel 1e-6)
    assert total.item() == pytest.approx(math.sqrt(sum(p.numel() for p in params)))


def test_all_reduce_averages_each_buffer_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two workers with the same gradients: the all-reduce sums them, the average is unchanged."""
    import torch.distributed as dist

    reduced: list[int] = []

    def all_reduce(tensor: torch.Tensor) -> None:
        reduced.append(tensor.numel())
        tensor.mul_(2)

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    params = _params(3)
    flats = FlatGrads(params)
    for p in params:
        p.grad.fill_(0.25)
    flats.all_reduce_(2)
    assert reduced == [flats.buffers[0].numel()]  # one call for the whole buffer
    assert all(torch.equal(p.grad, torch.full_like(p, 0.25)) for p in params)


def test_host_time_of_the_clip(capsys: pytest.CaptureFixture[str]) -> None:
    """The module docstring's CPU numbers (`pytest -s ... -k host_time`): torch's clip over 528
    16 x 16 gradients against the clip over one flat buffer, best of 5 x 20 calls, one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        theirs = [torch.nn.Parameter(torch.randn(16, 16)) for _ in range(528)]
        for p in theirs:
            p.grad = torch.randn(16, 16)
        mine = [torch.nn.Parameter(p.detach().clone()) for p in theirs]
        flats = FlatGrads(mine)
        flats.buffers[0].normal_()

        def best_ms(fn) -> float:
            runs = []
            for _ in range(5):
                started = time.perf_counter()
                for _ in range(20):
                    fn()
                runs.append((time.perf_counter() - started) / 20 * 1000)
            return min(runs)

        torch_ms = best_ms(lambda: torch.nn.utils.clip_grad_norm_(theirs, 1e9))
        flat_ms = best_ms(lambda: flats.clip_(1e9))
    finally:
        torch.set_num_threads(threads)
    with capsys.disabled():
        print(
            f"\nclip over 528 gradients: torch {torch_ms:.3f} ms, one flat buffer {flat_ms:.3f} ms"
        )
    assert flat_ms < torch_ms


def _average_on_rank(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        params = _params(4)
        flats = FlatGrads(params)
        for p in params:
            p.grad.fill_(float(rank + 1))  # rank 0: 1, rank 1: 2
        flats.all_reduce_(world)
        torch.save([p.grad.clone() for p in params], f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def test_all_reduce_averages_across_two_real_gloo_ranks(tmp_path) -> None:
    """Two processes on a real gloo group: every gradient view ends at the ranks' mean."""
    import torch.multiprocessing as mp

    init, out = f"file://{tmp_path / 'rendezvous'}", str(tmp_path / "grads")
    mp.spawn(_average_on_rank, args=(2, init, out), nprocs=2, join=True)
    for rank in range(2):
        grads = torch.load(f"{out}.{rank}", weights_only=True)
        assert all(torch.equal(g, torch.full_like(g, 1.5)) for g in grads)


def test_live_clip_and_zero_fall_back_to_torch_once_a_view_is_gone() -> None:
    """The trainers' step ends through `live`, `clip_grads` and `zero_grads`: over the buffers
    while every gradient is its view; once one was replaced, torch's per-tensor clip and the
    optimizer's `zero_grad`, so the replaced gradient is clipped and zeroed too."""
    params = [torch.nn.Parameter(torch.ones(4, 4)) for _ in range(3)]
    flats = flat_grads.FlatGrads(params)
    for p in params:
        p.grad.fill_(2.0)
    assert flat_grads.live(flats) is flats and flat_grads.live(None) is None
    norm = flat_grads.clip_grads(params, 1.0, flat_grads.live(flats))
    # 48 squares of 2.0 sum exactly; the sqrt is correctly rounded (default rel 1e-6)
    assert norm.item() == pytest.approx(2.0 * math.sqrt(48))
    # 1 - 1e-6/norm after the clip, plus a few ulp of rounding
    assert torch.linalg.vector_norm(flats.buffers[0]).item() == pytest.approx(1.0, rel=1e-5)
    optimizer = torch.optim.SGD(params, lr=0.1)
    flat_grads.zero_grads(optimizer, flat_grads.live(flats), set_to_none=True)
    assert all(p.grad is not None and not p.grad.any() for p in params)  # zeroed in place
    params[1].grad = torch.full((4, 4), 3.0)  # replaced: no longer the buffer's view
    assert flat_grads.live(flats) is None
    norm = flat_grads.clip_grads(params, 1.0, flat_grads.live(flats))
    # sqrt(16 x 9) = 12 exactly; clipped, 12 / (12 + 1e-6) plus a few ulp stays below 1 + 1e-5
    assert norm.item() == pytest.approx(12.0) and params[1].grad.norm().item() < 1.0 + 1e-5
    flat_grads.zero_grads(optimizer, flat_grads.live(flats), set_to_none=True)
    assert all(p.grad is None for p in params)
