"""LoKR's w1-gradient reduction (`training.kron_kernels`): the Triton kernel's algorithm in torch
against the batched GEMM, its block sizes, the custom op's registration, and `w1_grad`'s routing.
The kernel itself runs only on CUDA; there it is compared with the batched GEMM at first use."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hotstep_ray.training import adapters, kron_kernels

SHAPES = [
    (1003, 4, 4, 512),  # uneven token count, the 2B's 4 x 4 w1
    (77, 6, 4, 1024),  # the 2B MLP's a = 6 against c = 4
    (5, 3, 5, 96),  # rows padded to 4 and 8, columns not a multiple of the kernel's step
    (1, 1, 1, 16),
    (33, 8, 2, 70),
    (16, 2, 8, 64),  # exactly one block
    (40, 4, 4, 600),  # three column spans, the last one partial
]


def test_partials_are_block_major_spans() -> None:
    """Partial p of the kernel is token block p // spans, column span p % spans."""
    x = torch.zeros(20, 4, 512, dtype=torch.float64)  # BT 16: blocks 2; spans 2
    x[17, 1, 300] = 3.0  # block 1, span 1 -> partial 3
    y = torch.ones(20, 4, 512, dtype=torch.float64)
    partials = kron_kernels.pair_partials_blocked(x, y)
    assert partials.shape == (4, 4, 4)
    assert partials[3, 1].tolist() == [3.0] * 4
    assert partials.abs().sum() == 12.0


@pytest.mark.parametrize(("tokens", "a", "c", "n"), SHAPES)
def test_blocked_algorithm_gives_the_batched_gemm(tokens: int, a: int, c: int, n: int) -> None:
    g = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, a, n, dtype=torch.float64, generator=g)
    y = torch.randn(tokens, c, n, dtype=torch.float64, generator=g)
    want = torch.einsum("tin,tkn->ik", x, y)
    # float64 sums of <= 1003 x 1024 unit products (|want| <~ 1e3): ~2^-52·sqrt(terms)·|want| ~
    # 1e-13 apart in any order; a wrong or dropped term is O(1)
    torch.testing.assert_close(kron_kernels.pair_sums_bmm(x, y), want, rtol=1e-12, atol=1e-9)
    partials = kron_kernels.pair_partials_blocked(x, y)
    assert partials.shape == kron_kernels.partials_shape(x, y)
    torch.testing.assert_close(partials.sum(0), want, rtol=1e-12, atol=1e-9)  # float64, as above
    fallback = kron_kernels.partials_bmm(x, y)  # the op's path where the kernel does not run
    assert fallback.shape == partials.shape and fallback.dtype == torch.float32
    # float32 against float64: the same sums rounded at 2^-24 per step, ~2^-24·sqrt(terms)·rms
    # ~ 1e-5 for |want| <~ 1e3, inside 1e-4 + 1e-5·|want|
    torch.testing.assert_close(fallback.sum(0), want.float(), rtol=1e-5, atol=1e-4)


def test_blocked_algorithm_drops_cross_token_products() -> None:
    """Tokens whose rows are orthogonal across tokens: any cross-token product kept would show."""
    x = torch.zeros(32, 4, 64, dtype=torch.float64)
    y = torch.zeros(32, 4, 64, dtype=torch.float64)
    for t in range(32):
        x[t, :, 2 * t] = 1.0  # token t lives in column 2t on the x side ...
        y[t, :, 2 * ((t + 1) % 32)] = 1.0  # ... and the next token's column on the y side
    assert kron_kernels.pair_partials_blocked(x, y).abs().max() == 0
    y2 = x.clone()
    summed = kron_kernels.pair_partials_blocked(x, y2).sum(0)
    assert torch.equal(summed, torch.full((4, 4), 32.0).double())


def test_block_sizes_fit_the_tensor_cores_and_registers() -> None:
    for a in range(1, kron_kernels.MAX_ROWS + 1):
        for c in range(1, kron_kernels.MAX_ROWS + 1):
            a_pad, c_pad = kron_kernels.padded_rows(a), kron_kernels.padded_rows(c)
            assert a_pad >= a and a_pad & (a_pad - 1) == 0 and a_pad < 2 * a
            bt = kron_kernels.tokens_per_program(a_pad, c_pad)
            assert bt & (bt - 1) == 0
            assert min(bt * a_pad, bt * c_pad) >= 16  # tl.dot's smallest tile
            assert max(bt * a_pad, bt * c_pad) <= 128  # accumulator <= 128 x 128 float32


