"""Preprocessing: a dataset's songs -> the safetensors tensor cache both trainers stream from.

audio_prep   decode, 48 kHz stereo planar [2, T], cut, peak-normalise
encode       `Encoder`: VAE latents, condition, context, 5 Hz codes on one device
plan         which samples are stale; prompts
cache        file format (tensor names, header metadata, Side-Step .pt)
finalize     preprocess_meta.json, lm_codes.jsonl, channel_stats.json
run          `preprocess_dataset`, `inspect_decode`
ray_pipeline the same on Ray Data (CPU decode tasks -> encoder actor pool -> writes)
"""
