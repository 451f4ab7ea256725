"""LoKR's w1 gradient as one Triton reduction on the GPU.

The w1 gradient of a LoKR Linear (`adapters.w1_grad`) is `Σ_t Σ_n x[t, i, n] · y[t, k, n]` for
x `[tokens, a, n]` and y `[tokens, c, n]` (the output gradient and an activation, one side
already through w2), a tiny `[a, c]` result (4 × 4 on most 2B layers) reduced over every token.
torch runs it as a batched GEMM of one `[a, n] @ [n, c]` per token, which cuBLAS executes with
16 × 16-tile sm80 WMMA kernels, the largest LoKR-only kernel of a 2B LoKR 512 step. The work
is a memory pass: reading x and y once is 25-61 MB per adapted Linear at 3000 tokens, 5-13 µs
at the H200's 4.8 TB/s (arithmetic). Both paths' times per shape: docs/BENCHMARKS.md, row
`kron-kernels`.

`pair_sums_kernel`: each program owns `tokens_per_program` tokens and one span of
`COLUMNS_PER_PROGRAM` columns, and multiplies all of their (token, row) pairs of x with all of y
on the tensor cores, `[BT·A, BN] @ [BN, BT·C]` per step of BN columns, then keeps the same-token
entries and sums them into one `[a, c]` partial. The cross-token products it throws away cost
nothing that matters (BT-fold more multiply-adds than needed, still ~1 GFLOP per layer); x and y
are read exactly once. The op returns the partials, `[programs, a, c]` float32 in a fixed order;
the caller sums them, so the result does not depend on scheduling and, compiled, Inductor fuses
that sum with the caller's scale and cast (a torch sum inside the op was a kernel of its own,
as long as the reduction itself).
`pair_partials_blocked` is the same algorithm in torch: the CPU tests check it, and on the GPU
a self-check compares the kernel's partials with it, one by one, before the first use of each
(a, c) (each pair is a kernel compiled of its own). On a mismatch or a failed launch the op
falls back to the batched GEMM, in the same partials' shape.

The same pass can also mix one operand's rows by a small matrix (`MIX`; the op
`hotstep::kron_pair_partials_mix`): LoKR's backward needs w1's pair sums and w2's w1-mix of the
same operand (dy's rows or x's, `adapters.MergedKron`), and reading it once instead of twice saves
an activation-sized pass per adapted Linear. Per step of BN columns the mix is one more
tensor-core product, a block-diagonal `[BT·OP, BT·IP]` matrix (m once per token of the block)
times the tile already loaded, stored in the operands' dtype. Its register budget: that matrix
(≤ 64 × 64 bf16 at the 2B's shapes) and a `[BT·OP, BN]` float32 product beside the accumulator.
Checked at first use: the partials per (device, dtype, a, c), the mix per (..., side); CI runs
both kernels in Triton's CPU interpreter (float32), the GPU benches in bf16
(`SpeedOptions.fused_mix`, on; row `kron-kernels`).

Importing this module needs no Triton and no GPU; the kernel is built at its first use.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

log = logging.getLogger(__name__)

# Rows a or c above this take the batched GEMM: a larger w1 (LoKR factor -1 on a 2048-wide layer
# gives 32 × 64) makes each token's GEMM large enough for cuBLAS, and the kernel's accumulator
# (tokens_per_program · a × tokens_per_program · c) would outgrow the registers.
MAX_ROWS = 8
# BN: x's and y's tiles, 64 rows each at a = c = 8 (BT 8), are 2 × 8 KB of bf16 per stage, 48 KB
# of shared memory with 3 stages (arithmetic)
COLUMNS_PER_STEP = 64
# Columns per program: splitting n gives 2-4x more programs on the 2B (n = 512 / 1024), so a
# batch-1 song (3000 tokens: 188 token blocks at a = c = 4) fills the H200's 132 SMs several
# times over.
COLUMNS_PER_PROGRAM = 256
_KERNEL_CACHE: dict[str, object] = {}  # "kernel": the built Triton kernel, or None


def pair_sums_bmm(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """`[a, c]` = Σ over tokens and columns of x[t, i, :] · y[t, k, :], for x `[tokens, a, n]`
    and y `[tokens, c, n]`: one `[a, n] @ [n, c]` per token, then a float32 sum over tokens
    (float64 stays float64). The reference, and the path off CUDA."""
    per_token = torch.bmm(x, y.transpose(1, 2))
    wide = torch.promote_types(per_token.dtype, torch.float32)
    return per_token.sum(0, dtype=wide)


def padded_rows(rows: int) -> int:
    """A or C of the kernel: `rows` rounded up to a power of two."""
    return 1 << max(rows - 1, 0).bit_length()


def tokens_per_program(a_pad: int, c_pad: int) -> int:
    """BT: at least 16 rows on each side of the tensor-core product (its smallest tile) and about
    64 rows on the larger side."""
    return max(16 // min(a_pad, c_pad), 64 // max(a_pad, c_pad))


def blocking(x: torch.Tensor, y: torch.Tensor) -> tuple[int, int, int, int, int]:
    """(A, C, BT, token blocks, column spans) of the kernel for x `[tokens, a, n]`, y
    `[tokens, c, n]`: the one place the launch grid is worked out."""
    tokens, a, n = x.shape
    a_pad, c_pad = padded_rows(a), padded_rows(y.shape[1])
    bt = tokens_per_program(a_pad, c_pad)
    return a_pad, c_pad, bt, -(-tokens // bt), -(-n // COLUMNS_PER_PROGRAM)


def partials_shape(x: torch.Tensor, y: torch.Tensor) -> tuple[int, int, int]:
    """`[programs, a, c]` of the op's partials: token blocks × column spans."""
    *_, blocks, spans = blocking(x, y)
    return blocks * spans, x.shape[1], y.shape[1]