def test_the_kernel_applies_only_to_cuda_half_precision_small_w1() -> None:
    x = torch.randn(8, 4, 32, dtype=torch.bfloat16)
    assert not kron_kernels.kernel_applies(x, x)  # CPU
    meta = torch.empty(8, 4, 32, dtype=torch.bfloat16, device="meta")
    assert not kron_kernels.kernel_applies(meta, meta)
    fits = kron_kernels.kernel_fits
    assert fits(torch.bfloat16, torch.bfloat16, 3000, 4, 4)
    assert fits(torch.float16, torch.float16, 1, 8, 1)
    assert not fits(torch.float32, torch.float32, 3000, 4, 4)  # float32: the batched GEMM
    assert not fits(torch.bfloat16, torch.float16, 3000, 4, 4)
    assert not fits(torch.bfloat16, torch.bfloat16, 3000, 9, 4)  # w1 over 8 x 8
    assert not fits(torch.bfloat16, torch.bfloat16, 3000, 4, 9)
    assert not fits(torch.bfloat16, torch.bfloat16, 0, 4, 4)  # no token: no launch


def test_no_tokens_give_a_zero_gradient() -> None:
    x, y = torch.zeros(0, 4, 32), torch.zeros(0, 6, 32)
    assert kron_kernels.partials_bmm(x, y).shape == (0, 4, 6)
    assert torch.equal(adapters.w1_grad(x, y, 4, 6), torch.zeros(4, 6))
    assert torch.equal(kron_kernels.pair_partials(x, y).sum(0), torch.zeros(4, 6))


def test_without_triton_the_self_check_says_no(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kron_kernels, "_KERNEL_CACHE", {"kernel": None})
    monkeypatch.setattr(kron_kernels, "_VERDICTS", {})
    assert not kron_kernels.triton_passes(torch.device("cpu"), torch.bfloat16, 4, 4)
    assert kron_kernels._VERDICTS == {(torch.device("cpu"), torch.bfloat16, 4, 4): False}
    with pytest.raises(RuntimeError, match="needs Triton"):
        kron_kernels.pair_partials_triton(torch.zeros(1, 1, 16), torch.zeros(1, 1, 16))


