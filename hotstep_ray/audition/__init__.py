"""Hear an adapter: 5 Hz codes -> audio, LM planning with per-name adapters, same-seed A/B, DiT
audition, the adapter catalogue and the GPU lease. Plain classes; `serve_app.py` wraps them in Ray
Serve deployments (`serve_apps/audition_app.py` binds it for `serve run`)."""
