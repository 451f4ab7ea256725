"""Token-by-token decoding of the 5 Hz LM: CFG rows, sampling, and four step engines.

A `Stepper` runs a Qwen3ForCausalLM over 1 row (no CFG) or 2 rows ([cond, uncond]) and returns
the last hidden state [B, H]; logits are taken only over the vocabulary slice a phase may emit
(text ids for the CoT, the 64,000 code ids for codes), so the 217,204-row head is never applied
in full. Both rows always receive the same sampled token (LM CFG as upstream: the uncond branch
follows the cond branch's choices).

Batched requests (`PlannerLM.generate_batch`): N requests decode together over 2N rows
[cond_1..cond_N, uncond_1..uncond_N] (N without CFG). `step` then takes one token per row ([B]),
pair i's two rows both receiving request i's token; `combine_cfg_pairs` mixes pair i's logits
from rows (i, N + i). A 0-d token is still fed to every row.

Engines:
- "eager": transformers DynamicCache, 2-D padding mask (the reference; any device).
- "static": StaticCache of fixed length and a 4-D bool mask we keep ourselves (any device).
- "graph": "static" with the decode step captured once in a CUDA graph and replayed (CUDA only;
  falls back to "static" when capture fails). Kernel launches, not FLOPs, bound batch-2 decode.
- "compiled": "graph" over the step compiled by Inductor first (`torch.compile`, static shapes,
  one graph, no Inductor CUDA graphs: we capture our own), which fuses the norms, RoPE, SiLU-mul,
  residual adds, casts and cache writes that eager runs as separate kernels (CUDA only; falls
  back to "graph", then "static", when compiling or capturing fails; off CUDA it is "static").
- "auto": "graph" on CUDA, "eager" elsewhere (`resolve_mode`).

Graph safety: every input of a step lives in a static buffer written in place (ids, positions,
the 4-D mask) and the StaticCache advances its write slot with a device-side counter, so one
captured step replays correctly at every position. A compiled step takes those buffers as its
inputs and mutates the cache and its counters in place, so the same holds for its capture.

Warm start: the first step of a static stepper compiles and captures lazily (a 1.7B "compiled"
step took ~43 s on an H200); `Stepper.prepare` does that ahead of any request (a Serve replica
at start) and leaves the stepper as a fresh one is, so a later request only prefills and replays.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import get_args

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, DynamicCache, StaticCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from hotstep_ray.audition.options import DecodeMode
from hotstep_ray.models.lm_tokenizer import PAD_ID

log = logging.getLogger(__name__)
# Static cache lengths. A request always lands in the same bucket, whatever ran before, so its
# attention reductions (over the masked cache length) and hence its codes never depend on history.
STATIC_BUCKETS = (1024, 2048, 4096, 8192, 16384)


MODES: tuple[str, ...] = get_args(DecodeMode)  # the contract's choices, written there
CAPTURED = ("graph", "compiled")  # the engines that replay a captured step
# Tests only: a torch.compile backend (a name such as "inductor" or "aot_eager", or a callable)
# that keeps "compiled" off CUDA, its compiled step then running uncaptured. "" (the policy):
# "compiled" needs CUDA and resolves to "static" elsewhere.
_compile_off_cuda_for_tests = ""
# The recompile budget of the compiled step's code (shared by every stepper: one entry per row
# count, cache bucket, adapter structure and LoRA scale). Past it torch.compile would silently
# run the step uncompiled; we make that an error, so the stepper falls back to "graph" loudly.
COMPILE_RECOMPILE_LIMIT = 64


def resolve_mode(mode: str, device: torch.device | str) -> str:
    """`auto` -> graph on CUDA, eager elsewhere; graph and compiled off CUDA -> static; others
    as given."""
    if mode not in MODES:
        raise ValueError(f"decode mode {mode!r}: expected one of {', '.join(MODES)}")
    cuda = torch.device(device).type == "cuda"
    if mode == "auto":
        return "graph" if cuda else "eager"
    if mode == "compiled" and not cuda and _compile_off_cuda_for_tests:
        return mode
    if mode in CAPTURED and not cuda:
        return "static"
    return mode


def static_bucket(tokens: int) -> int:
    """The smallest static cache length holding `tokens` (prompt + new tokens + 1)."""
    for size in STATIC_BUCKETS:
        if tokens <= size:
            return size
    raise ValueError(f"{tokens} tokens exceed the largest static cache ({STATIC_BUCKETS[-1]})")


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.85  # 0 = greedy
    top_p: float = 0.9  # 1 = off
    top_k: int = 0  # 0 = off
    cfg_scale: float = 2.0  # <= 1 = no CFG (one row)
    rep_penalty: float = 1.0  # 1 = off; HF-style over the last `rep_window` emitted tokens
    rep_window: int = 64

    @property
    def uses_cfg(self) -> bool:
        return self.cfg_scale > 1.0


def combine_cfg(logits: torch.Tensor, cfg_scale: float) -> torch.Tensor:
    """[B, V] -> [V]: row 0 alone, or uncond + cfg * (cond - uncond) over [cond, uncond]."""
    if logits.shape[0] == 1:
        return logits[0]
    cond, uncond = logits[0], logits[1]
    return uncond + cfg_scale * (cond - uncond)


def combine_cfg_pairs(logits: torch.Tensor, pairs: int, cfg_scale: float) -> torch.Tensor:
    """[B, V] -> [pairs, V] over batched rows [cond_1..cond_N, uncond_1..uncond_N] (B = 2N) or
    [cond_1..cond_N] (B = N, no CFG): row i of the result is `combine_cfg` of rows (i, N + i),
    the same element-wise operations (so one pair gives `combine_cfg`'s values exactly)."""
    if logits.shape[0] == pairs:
        return logits
    if logits.shape[0] != 2 * pairs:
        raise ValueError(f"{logits.shape[0]} rows are neither {pairs} nor {2 * pairs}")
    cond, uncond = logits[:pairs], logits[pairs:]
    return uncond + cfg_scale * (cond - uncond)


def sample_token(
    logits: torch.Tensor,  # [V] float32 over the allowed slice
    params: Sampling,
    generator: torch.Generator,
    recent: torch.Tensor | None = None,  # [n] slice indices emitted recently
) -> torch.Tensor:
    """Index into the slice ([] long, on the logits' device). Repetition penalty, temperature,
    top-k, top-p, then an exponential-race draw (argmax p / E, E ~ Exp(1)): exact categorical
    sampling with one generator call and no host sync."""
    logits = logits.float()
    if params.rep_penalty != 1.0 and recent is not None and recent.numel():
        picked = logits[recent]
        penalised = torch.where(
            picked > 0, picked / params.rep_penalty, picked * params.rep_penalty
        )
        logits = logits.index_copy(0, recent, penalised)
    if params.temperature <= 0:
        return logits.argmax()
    logits = logits / params.temperature
    if 0 < params.top_k < logits.shape[0]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        ordered, order = torch.sort(logits, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        drop = (probs.cumsum(-1) - probs) > params.top_p  # the top token is always kept
        logits = logits.index_copy(0, order, ordered.masked_fill(drop, float("-inf")))
    probs = torch.softmax(logits, dim=-1)
    race = torch.empty_like(probs).exponential_(1.0, generator=generator)
    return (probs / race).argmax()


def head_slice(lm: torch.nn.Module, start: int, stop: int):
    """h [B, H] -> logits [B, stop - start] for vocabulary ids [start, stop) only. A plain
    bias-free Linear head is sliced (a view); anything else (an adapted head) runs in full."""
    head = lm.lm_head
    if type(head) is torch.nn.Linear and head.bias is None:
        weight = head.weight[start:stop]
        return lambda h: F.linear(h, weight)
    return lambda h: head(h)[:, start:stop]


# Attention of the compiled step. transformers' sdpa groups a single query token's heads under
# their key/value head (GQA without copies) only outside torch.compile; traced, it repeats the
# keys and values over the whole static cache at every layer and step. This is that sdpa with the
# grouping kept under compile: the same operations the uncompiled decode step runs.
DECODE_ATTENTION = "hotstep_decode_sdpa"


def decode_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """One query token, a mask shared by the heads, no dropout or position bias: SDPA over the
    query heads grouped as [B, kv heads, group, D] against the cache's [B, kv heads, M, D].
    Anything else: transformers' sdpa as is."""
    groups = getattr(module, "num_key_value_groups", 1)
    if (
        query.shape[2] != 1
        or groups == 1
        or attention_mask is None
        or attention_mask.shape[1] != 1
        or dropout
        or kwargs.get("position_bias") is not None
    ):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    batch, heads, _, dim = query.shape
    grouped = query.reshape(batch, heads // groups, groups, dim)  # [B, kv heads, group, D]
    out = F.scaled_dot_product_attention(
        grouped, key, value, attn_mask=attention_mask, scale=scaling
    )
    return out.reshape(batch, heads, 1, value.shape[-1]).transpose(1, 2).contiguous(), None


AttentionInterface.register(DECODE_ATTENTION, decode_sdpa)


@contextmanager
def _decode_attention(config) -> Iterator[None]:
    """`decode_sdpa` for the duration (an sdpa model only; any other is left alone)."""
    before = config._attn_implementation
    if before != "sdpa":
        yield
        return
    config._attn_implementation = DECODE_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = before


def _compile_guard():
    """torch.compile settings of the step's calls (warm-up, capture): see COMPILE_RECOMPILE_LIMIT."""
    settings = {"recompile_limit": COMPILE_RECOMPILE_LIMIT, "fail_on_recompile_limit_hit": True}
    config = torch._dynamo.config
    return config.patch(**{k: v for k, v in settings.items() if hasattr(config, k)})


def _left_pad(rows: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [B, L] left-padded with PAD_ID, valid [B, L] bool."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD_ID, dtype=torch.long)
    valid = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
        valid[i, width - len(row) :] = True
    return ids.to(device), valid.to(device)


def _row_ids(token: torch.Tensor, batch: int) -> torch.Tensor:
    """[B, 1] step ids: a 0-d token for every row, or a [B] tensor of one token per row."""
    if token.dim() == 0:
        return token.view(1, 1).expand(batch, 1)
    if token.shape != (batch,):
        raise ValueError(f"step token of shape {tuple(token.shape)}: expected [] or [{batch}]")
    return token.view(batch, 1)


class Stepper:
    """One LM over fixed-count rows; `start` prefills prompts, `step` feeds one token to every
    row (0-d) or one per row ([B])."""

    def __init__(
        self,
        lm: torch.nn.Module,
        mode: str = "eager",
        max_len: int = 0,
        compile_mode: str | None = None,
    ) -> None:
        """`max_len`: the static cache length (static/graph/compiled; 0 = the bucket of the first
        request). A static stepper serves requests up to that length only. `compile_mode`: the
        Inductor mode of "compiled" (None = default; "max-autotune-no-cudagraphs" tunes GEMMs)."""
        self.device = next(lm.parameters()).device
        self.lm, self.mode, self.max_len = lm, resolve_mode(mode, self.device), max_len
        self.compile_mode = compile_mode
        self._graph: torch.cuda.CUDAGraph | None = None
        self._compiled = None  # the torch.compile'd step ("compiled", once prepared)
        self._ready = False  # graph/compiled: step prepared (captured, or fallen back)

    # -- eager ------------------------------------------------------------------------------
    def _forward(self, ids, mask, positions, cache) -> torch.Tensor:
        out = self.lm.model(
            input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True
        )
        return out.last_hidden_state[:, -1]  # [B, H]

    @torch.no_grad()
    def start(self, rows: list[list[int]], max_new: int) -> torch.Tensor:
        """Prefill the prompts; returns h [B, H] of each row's last prompt token."""
        ids, valid = _left_pad(rows, self.device)
        batch, width = ids.shape
        self.positions = (valid.long().cumsum(-1) - 1).clamp_min(0)  # [B, L] real positions
        self.next_pos = self.positions[:, -1:] + 1  # [B, 1]
        if self.mode == "eager":
            self.cache = DynamicCache(config=self.lm.config)
            self.mask2d = valid.long()
            return self._forward(ids, self.mask2d, self.positions, self.cache)
        need = width + max_new + 1
        if not isinstance(getattr(self, "cache", None), StaticCache):
            self._new_static(batch, self.max_len or static_bucket(need))
        elif self.static_rows != batch:
            self._new_static(batch, self.static_len)
        if need > self.static_len:
            raise ValueError(
                f"{need} tokens exceed this stepper's static cache ({self.static_len})"
            )
        for layer in self.cache.layers:
            if getattr(layer, "is_initialized", False):
                layer.cumulative_length.zero_()
        # Prefill mask [B, 1, L, M]: causal over real tokens; a pad query sees only itself (so
        # no row is empty); nothing past L.
        length = self.static_len
        q = torch.arange(width, device=self.device)
        k = torch.arange(length, device=self.device)
        causal = (k[None, :] <= q[:, None])[None, None]  # [1, 1, L, M]
        keys = torch.zeros(batch, length, dtype=torch.bool, device=self.device)
        keys[:, :width] = valid
        prefill = (causal & keys[:, None, None, :]) | (k[None, :] == q[:, None])[None, None]
        h = self._forward(ids, self._masks(prefill), self.positions, self.cache)
        self.step_mask.zero_()
        self.step_mask[:, 0, 0, :width] = valid
        self.slot = width  # cache slot the next token is written to
        return h

    def _new_static(self, batch: int, length: int) -> None:
        if getattr(self.lm.config, "use_sliding_window", False):
            raise ValueError("static decoding supports full attention only")
        self.cache = StaticCache(config=self.lm.config, max_cache_len=length)
        self.static_rows, self.static_len = batch, length
        self.step_mask = torch.zeros(batch, 1, 1, length, dtype=torch.bool, device=self.device)
        self.step_ids = torch.zeros(batch, 1, dtype=torch.long, device=self.device)
        self.step_pos = torch.zeros(batch, 1, dtype=torch.long, device=self.device)
        self.step_out: torch.Tensor | None = None
        self._graph, self._compiled, self._ready = None, None, False

    def _masks(self, mask: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"full_attention": mask, "sliding_attention": mask}

    def _static_step(self) -> torch.Tensor:
        """One step from the static buffers: through the compiled step once there is one."""
        if self._compiled is not None:
            with _decode_attention(self.lm.config), _compile_guard():
                return self._compiled(self.step_ids, self.step_mask, self.step_pos)
        return self._forward(self.step_ids, self._masks(self.step_mask), self.step_pos, self.cache)

    def _compile(self) -> None:
        """The compiled step: static shapes, one graph, the static buffers as its inputs (so a
        capture reads them where `step` writes them); the cache's tensors are reached through
        the closure and mutated in place. Compiles lazily, at the first call."""
        model, cache, masks = self.lm.model, self.cache, self._masks

        def decode_step(ids, mask, positions):
            out = model(
                input_ids=ids,
                attention_mask=masks(mask),
                position_ids=positions,
                cache=cache,
                use_cache=True,
            )
            return out.last_hidden_state[:, -1]

        backend = "inductor" if self.device.type == "cuda" else _compile_off_cuda_for_tests
        options = {"mode": self.compile_mode} if backend == "inductor" else {}
        self._compiled = torch.compile(
            decode_step, backend=backend, dynamic=False, fullgraph=True, **options
        )

    @torch.no_grad()
    def step(self, token: torch.Tensor) -> torch.Tensor:
        """Feed `token` (long, on device) to the rows: [] to every row, or [B] one per row;
        returns h [B, H]. The static engines copy it into their `step_ids` buffer in place, so a
        captured step replays whichever form was fed (the buffer is [B, 1] either way)."""
        batch = self.next_pos.shape[0]
        ids = _row_ids(token, batch)
        if self.mode == "eager":
            self.mask2d = torch.cat([self.mask2d, self.mask2d.new_ones(batch, 1)], dim=1)
            h = self._forward(ids, self.mask2d, self.next_pos, self.cache)
            self.next_pos = self.next_pos + 1
            return h
        if self.slot >= self.static_len:
            raise RuntimeError("static cache full")
        self.step_ids.copy_(ids)
        self.step_pos.copy_(self.next_pos)
        self.step_mask[:, :, :, self.slot] = True
        self.slot += 1
        self.next_pos = self.next_pos + 1
        if self.mode in CAPTURED:
            return self._replay()
        return self._static_step()

    def _replay(self) -> torch.Tensor:
        if not self._ready:
            self._prepare()
        if self._graph is None:  # fallen back, or compiled off CUDA (tests): run uncaptured
            return self._static_step()
        self._graph.replay()
        return self.step_out

    def _prepare(self) -> None:
        """Compile ("compiled") and capture, falling back compiled -> graph -> static with a
        warning: both are optimisations, never a reason to fail a request. Warm-up runs advance
        every layer's write counter: they are rewound after each attempt, so the slots the
        warm-up wrote are simply overwritten by the real steps."""
        counters = [layer.cumulative_length for layer in self.cache.layers]
        before = [c.clone() for c in counters]

        def rewind() -> None:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            for counter, value in zip(counters, before, strict=True):
                counter.copy_(value)

        try:
            if self.mode == "compiled":
                try:
                    self._compile()
                    if self.device.type == "cuda":
                        self._capture()
                    else:  # tests: compile (the warm-up) without a CUDA graph to capture
                        self._warm_up()
                    return
                except Exception as exc:
                    fallback = "graph" if self.device.type == "cuda" else "static"
                    log.warning(
                        "compiled LM decode step failed to compile or capture (%s); decoding "
                        "with %s",
                        exc,
                        fallback,
                    )
                    self.mode, self._compiled, self._graph = fallback, None, None
                    rewind()
            if self.mode == "graph":
                try:
                    self._capture()
                except Exception as exc:
                    log.warning("CUDA graph capture failed (%s); decoding without graphs", exc)
                    self.mode, self._graph = "static", None
        finally:
            self._ready = True
            rewind()

    @torch.no_grad()
    def prepare(self, rows: int) -> None:
        """Allocate the static cache for `rows` rows and compile/capture the step now (what the
        first step of "graph"/"compiled" does lazily, with the same fallbacks), so that the first
        request only prefills and replays. A no-op for "eager" and for a stepper already prepared
        for `rows` rows (so calling it twice is harmless). Needs `max_len` unless a request has
        already sized the cache.

        It runs a one-token prompt per row and one step through the lazy path, then `_clear`s
        what they wrote: the next request starts from the state a fresh stepper has after its
        first prefill (prefill and `step` rewrite every other attribute)."""
        if self.mode == "eager" or self._prepared(rows):
            return
        if not self.max_len and not isinstance(getattr(self, "cache", None), StaticCache):
            raise ValueError("prepare needs the static cache length: build with max_len > 0")
        self.start([[PAD_ID]] * rows, 1)  # allocates the cache (its layers size lazily)
        if self.mode in CAPTURED:
            self.step(torch.tensor(PAD_ID, device=self.device))  # compiles, captures, replays
        self._clear()

    def _prepared(self, rows: int) -> bool:
        """Whether the cache is allocated for `rows` rows and the step compiled/captured (or
        fallen back). `start` keeps both as long as the row count stays the same."""
        if not isinstance(getattr(self, "cache", None), StaticCache) or self.static_rows != rows:
            return False
        return self.mode not in CAPTURED or self._ready

    def _clear(self) -> None:
        """Zero the cache, its write counters and the step inputs in place (a captured step keeps
        reading the same addresses): the zeros a fresh stepper's lazily allocated cache starts
        from. The dummy run wrote slots 0-2 only, which a real prefill overwrites, and stale
        slots are masked; but a masked slot still enters attention as 0 x value (NaN for a NaN
        value), so the cache is made exactly a fresh one rather than argued to be equivalent."""
        for layer in self.cache.layers:
            if getattr(layer, "is_initialized", False):
                layer.keys.zero_()
                layer.values.zero_()
                layer.cumulative_length.zero_()
        for buffer in (self.step_ids, self.step_pos, self.step_mask):
            buffer.zero_()

    def _warm_up(self) -> None:
        for _ in range(2):
            self._static_step()

    def _capture(self) -> None:
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            self._warm_up()  # also compiles a compiled step: compiling cannot be captured
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.step_out = self._static_step()
        self._graph = graph  # capturing ran nothing: the caller replays it for this token