@pytest.fixture
def fake_kernel(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A 'built' kernel whose launches run `pair_partials_blocked` in float32 (what the Triton
    kernel computes), fresh verdicts, and a log of the launches."""
    launches: list[str] = []

    def launch(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        launches.append(f"{x.shape[1]}x{y.shape[1]}")
        return kron_kernels.pair_partials_blocked(x.float(), y.float())

    monkeypatch.setattr(kron_kernels, "_KERNEL_CACHE", {"kernel": object()})
    monkeypatch.setattr(kron_kernels, "_VERDICTS", {})
    monkeypatch.setattr(kron_kernels, "pair_partials_triton", launch)
    monkeypatch.setattr(kron_kernels, "kernel_applies", lambda x, y: True)
    return launches


def test_the_self_check_runs_once_per_pair_and_never_in_a_capture(
    fake_kernel: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu = torch.device("cpu")
    monkeypatch.setattr(kron_kernels, "device_capturing", lambda: True)
    assert not kron_kernels.triton_passes(cpu, torch.bfloat16, 4, 6)
    assert fake_kernel == [] and kron_kernels._VERDICTS == {}  # not run, not cached
    monkeypatch.setattr(kron_kernels, "device_capturing", lambda: False)
    assert kron_kernels.triton_passes(cpu, torch.bfloat16, 4, 6)
    assert fake_kernel == ["4x6"] * 3  # its three cases, at the pair's own rows
    assert kron_kernels.triton_passes(cpu, torch.bfloat16, 4, 6)
    assert len(fake_kernel) == 3  # cached
    assert kron_kernels.triton_passes(cpu, torch.bfloat16, 5, 5)
    assert fake_kernel[3:] == ["5x5"] * 3  # another pair: checked on its own


def test_verdicts_name_each_checked_pair_for_the_run_log(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        kron_kernels,
        "_VERDICTS",
        {
            (torch.device("cuda", 0), torch.bfloat16, 6, 4): True,
            (torch.device("cuda", 0), torch.bfloat16, 4, 4): False,
        },
    )
    assert kron_kernels.verdicts() == {"cuda:0 bfloat16 4x4": False, "cuda:0 bfloat16 6x4": True}


def test_the_self_check_fails_a_misplaced_partial_or_a_launch_error(
    fake_kernel: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def misplaced(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return kron_kernels.pair_partials_blocked(x.float(), y.float()).flip(0)  # same sum

    monkeypatch.setattr(kron_kernels, "pair_partials_triton", misplaced)
    assert not kron_kernels._self_check(torch.device("cpu"), torch.bfloat16, 4, 4)

    def broken(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("out of resources")

    monkeypatch.setattr(kron_kernels, "pair_partials_triton", broken)
    assert not kron_kernels._self_check(torch.device("cpu"), torch.bfloat16, 4, 4)


def test_the_op_falls_back_where_the_kernel_fails(
    fake_kernel: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    g = torch.Generator().manual_seed(2)
    x = torch.randn(40, 4, 96, generator=g).to(torch.bfloat16)
    y = torch.randn(40, 6, 96, generator=g).to(torch.bfloat16)
    want = kron_kernels.pair_sums_bmm(x, y)  # per-token products rounded to bf16, as the fallback
    key = (x.device, x.dtype, 4, 6)
    kron_kernels._VERDICTS[key] = False  # failed its self-check: the batched GEMM
    # the same bf16 per-token products, summed in float32 in two orders (per block, then over
    # blocks): a few 2^-24 of the 40-term sums of |products| <~ 30
    torch.testing.assert_close(kron_kernels.pair_partials(x, y).sum(0), want, rtol=1e-5, atol=1e-4)
    assert fake_kernel == []
    kron_kernels._VERDICTS[key] = True

    def broken(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("out of resources")

    monkeypatch.setattr(kron_kernels, "pair_partials_triton", broken)
    # float32 sums in two orders, as above
    torch.testing.assert_close(kron_kernels.pair_partials(x, y).sum(0), want, rtol=1e-5, atol=1e-4)
    assert kron_kernels._VERDICTS[key] is False  # not tried again


def test_custom_op_schema_fake_shape_and_compiled_call() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(12, 4, 32, generator=g)
    y = torch.randn(12, 6, 32, generator=g)
    torch.library.opcheck(kron_kernels.pair_partials, (x, y))
    compiled = torch.compile(
        lambda p, q: kron_kernels.pair_partials(p, q).sum(0) * 2,
        backend="aot_eager",
        fullgraph=True,
    )
    # float32 sums of 12 per-token products in two orders (block partials, then over blocks): a
    # few ulp of |sum|, inside the float32 defaults (rtol 1.3e-6 ~ 11 ulp)
    torch.testing.assert_close(compiled(x, y), 2 * kron_kernels.pair_sums_bmm(x, y))
    half = kron_kernels.pair_partials(x.to(torch.bfloat16), y.to(torch.bfloat16))
    assert half.dtype == torch.float32 and half.shape == kron_kernels.partials_shape(x, y)


def test_w1_grad_routes_eligible_operands_to_the_op(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[tuple[int, ...], tuple[int, ...]]] = []

    def spy(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        seen.append((tuple(x.shape), tuple(y.shape)))
        return kron_kernels.pair_partials_blocked(x, y)

    dy = torch.randn(2, 5, 4, 8, dtype=torch.float64)  # [batch, tokens, a, b]
    h = torch.randn(2, 5, 6, 8, dtype=torch.float64)  # [batch, tokens, c, b]
    plain = adapters.w1_grad(dy, h, 4, 6)
    assert seen == []  # CPU float64: the batched GEMM
    monkeypatch.setattr(kron_kernels, "kernel_applies", lambda x, y: True)
    monkeypatch.setattr(kron_kernels, "pair_partials", spy)
    routed = adapters.w1_grad(dy, h, 4, 6)
    assert seen == [((10, 4, 8), (10, 6, 8))]
    torch.testing.assert_close(routed, plain, rtol=1e-12, atol=1e-12)  # float64 80-term sums


def _triton_on_cuda() -> bool:
    if not torch.cuda.is_available():
        return False
    return kron_kernels._kernel() is not None


@pytest.mark.skipif(not _triton_on_cuda(), reason="the kernel runs on CUDA with Triton only")
@pytest.mark.parametrize(("a", "c"), [(4, 4), (6, 4), (4, 6), (5, 5), (1, 2), (8, 8)])
def test_cuda_kernel_partials_equal_the_torch_twin(a: int, c: int) -> None:
    """On a GPU machine: the kernel's partials, one by one, against the algorithm in torch, and
    the op's fake against its real output (opcheck). CI has no GPU; this runs where there is."""
    g = torch.Generator(device="cuda").manual_seed(a * 10 + c)
    for tokens, n in ((1003, 512), (77, kron_kernels.COLUMNS_PER_PROGRAM + 100)):
        x = torch.randn(tokens, a, n, device="cuda", dtype=torch.bfloat16, generator=g)
        y = torch.randn(tokens, c, n, device="cuda", dtype=torch.bfloat16, generator=g)
        got = kron_kernels.pair_partials_triton(x, y)
        want = kron_kernels.pair_partials_blocked(x.double(), y.double())
        # bf16 inputs are exact in float64; the kernel's float32 accumulation over a block (<= 64
        # tokens x 256 columns) is ~2^-24·sqrt(terms)·|term| ~ 1e-5 off: inside 1e-3 + 1e-4·|want|
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-3)
        torch.library.opcheck(kron_kernels.pair_partials, (x, y))


