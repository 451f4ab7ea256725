"""Hear an adapter: 5 Hz codes -> audio, LM planning with per-name adapters, same-seed A/B, DiT
audition, the adapter catalogue and the GPU lease. Plain classes; `serve_apps/audition_app.py` wraps
them in Ray Serve deployments."""