def pair_partials_blocked(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The kernel's partials, computed as `pair_sums_kernel` computes them, in torch: tokens in
    blocks of BT, rows padded to powers of two, columns in spans, one product of every (token,
    row) of x with every (token, row) of y per block and span, the same-token entries kept and
    summed. `[blocks · spans, a, c]`, block-major; their sum is `pair_sums_bmm`'s. For the CPU
    tests of the kernel's indexing and masking."""
    tokens, a, n = x.shape
    c = y.shape[1]
    a_pad, c_pad, bt, blocks, spans = blocking(x, y)
    wide = torch.promote_types(x.dtype, torch.float32)
    width = spans * COLUMNS_PER_PROGRAM
    xp = x.new_zeros(blocks * bt, a_pad, width, dtype=wide)
    yp = y.new_zeros(blocks * bt, c_pad, width, dtype=wide)
    xp[:tokens, :a, :n] = x
    yp[:tokens, :c, :n] = y
    # [blocks, spans, BT·A, span]: row r = token_in_block · A + i
    rows_a = xp.reshape(blocks, bt * a_pad, spans, -1).transpose(1, 2)
    rows_c = yp.reshape(blocks, bt * c_pad, spans, -1).transpose(1, 2)
    products = rows_a @ rows_c.transpose(-1, -2)  # [blocks, spans, BT·A, BT·C]
    same = (torch.arange(bt * a_pad)[:, None] // a_pad) == (torch.arange(bt * c_pad)[None] // c_pad)
    kept = torch.where(same.to(x.device), products, torch.zeros((), dtype=wide, device=x.device))
    partials = kept.reshape(blocks, spans, bt, a_pad, bt, c_pad).sum((2, 4))  # [.., A, C]
    return partials[..., :a, :c].reshape(blocks * spans, a, c)


def partials_bmm(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The op's fallback: `pair_sums_bmm` per token block in the first span of each block, zeros
    in the others, so its shape is the kernel's (`partials_shape`) whichever path ran."""
    tokens, a, _ = x.shape
    c = y.shape[1]
    _, _, bt, blocks, spans = blocking(x, y)
    per_token = torch.bmm(x, y.transpose(1, 2)).float()  # [tokens, a, c]
    padded = per_token.new_zeros(blocks * bt, a, c)
    padded[:tokens] = per_token
    out = per_token.new_zeros(blocks, spans, a, c)
    out[:, 0] = padded.reshape(blocks, bt, a, c).sum(1)
    return out.reshape(blocks * spans, a, c)


def _kernel():
    """The Triton kernel, or None where Triton does not import."""
    if "kernel" in _KERNEL_CACHE:
        return _KERNEL_CACHE["kernel"]
    try:
        import triton
        import triton.language as tl
    except ImportError:
        _KERNEL_CACHE["kernel"] = None
        return None

    @triton.jit
    def pair_sums_kernel(
        x_ptr,
        y_ptr,
        out_ptr,
        m_ptr,
        mix_ptr,
        tokens,
        cols,
        sx_t,
        sx_i,
        sy_t,
        sy_k,
        sm_t,
        sm_o,
        A: tl.constexpr,
        C: tl.constexpr,
        AP: tl.constexpr,
        CP: tl.constexpr,
        BT: tl.constexpr,
        BN: tl.constexpr,
        SPAN: tl.constexpr,
        MIX: tl.constexpr,  # 0: partials only; 1: also mix x's rows by m; 2: y's
        RO: tl.constexpr,  # the mix's output rows (m is [RO, RI], contiguous)
        RI: tl.constexpr,
        OP: tl.constexpr,  # RO and RI padded as the side they come from
        IP: tl.constexpr,
    ):
        block = tl.program_id(0)
        span = tl.program_id(1)
        ra = tl.arange(0, BT * AP)  # row = token_in_block · AP + i
        rc = tl.arange(0, BT * CP)
        ta = block * BT + ra // AP
        tc = block * BT + rc // CP
        ia = ra % AP
        kc = rc % CP
        live_a = (ta < tokens) & (ia < A)
        live_c = (tc < tokens) & (kc < C)
        start_a = ta.to(tl.int64) * sx_t + ia.to(tl.int64) * sx_i
        start_c = tc.to(tl.int64) * sy_t + kc.to(tl.int64) * sy_k
        acc = tl.zeros((BT * AP, BT * CP), dtype=tl.float32)
        if MIX != 0:
            # The mix as one tensor-core product per step: a block-diagonal [BT·OP, BT·IP]
            # matrix holding m once per token of the block, times the tile already loaded.
            ro = tl.arange(0, BT * OP)
            ri = tl.arange(0, BT * IP)
            to = block * BT + ro // OP
            oo = ro % OP
            rr = ri % IP
            live_o = (to < tokens) & (oo < RO)
            start_o = to.to(tl.int64) * sm_t + oo.to(tl.int64) * sm_o
            diagonal = (ro // OP)[:, None] == (ri // IP)[None, :]
            blockdiag = tl.load(
                m_ptr + oo[:, None] * RI + rr[None, :],
                mask=diagonal & (oo < RO)[:, None] & (rr < RI)[None, :],
                other=0.0,
            )
        for n0 in range(0, SPAN, BN):
            n = span * SPAN + n0 + tl.arange(0, BN)
            in_n = n < cols
            xa = tl.load(
                x_ptr + start_a[:, None] + n[None, :],
                mask=live_a[:, None] & in_n[None, :],
                other=0.0,
            )
            yc = tl.load(
                y_ptr + start_c[:, None] + n[None, :],
                mask=live_c[:, None] & in_n[None, :],
                other=0.0,
            )
            acc = tl.dot(xa, tl.trans(yc), acc)
            if MIX != 0:
                if MIX == 1:
                    source = xa
                else:
                    source = yc
                mixed = tl.dot(blockdiag, source)  # [BT·OP, BN] float32
                tl.store(
                    mix_ptr + start_o[:, None] + n[None, :],
                    mixed.to(mix_ptr.dtype.element_ty),
                    mask=live_o[:, None] & in_n[None, :],
                )
        same = (ra[:, None] // AP) == (rc[None, :] // CP)
        acc = tl.where(same, acc, 0.0)
        part = tl.sum(tl.sum(tl.reshape(acc, (BT, AP, BT, CP)), axis=2), axis=0)  # [AP, CP]
        i = tl.arange(0, AP)
        k = tl.arange(0, CP)
        program = block * tl.num_programs(1) + span  # block-major, as `pair_partials_blocked`
        tl.store(
            out_ptr + program * A * C + i[:, None] * C + k[None, :],
            part,
            mask=(i < A)[:, None] & (k < C)[None, :],
        )

    _KERNEL_CACHE["kernel"] = pair_sums_kernel
    return pair_sums_kernel


def pair_partials_triton(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """`pair_sums_kernel`'s partials, `[programs, a, c]` float32 (CUDA, bf16/fp16); their sum is
    `pair_sums_bmm`'s result."""
    return _launch(x, y, None, 0)[0]


def pair_partials_mix_triton(
    x: torch.Tensor, y: torch.Tensor, m: torch.Tensor, side: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The partials and, from the same pass over the operands, `mix_reference(x, m)` (side 1,
    m `[c, a]`) or `mix_reference(y, m)` (side 2, m `[a, c]`) in the operands' dtype."""
    if side not in (1, 2):
        raise ValueError(f"side must be 1 (mix x) or 2 (mix y), not {side}")
    partials, mixed = _launch(x, y, m, side)
    assert mixed is not None
    return partials, mixed


def _launch(
    x: torch.Tensor, y: torch.Tensor, m: torch.Tensor | None, side: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    kernel = _kernel()
    if kernel is None:
        raise RuntimeError("pair_partials_triton needs Triton")
    if x.stride(-1) != 1:
        x = x.contiguous()
    if y.stride(-1) != 1:
        y = y.contiguous()
    tokens, a, n = x.shape
    c = y.shape[1]
    a_pad, c_pad, bt, blocks, spans = blocking(x, y)
    partials = torch.empty(blocks * spans, a, c, dtype=torch.float32, device=x.device)
    mixed = None
    rows_out, rows_in, pad_out, pad_in = 1, 1, 1, 1
    if m is not None:
        source = x if side == 1 else y
        rows_out, rows_in = m.shape
        pad_out, pad_in = (c_pad, a_pad) if side == 1 else (a_pad, c_pad)
        if rows_in != source.shape[1] or rows_out > pad_out:
            raise ValueError(
                f"a mix {tuple(m.shape)} does not fit x {tuple(x.shape)}, y "
                f"{tuple(y.shape)} on side {side}"
            )
        m = m.to(x.dtype).contiguous()
        mixed = torch.empty(tokens, rows_out, n, dtype=x.dtype, device=x.device)
    kernel[(blocks, spans)](
        x,
        y,
        partials,
        m if m is not None else x,
        mixed if mixed is not None else partials,
        tokens,
        n,
        x.stride(0),
        x.stride(1),
        y.stride(0),
        y.stride(1),
        mixed.stride(0) if mixed is not None else 0,
        mixed.stride(1) if mixed is not None else 0,
        A=a,
        C=c,
        AP=a_pad,
        CP=c_pad,
        BT=bt,
        BN=COLUMNS_PER_STEP,
        SPAN=COLUMNS_PER_PROGRAM,
        MIX=side,
        RO=rows_out,
        RI=rows_in,
        OP=pad_out,
        IP=pad_in,
        num_warps=4,
        num_stages=3,
    )
    return partials, mixed


def mix_reference(source: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """`[tokens, r_out, n]`: Σ_r m[o, r] · source[t, r, :] for m `[r_out, r_in]` and source
    `[tokens, r_in, n]`, accumulated in float32 (float64 stays float64) and returned in source's
    dtype: the kernel's mix, and the fused op's fallback."""
    wide = torch.promote_types(source.dtype, torch.float32)
    m = m.to(source.dtype)  # rounded as the kernel rounds it
    return torch.matmul(m.to(wide), source.to(wide)).to(source.dtype)


# self-check results per (device, dtype, a, c), and of the fused mix per (..., side)
_VERDICTS: dict[tuple[torch.device, torch.dtype, int, int], bool] = {}
_MIX_VERDICTS: dict[tuple[torch.device, torch.dtype, int, int, int], bool] = {}


def triton_passes(device: torch.device, dtype: torch.dtype, a: int, c: int) -> bool:
    """Whether the kernel for rows (a, c) gives `pair_partials_blocked`'s partials on this device
    and dtype. Checked once per (device, dtype, a, c) and process, at the pair's first use (each
    pair is a kernel compiled of its own); a failure is logged and the op keeps the batched
    GEMM for that pair. Inside a CUDA-graph capture the check cannot run (it synchronises): an
    unchecked pair then reads False for that call, and is checked at its next call outside."""
    key = (torch.device(device), dtype, a, c)
    return _checked(_VERDICTS, key, lambda: _self_check(key[0], dtype, a, c))


def triton_mix_passes(device: torch.device, dtype: torch.dtype, a: int, c: int, side: int) -> bool:
    """`triton_passes` for the kernel that also mixes one side's rows (side 1: x's, 2: y's):
    its partials and its mix both checked, once per (device, dtype, a, c, side)."""
    key = (torch.device(device), dtype, a, c, side)
    return _checked(_MIX_VERDICTS, key, lambda: _self_check(key[0], dtype, a, c, side))


def _checked(cache: dict, key: tuple, check: Callable[[], bool]) -> bool:
    if key in cache:
        return cache[key]
    if _kernel() is None:
        cache[key] = False
        return False
    if device_capturing():
        return False
    cache[key] = check()
    return cache[key]


def verdicts() -> dict[str, bool]:
    """The self-checks run so far in this process, `"<device> <dtype> <a>x<c>": passed`, for a
    run's log: which LoKR w1 gradients took the kernel. Empty where only the batched GEMM ran
    (off CUDA, float32)."""
    named = {
        f"{device} {str(dtype).removeprefix('torch.')} {a}x{c}": passed
        for (device, dtype, a, c), passed in sorted(_VERDICTS.items(), key=str)
    }
    for (device, dtype, a, c, side), passed in sorted(_MIX_VERDICTS.items(), key=str):
        mixed = "x" if side == 1 else "y"
        named[f"{device} {str(dtype).removeprefix('torch.')} {a}x{c} mix {mixed}"] = passed
    return named


def device_capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (False without CUDA)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _self_check(device: torch.device, dtype: torch.dtype, a: int, c: int, side: int = 0) -> bool:
    """The kernel's partials against `pair_partials_blocked`'s in float64, partial by partial (a
    sum would not see a partial stored in the wrong place): a token count that leaves the last
    block short, a column count that leaves the last span and step short, and a tiny case. With
    a mix (`side` 1 or 2), its output against `mix_reference` in float64 too."""
    try:
        g = torch.Generator(device=device).manual_seed(0)
        for tokens, n in ((1003, 512), (77, COLUMNS_PER_PROGRAM + 100), (5, 96)):
            x = torch.randn(tokens, a, n, device=device, dtype=dtype, generator=g)
            y = torch.randn(tokens, c, n, device=device, dtype=dtype, generator=g)
            want = pair_partials_blocked(x.double(), y.double())
            mix_ok = True
            if side:
                shape = (c, a) if side == 1 else (a, c)
                m = torch.randn(shape, device=device, dtype=dtype, generator=g)
                got, mixed = pair_partials_mix_triton(x, y, m, side)
                want_mix = mix_reference((x if side == 1 else y).double(), m.double())
                # float32 sums of exact products, rounded once to the operands' dtype
                mix_ok = mixed.shape == want_mix.shape and torch.allclose(
                    mixed.double(), want_mix, rtol=1e-2, atol=1e-2
                )
            else:
                got = pair_partials_triton(x, y)
            # the same half-precision inputs, products exact in float32: only the order and
            # float32 rounding of at most BT · span additions per partial differ
            if (
                not mix_ok
                or got.shape != want.shape
                or not torch.allclose(got.double(), want, rtol=1e-4, atol=1e-3)
            ):
                worst = (got.double() - want).abs().max().item() if got.shape == want.shape else -1
                log.warning(
                    "LoKR w1-gradient kernel for a=%d c=%d (mix side %d) disagrees with its torch "
                    "twin on %s %s (partials' max |diff| %.3g, mix %s); using the torch path",
                    a,
                    c,
                    side,
                    device,
                    dtype,
                    worst,
                    "ok" if mix_ok else "wrong",
                )
                return False
    except Exception as exc:  # a Triton or driver failure: keep the torch path
        log.warning(
            "LoKR w1-gradient kernel unusable for a=%d c=%d on %s %s (%r)", a, c, device, dtype, exc
        )
        return False
    return True


def kernel_fits(x_dtype: torch.dtype, y_dtype: torch.dtype, tokens: int, a: int, c: int) -> bool:
    """The kernel's own conditions: half precision on both sides, w1 at most 8 × 8, a token."""
    return (
        x_dtype in (torch.bfloat16, torch.float16)
        and y_dtype == x_dtype
        and max(a, c) <= MAX_ROWS
        and tokens > 0
    )


def kernel_applies(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Whether `pair_partials` may take the kernel for these operands (before the self-check)."""
    return (
        x.is_cuda
        and y.is_cuda
        and kernel_fits(x.dtype, y.dtype, x.shape[0], x.shape[1], y.shape[1])
    )


@torch.library.custom_op("hotstep::kron_pair_partials", mutates_args=())
def pair_partials(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Partials `[programs, a, c]` float32 whose sum is `pair_sums_bmm(x, y)` (in float32): from
    the kernel where it applies and passed its self-check, else from the batched GEMM in the
    same shape.
    An opaque op: torch.compile calls it as it is, and CUDA graphs capture its launches. Its
    first call for each (device, dtype, a, c) runs the self-check; the CUDA-graph trees' eager
    warm-up reaches it before any capture. A launch that fails later (e.g. out of resources at a
    new size) is logged, turns the pair's verdict to False and falls back."""
    a, c = x.shape[1], y.shape[1]
    if kernel_applies(x, y) and triton_passes(x.device, x.dtype, a, c):
        try:
            return pair_partials_triton(x, y)
        except Exception as exc:
            log.warning(
                "LoKR w1-gradient kernel failed for a=%d c=%d (%r); batched GEMM", a, c, exc
            )
            _VERDICTS[(x.device, x.dtype, a, c)] = False
    return partials_bmm(x, y)


@pair_partials.register_fake
def _pair_partials_shape(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x.new_empty(partials_shape(x, y), dtype=torch.float32)


@torch.library.custom_op("hotstep::kron_pair_partials_mix", mutates_args=())
def pair_partials_mix(
    x: torch.Tensor, y: torch.Tensor, m: torch.Tensor, side: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`pair_partials(x, y)` and, from the same pass, one side's rows mixed by the small m:
    side 1 `mix_reference(x, m)` (m `[c, a]`), side 2 `mix_reference(y, m)` (m `[a, c]`). LoKR's
    backward needs both from the same operand (`adapters.MergedKron`): reading it once instead of
    twice saves one pass over an activation-sized tensor per adapted Linear. Kernel where it
    applies and passed its self-check for (device, dtype, a, c, side), else torch, in the same
    shapes."""
    if side not in (1, 2):
        raise ValueError(f"side must be 1 (mix x) or 2 (mix y), not {side}")
    a, c = x.shape[1], y.shape[1]
    if kernel_applies(x, y) and triton_mix_passes(x.device, x.dtype, a, c, side):
        try:
            return pair_partials_mix_triton(x, y, m, side)
        except Exception as exc:
            log.warning(
                "LoKR w1-gradient kernel with mix failed for a=%d c=%d (%r); torch", a, c, exc
            )
            _MIX_VERDICTS[(x.device, x.dtype, a, c, side)] = False
    # the unfused work: the partials op (its own kernel where that passed) and the mix as one
    # GEMM in the operand's dtype (no float32 copy of an activation-sized tensor)
    source = x if side == 1 else y
    return pair_partials(x, y), torch.matmul(m.to(source.dtype), source)


@pair_partials_mix.register_fake
def _pair_partials_mix_shape(
    x: torch.Tensor, y: torch.Tensor, m: torch.Tensor, side: int
) -> tuple[torch.Tensor, torch.Tensor]:
    source = x if side == 1 else y
    partials = x.new_empty(partials_shape(x, y), dtype=torch.float32)
    return partials, source.new_empty(source.shape[0], m.shape[0], source.shape[2])