# ------------------------------------------------------------------ the fused pair sums + mix


def test_mix_reference_mixes_one_sides_rows() -> None:
    g = torch.Generator().manual_seed(3)
    source = torch.randn(7, 4, 10, generator=g, dtype=torch.float64)
    m = torch.randn(6, 4, generator=g, dtype=torch.float64)
    want = torch.einsum("or,trn->ton", m, source)
    torch.testing.assert_close(kron_kernels.mix_reference(source, m), want)  # float64 4-term sums
    half = kron_kernels.mix_reference(source.to(torch.bfloat16), m.to(torch.bfloat16))
    assert half.dtype == torch.bfloat16 and half.shape == (7, 6, 10)


@pytest.mark.parametrize("side", [1, 2])
def test_fused_op_falls_back_to_torch_in_the_kernels_shapes(side: int) -> None:
    """Off CUDA the op is `partials_bmm` and `mix_reference`; its fake gives the same shapes,
    and a compiled caller traces through it in one graph."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(12, 4, 32, generator=g)
    y = torch.randn(12, 6, 32, generator=g)
    m = torch.randn((6, 4) if side == 1 else (4, 6), generator=g)
    partials, mixed = kron_kernels.pair_partials_mix(x, y, m, side)
    # off CUDA the op is these very functions (float32, same kernels): float32 defaults are slack
    torch.testing.assert_close(partials, kron_kernels.partials_bmm(x, y))
    torch.testing.assert_close(mixed, kron_kernels.mix_reference(x if side == 1 else y, m))
    torch.library.opcheck(kron_kernels.pair_partials_mix, (x, y, m, side))
    compiled = torch.compile(
        lambda p, q, w: [t.sum() for t in kron_kernels.pair_partials_mix(p, q, w, side)],
        backend="aot_eager",
        fullgraph=True,
    )
    got = compiled(x, y, m)
    # aot_eager: the same kernels; only the final sums may run in another order (float32 defaults)
    torch.testing.assert_close(got[0], partials.sum())
    torch.testing.assert_close(got[1], mixed.sum())
    with pytest.raises(ValueError, match="side"):
        kron_kernels.pair_partials_mix(x, y, m, 0)


def test_the_mix_self_check_fails_a_wrong_mix(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel whose partials are right but whose mix is not (here: m transposed) fails its
    check for that side; the right mix passes; verdicts name the mixed side."""
    wrong: list[bool] = [True]

    def launch(x, y, m, side):
        source = x if side == 1 else y
        partials = kron_kernels.pair_partials_blocked(x.float(), y.float())
        mixed = kron_kernels.mix_reference(source, m.flip(0) if wrong[0] else m)
        return partials, mixed

    monkeypatch.setattr(kron_kernels, "_KERNEL_CACHE", {"kernel": object()})
    monkeypatch.setattr(kron_kernels, "_VERDICTS", {})
    monkeypatch.setattr(kron_kernels, "_MIX_VERDICTS", {})
    monkeypatch.setattr(kron_kernels, "pair_partials_mix_triton", launch)
    cpu = torch.device("cpu")
    assert not kron_kernels.triton_mix_passes(cpu, torch.bfloat16, 4, 4, 1)
    wrong[0] = False
    assert kron_kernels.triton_mix_passes(cpu, torch.bfloat16, 6, 4, 1)
    assert kron_kernels.triton_mix_passes(cpu, torch.bfloat16, 4, 6, 2)
    assert kron_kernels.verdicts() == {
        "cpu bfloat16 4x4 mix x": False,
        "cpu bfloat16 4x6 mix y": True,
        "cpu bfloat16 6x4 mix x": True,
    }


