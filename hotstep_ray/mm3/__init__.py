"""MM3 (MiniMax-Music3) backend: DiT LoRA training on the diffusers MM3 classes.

Rates and shapes every module shares (facts: shared/reference/mm3.md §1.3-1.4). This file imports
nothing, so the GPU bench can import `hotstep_ray.mm3.flow` with torch alone.

- audio: 44.1 kHz stereo, PLANAR `[2, T]` (row 0 = the whole left channel);
- DAV latents: `[128, L]`, hop 512 samples -> 44100 / 512 = 86.1328125 latents per second;
  channels 0-63 encode the left channel, 64-127 the right;
- AR frames: 25 Hz (24 kHz / 960); F frames condition `latent_length(F) = int(F * 441 / 128)`
  latents (441 / 128 = 3.4453125 = (44100 / 24000) * (960 / 512));
- one DiT window = 200 frames = 689 latents (8.0 s); conditioning rollouts are 60 s segments.
"""

from __future__ import annotations

SAMPLE_RATE_HZ = 44_100
HOP_SAMPLES = 512
LATENT_HZ = SAMPLE_RATE_HZ / HOP_SAMPLES  # 86.1328125
LATENT_CHANNELS = 128  # 2 audio channels x 64 DAV channels
FRAME_HZ = 25  # AR frames per second
WINDOW_FRAMES = 200
WINDOW_LATENTS = 689  # latent_length(WINDOW_FRAMES)
SEGMENT_S = 60.0  # conditioning rollout segment (HOT-Step mm3-condition --segment-sec)
MAX_FRAMES = 9_000  # the LM's cap: 6 minutes
LATENTS_PER_FRAME_NUM, LATENTS_PER_FRAME_DEN = 441, 128  # 3.4453125 exactly


def latent_length(frames: int) -> int:
    """Latents conditioned by `frames` AR frames: int(frames * 3.4453125), in exact integers
    (the diffusers condition encoder computes the same number in floating point)."""
    return (int(frames) * LATENTS_PER_FRAME_NUM) // LATENTS_PER_FRAME_DEN
