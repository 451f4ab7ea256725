"""Teacher-forced ("aligned") conditioning: replay a song's RVQ codes through the LM and depth
decoder in one pass instead of sampling them.

Codes come from a community audio -> RVQ encoder (not part of this repo; HOT-Step's
`mm3-codes` format is read here): int32 [n, 8] per song, columns semantic, acoustic 1..7, and
row 0 a duplicated WARM-UP row. Why the warm-up row (seed trap 4): in the reference loop,
iteration 0 samples codes that are fed back but never emitted; emitted frame j comes from
iteration j + 1. So with rows r_0 (warm-up), r_1 .. r_{n-1} (frames 0 .. n-2):

    LM input   = prompt ids (conditional row) + frame_embed(r_0 .. r_{n-2})      [P + n - 1]
    h_i        = LM hidden at position P - 1 + i  (the state iteration i samples from)
    frame j    = concat(h_{j+1}, depth hiddens of (h_{j+1}, r_{j+1}))            [8 * H]

with frame_embed = (LM.embed(semantic + 151675) + sum_k depth.audio_embeddings(c_k +
(k - 1) * V)) * 8^-0.5 (the reference's own `_embed_audio_frame`: the semantic code embeds through
the LM table, seed trap 5) and the depth sequence [proj(h), proj(LM.embed(semantic + offset)),
proj(audio_emb(c_1)), ..., proj(audio_emb(c_6 + 5 V))], whose positions 1..7 are the hidden states
the 7 acoustic heads read (causal, learned absolute positions: one pass equals the AR loop).
A file without the warm-up row gets row 0 duplicated, as HOT-Step's exporter writes it.

HOT-Step measured that FULL alignment "describes the target so completely that the adapter learns
nothing"; its semantic-only variant (semantic codes forced, acoustic codes sampled) is not
implemented here yet. Aligned caches have one segment and no seams.
"""

from __future__ import annotations

import numpy as np
import torch
from diffusers.modular_pipelines.minimax_music3.encoders import _embed_audio_frame

from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage
from hotstep_ray.mm3 import MAX_FRAMES, latent_length
from hotstep_ray.mm3.condition import ConditionModels, SongCondition, encode_span, tokenize

CODEBOOKS = 8
SEMANTIC_OFFSET = 151_675  # first semantic-code token id of the composer LM
FRAME_CHUNK = 1024  # depth-decoder frames per pass


def read_codes(storage: Storage, key: str, warmup_row: bool = True) -> torch.Tensor:
    """[n, 8] int64 codes (row 0 = warm-up) from raw little-endian int32 `.codes` or `.npy`."""
    data = storage.read_bytes(key)
    if key.endswith(".npy"):
        import io

        array = np.load(io.BytesIO(data), allow_pickle=False)
    else:
        array = np.frombuffer(data, dtype="<i4")
        if array.size % CODEBOOKS:
            raise InputError(f"{storage.url_of(key)}: {array.size} int32 is not rows of 8 codes")
        array = array.reshape(-1, CODEBOOKS)
    codes = torch.from_numpy(np.ascontiguousarray(array).astype(np.int64))
    if codes.ndim != 2 or codes.shape[1] != CODEBOOKS or codes.shape[0] < 1:
        raise InputError(
            f"{storage.url_of(key)}: codes must be [frames, 8], got {tuple(codes.shape)}"
        )
    if not warmup_row:
        codes = torch.cat([codes[:1], codes])
    return codes[: MAX_FRAMES + 1]


@torch.no_grad()
def teacher_forced_hiddens(
    models: ConditionModels, caption: str, lyrics: str, codes: torch.Tensor
) -> torch.Tensor:
    """Frame hidden states [n - 1, 8 * H] for codes [n, 8] (row 0 = warm-up)."""
    if codes.shape[0] < 2:
        raise InputError("teacher forcing needs the warm-up row plus at least one frame")
    lm, depth = models.language_model, models.rvq_depth_decoder
    device = next(lm.parameters()).device
    codes = codes.to(device)
    ids = tokenize(models, caption, lyrics)[:1].to(device)  # the conditional row only
    prompt = lm.model.embed_tokens(ids)  # [1, P, H]
    frames = _embed_audio_frame(lm, depth, codes[:-1]).reshape(1, -1, prompt.shape[-1])
    hidden = lm.model(inputs_embeds=torch.cat([prompt, frames.to(prompt.dtype)], dim=1))
    hidden = hidden.last_hidden_state[0, ids.shape[1] :]  # h_1 .. h_{n-1}: [n - 1, H]
    rows = codes[1:]  # the codes each emitted frame's iteration sampled
    vocab = int(depth.config.audio_vocab_size)
    out = []
    for a in range(0, rows.shape[0], FRAME_CHUNK):
        h, r = hidden[a : a + FRAME_CHUNK], rows[a : a + FRAME_CHUNK]
        semantic = lm.model.embed_tokens(r[:, 0] + SEMANTIC_OFFSET)
        offsets = torch.arange(CODEBOOKS - 2, device=device) * vocab  # c_1 .. c_6
        acoustic = depth.audio_embeddings(r[:, 1 : CODEBOOKS - 1] + offsets)  # [N, 6, H]
        sequence = torch.cat(
            [h.unsqueeze(1), semantic.unsqueeze(1).to(h.dtype), acoustic.to(h.dtype)], dim=1
        )  # [N, 8, H]
        depth_hidden = depth(depth.projection(sequence))[:, 1:]  # [N, 7, H]
        out.append(torch.cat([h, depth_hidden.flatten(1).to(h.dtype)], dim=-1))
    return torch.cat(out).float()


def aligned_condition(
    models: ConditionModels, caption: str, lyrics: str, codes: torch.Tensor
) -> SongCondition:
    """One teacher-forced replay over the whole song: one span, no seams."""
    hiddens = teacher_forced_hiddens(models, caption, lyrics, codes)
    frames = int(hiddens.shape[0])
    length = latent_length(frames)
    condition = encode_span(models.condition_encoder, hiddens, length).to(torch.float16)
    return SongCondition(
        condition=condition,
        span_starts=[0],
        span_ends=[length],
        frames_wanted=[frames],
        frames_emitted=[frames],
        eos_hit=[False],
        aligned=True,
    )