_INTERPRETED = """
import json, math, sys, torch
from hotstep_ray.training import kron_kernels as kk
worst = {}
for a, c, tokens, n in [(4, 4, 77, 300), (6, 4, 40, 100), (4, 6, 33, 70), (3, 5, 5, 96),
                        (1, 2, 50, 64), (8, 8, 17, 130)]:
    g = torch.Generator().manual_seed(a * 10 + c)
    x = torch.randn(tokens, a, n, generator=g)
    y = torch.randn(tokens, c, n, generator=g)
    want = kk.pair_partials_blocked(x.double(), y.double())
    got = kk.pair_partials_triton(x, y)
    errors = [(got.double() - want).abs().max().item()]
    for side, shape in ((1, (c, a)), (2, (a, c))):
        m = torch.randn(shape[::-1], generator=g).t()  # transposed, as the backward's w1.t()
        partials, mixed = kk.pair_partials_mix_triton(x, y, m, side)
        ref = kk.mix_reference((x if side == 1 else y).double(), m.double())
        errors += [(partials.double() - want).abs().max().item(),
                   (mixed.double() - ref).abs().max().item() if mixed.shape == ref.shape else 1e9]
    worst[f"{a}x{c}"] = max(errors) if all(map(math.isfinite, errors)) else float("inf")
print(json.dumps(worst))
"""


@pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="Triton is not installed (CPU CI)"
)
def test_the_triton_kernels_in_the_interpreter_equal_their_torch_twins() -> None:
    """Where Triton is installed without a GPU: the real kernels (partials alone, and with each
    side's mix) run under TRITON_INTERPRET=1 in float32 (the interpreter's bf16 is not
    faithful) and match the torch twins. The variable must be set before Triton is imported,
    hence a process of its own."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-c", _INTERPRETED],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr[-2000:]
    worst = json.loads(done.stdout.strip().splitlines()[-1])
    # float32 kernels against float64 twins: accumulation over a block (<= 64 tokens x 256
    # columns) is ~2^-24·sqrt(terms)·|term| ~ 1e-5 off; a misplaced partial or mix is O(1)
    assert len(worst) == 6 and max(worst.values()) < 1e-3, worst


@pytest.mark.skipif(not _triton_on_cuda(), reason="the kernel runs on CUDA with Triton only")
@pytest.mark.parametrize(("a", "c"), [(4, 4), (6, 4), (4, 6), (5, 5), (1, 2), (8, 8)])
@pytest.mark.parametrize("side", [1, 2])
def test_cuda_fused_mix_equals_the_torch_twins(a: int, c: int, side: int) -> None:
    """On a GPU machine: the fused kernel's partials and mix in bf16 against the torch twins,
    and opcheck of the op."""
    g = torch.Generator(device="cuda").manual_seed(a * 10 + c + side)
    x = torch.randn(1003, a, 512, device="cuda", dtype=torch.bfloat16, generator=g)
    y = torch.randn(1003, c, 512, device="cuda", dtype=torch.bfloat16, generator=g)
    shape = (c, a) if side == 1 else (a, c)
    m = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g)
    partials, mixed = kron_kernels.pair_partials_mix_triton(x, y, m, side)
    want = kron_kernels.pair_partials_blocked(x.double(), y.double())
    # float32 accumulation of exact bf16 products, as in the partials-only test
    torch.testing.assert_close(partials.double(), want, rtol=1e-4, atol=1e-3)
    ref = kron_kernels.mix_reference((x if side == 1 else y).double(), m.double())
    # the mix comes out in bf16: rounded by 2^-9·|mixed|, within 1e-2 + 1e-2·|mixed|
    torch.testing.assert_close(mixed.double(), ref, rtol=1e-2, atol=1e-2)
    torch.library.opcheck(kron_kernels.pair_partials_mix, (x, y, m, side))
