"""The studio HTTP API (FastAPI, on uvicorn or Ray Serve) over the stages: datasets, jobs run as
Ray actors, live events as SSE.

app            `create_app(config)`: routes, auth, error shape
datasets_api   dataset routes (thin over `dataset.store`)
jobs           `JobManager` + the runner actor (why actors, not Ray Jobs: its docstring)
records        job.json / _meta.json / events.jsonl in storage; restart recovery
stages         job kinds -> entry points (501 until a stage lands), prechecks
runners        per-stage adapters the runner actor calls
sse            the capped replay buffer (2000) and SSE frames
security       allowed roots, bearer token, body cap
capabilities   checkpoints, providers, GPUs, stages
serve          the Ray Serve deployment
"""
