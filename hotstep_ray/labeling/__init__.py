"""Labeling: Essentia BPM/key, Genius lyrics and audio-aware captions, merged into sidecars.

Everything here is plain Python; `ray_pool` is the only module that imports Ray, and it only fans
the per-sample steps of `job.label_dataset` out over actor pools.
"""
