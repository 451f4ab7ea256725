"""Serve overhead benchmark: the same codes -> WAV work in-process and through the audition app.

Issue 30: what Ray Serve costs over calling the plain classes for the same work. One clip of
deterministic 5 Hz codes (`--seconds`, the same codes in every request) is decoded to a 16-bit
WAV by

  in-process    `CodesDecoder.decode` in this process, built as a replica builds it
                (`replica_codes_decoder`: same checkpoints, device, dtype, warmed), called from a
                thread pool of `concurrency` clients (requests queue on its lock, as in a replica)
  serve-http    `POST /codes-decode` of the audition app, deployed as the main job deploys it
                (`main_job._audition_app`: local Ray, a free 127.0.0.1 port, enable_dit False,
                replica_cpus 0, the GPU shares of `_replica_shares`, a bearer token), from a
                thread pool of HTTP clients (one keep-alive connection per client thread)
  serve-handle  the app's CodesDecoder deployment through a DeploymentHandle from this driver:
                the Ray hop without the HTTP proxy and the FastAPI ingress

at each `--concurrency` (default 1 and 32 concurrent clients), `--requests` timed requests per row
after a couple of warm-up requests. `--lm` adds the same rows for an LM plan (`PlannerLM.generate`
vs `POST /lm`, one fixed seed and pinned metas, so every request is the same work).

The in-process rows run first and their models are freed before Ray starts, so the two sides
never share the GPU's memory. A row's `requests` is at least its concurrency. Each row:
p50/p90/p99/mean ms, req/s, `inner_ms_p50` (the time the plain class reports for itself:
`decode_ms`, which includes the wait for the decoder's lock, or `lm_ms`, which does not) and
`outside_ms_p50` (per request, latency minus inner: what is spent outside the plain class; for
the LM that includes queueing on the planner), and on the Serve rows
`overhead_ms_p50` = this row's p50 minus the in-process p50 at the same concurrency. Where it
goes: serve-handle minus in-process is the Ray actor call plus moving the audio through the object
store; serve-http minus serve-handle is the HTTP proxy, the ingress (FastAPI, validation) and its
second hop. `startup` holds the in-process load times, Ray's start and the app's start-up seconds
(`serve.start` + `serve.run` until every replica is up: decoder load + graph capture, LM load +
warm); the audio bytes' sha1 of every path, and whether they match, sit in `audio_sha1`.
On a small CPU box Ray's own processes also slow the replica's decode itself (`inner_ms_p50`
of the Serve rows above the in-process one); `outside_ms_p50` is the Serve path alone.

On CUDA the script re-runs itself with the decoder replica's GLIBC_TUNABLES (serve_app's
DECODER_ENV) unless set, so both sides' WAV step allocates the same way.

  device (Ray under /tmp/site; --make-random writes the full-size 2B DiT + 1.7B LM tree once,
  into /tmp, so a second call on the warm machine reuses it), decode, then the LM plan:
    PYTHONPATH=/tmp/site:$PWD python3 bench/serve_overhead.py --checkpoints /tmp/ckpt \
        --make-random --out $OUT/serve_overhead.json
    PYTHONPATH=/tmp/site:$PWD python3 bench/serve_overhead.py --checkpoints /tmp/ckpt \
        --lm --lm-seconds 10 --lm-requests 32 --requests 64 --out $OUT/serve_overhead_lm.json
  (a checkout copied without .git: BENCH_COMMIT=<sha> in front records the commit)
  CPU dry:  python bench/serve_overhead.py --tiny --device cpu --concurrency 1,4 --requests 8 \
        --out /tmp/so.json
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import hashlib
import http.client
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from anywhere, no install
from bench_report import JsonReport, percentile, seeded_codes  # noqa: E402

WARMUP = 2  # untimed requests per path before its rows
APP_NAME = "audition"  # main_job.AUDITION_APP
# Every meta pinned: the plan is phase 2 only, the same tokens for every request of one seed.
LM_PIN = {"bpm": 120, "keyscale": "C major", "timesignature": "4", "language": "en"}
LM_CAPTION = "driving synthwave, analog bass, gated drums, airy female vocal"
LM_LYRICS = "[verse]\nneon on the water, engines in the rain\n[chorus]\nwe ride until the dawn"
LM_SEED = 1234

# A call returns (inner ms as the plain class reports it, a fingerprint: bytes to hash or a str).
Call = Callable[[], tuple[float, bytes | str]]


# --------------------------------------------------------------------------- helpers


def _summary(ms: list[float], prefix: str = "") -> dict[str, float]:
    return {
        f"{prefix}p50_ms": round(percentile(ms, 50), 3),
        f"{prefix}p90_ms": round(percentile(ms, 90), 3),
        f"{prefix}p99_ms": round(percentile(ms, 99), 3),
        f"{prefix}mean_ms": round(statistics.fmean(ms), 3),
        f"{prefix}min_ms": round(min(ms), 3),
        f"{prefix}max_ms": round(max(ms), 3),
    }


def _fingerprint(value: bytes | str) -> str:
    return value if isinstance(value, str) else hashlib.sha1(value).hexdigest()


def run_load(call: Call, concurrency: int, requests: int, client_warmup: bool) -> dict[str, Any]:
    """`requests` calls shared by `concurrency` client threads (each takes the next request as
    soon as its last one returns). With `client_warmup` each thread first makes one untimed call
    and the clock starts once all have (a fresh thread's first CPU decode is slower and differs
    in the last bits; an HTTP client opens its connection there). Latency is timed around the
    call only; fingerprints are hashed after the clock stops. At least `concurrency` requests,
    so that every client makes one."""
    requests = max(requests, concurrency)
    taken = itertools.count()
    lock = threading.Lock()
    samples: list[tuple[float, float, str]] = []  # (latency ms, inner ms, fingerprint)
    began: list[float] = []
    ready = threading.Barrier(concurrency, action=lambda: began.append(time.perf_counter()))

    def client() -> None:
        try:
            if client_warmup:
                call()
            ready.wait()
        except BaseException:
            ready.abort()  # the other clients stop waiting (BrokenBarrierError)
            raise
        while True:
            with lock:
                index = next(taken)
            if index >= requests:
                return
            start = time.perf_counter()
            inner, payload = call()
            ms = (time.perf_counter() - start) * 1000.0
            sha = _fingerprint(payload)
            with lock:
                samples.append((ms, inner, sha))

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        futures = [pool.submit(client) for _ in range(concurrency)]
        errors = [e for e in (f.exception() for f in futures) if e is not None]
    if errors:  # a client's error ends the row with it (not the others' broken barrier)
        raise next(
            (e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0]
        )
    wall = time.perf_counter() - began[0]
    latency = [s[0] for s in samples]
    inner = [s[1] for s in samples]
    outside = [s[0] - s[1] for s in samples]
    counts = collections.Counter(s[2] for s in samples)
    row: dict[str, Any] = {
        "concurrency": concurrency,
        "requests": len(samples),
        "client_warmup": client_warmup,
        "wall_s": round(wall, 3),
        "throughput_rps": round(len(samples) / wall, 3),
        **_summary(latency),
        "inner_ms_p50": round(percentile(inner, 50), 3),
        "outside_ms_p50": round(percentile(outside, 50), 3),
        "outside_ms_p99": round(percentile(outside, 99), 3),
        "sha1": counts.most_common(1)[0][0],  # the modal one
        "distinct_sha1": len(counts),
    }
    if len(counts) > 1:
        row["sha1_counts"] = dict(counts.most_common())
    return row


class HttpClients:
    """One keep-alive HTTP connection per client thread to the app, with its bearer token."""

    def __init__(self, base_url: str, token: str) -> None:
        parts = urllib.parse.urlsplit(base_url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.token = token
        self.local = threading.local()
        self.reconnects = 0
        self._count_lock = threading.Lock()

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=600)
            self.local.conn = conn
        return conn

    def request(
        self, method: str, path: str, body: bytes | None = None
    ) -> tuple[int, http.client.HTTPMessage, bytes]:
        headers = {"Authorization": f"Bearer {self.token}"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        for attempt in range(2):
            conn = self._connection()
            try:
                conn.request(method, path, body=body, headers=headers)
                response = conn.getresponse()
                return response.status, response.headers, response.read()
            except (http.client.HTTPException, OSError):
                conn.close()
                self.local.conn = None
                if attempt:
                    raise
                with self._count_lock:  # the server closed an idle keep-alive connection
                    self.reconnects += 1
        raise AssertionError("unreachable")

    def post_ok(self, path: str, body: bytes) -> tuple[http.client.HTTPMessage, bytes]:
        status, headers, data = self.request("POST", path, body)
        if status != 200:
            detail = data.decode(errors="replace")[:500]
            raise RuntimeError(f"POST {path}: HTTP {status}: {detail}")
        return headers, data

    def close(self) -> None:
        conn = getattr(self.local, "conn", None)
        if conn is not None:
            conn.close()


def _commit() -> str | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        done = None
    if done is not None and done.returncode == 0 and done.stdout.strip():
        return done.stdout.strip()
    return os.environ.get("BENCH_COMMIT")  # a checkout copied without .git


def _free(device) -> None:
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------- checkpoints


def prepare_checkpoints(args) -> Path:
    """The checkpoints folder: the tiny tree (--tiny, written once), a full-size random tree
    (--make-random, written when the folder is absent), else `--checkpoints` as it is."""
    if args.tiny:
        from hotstep_ray.main_job import write_tiny_tree

        folder = args.checkpoints or Path(tempfile.gettempdir()) / "hotstep-ray-bench" / "tiny"
        write_tiny_tree(str(folder))
        return Path(folder)
    if args.checkpoints is None:
        raise SystemExit("--checkpoints DIR is required (or --tiny)")
    folder = Path(args.checkpoints)
    if args.make_random and not folder.exists():
        from hotstep_ray.core.contracts import MakeRandomOptions
        from hotstep_ray.models import random_tree

        # what the app loads: the DiT (its detokenizer), the VAE, the LM; no text encoder
        options = MakeRandomOptions(text_encoder=False, lm=args.lm_size or "1.7B")
        start = time.perf_counter()
        random_tree.write_random_tree(
            folder, random_tree.tree_configs(options), seed=options.seed, dtype=options.dtype
        )
        print(f"random tree in {folder} ({time.perf_counter() - start:.1f} s)", flush=True)
    return folder


def lm_folder_of(checkpoints: Path, size: str | None) -> Path:
    """The LM folder the main job would serve: the contract's size, else the largest present."""
    from hotstep_ray.core.contracts import TrainLmOptions
    from hotstep_ray.training.lm_spec import present_lm_size, resolve_lm_dir

    wanted = size or present_lm_size(checkpoints, TrainLmOptions().lm_size)
    return resolve_lm_dir(checkpoints, wanted)


# --------------------------------------------------------------------------- sections


def _decode_call(decoder, codes: list[int]) -> Call:
    def call() -> tuple[float, bytes]:
        result = decoder.decode(codes, "wav")
        return result.decode_ms, result.audio

    return call


def _plan_call(planner, body: dict[str, Any]) -> Call:
    from hotstep_ray.audition.schemas import LmRequest

    def call() -> tuple[float, str]:
        result = planner.generate(LmRequest(**body))
        return result.lm_ms, result.codes_sha1

    return call


def in_process_decode(args, ctx, record) -> None:
    import torch

    from hotstep_ray.audition.decode import replica_codes_decoder

    start = time.perf_counter()
    decoder = replica_codes_decoder(ctx["checkpoints"], device=args.device)
    ctx["startup"]["in_process_decoder_load_s"] = round(time.perf_counter() - start, 3)
    device = decoder.device
    ctx["device"] = device
    ctx["dtype"] = str(decoder.dtype)
    if device.type == "cuda":
        ctx["gpu"] = torch.cuda.get_device_name(device)
    codes = ctx["codes"]
    first = None
    for _ in range(WARMUP):
        first = decoder.decode(codes, "wav")
    ctx["clip"]["wav_bytes"] = len(first.audio)
    ctx["clip"]["codes_sha1"] = first.codes_sha1

    call = _decode_call(decoder, codes)
    for concurrency in args.concurrency:
        row = {"work": "decode", "path": "in-process"}
        row.update(run_load(call, concurrency, args.requests, client_warmup=True))
        record(row)
    del decoder, first, call
    _free(device)


def lm_body(args) -> dict[str, Any]:
    return {
        "caption": LM_CAPTION,
        "lyrics": LM_LYRICS,
        "duration": args.lm_seconds,
        "lm_seed": LM_SEED,
        **LM_PIN,
    }


def in_process_lm(args, ctx, record) -> None:
    from hotstep_ray.audition.lm_decode import CAPTURED
    from hotstep_ray.audition.planner import PlannerLM
    from hotstep_ray.audition.schemas import LmRequest

    cfg = ctx["app_defaults"]
    start = time.perf_counter()
    planner = PlannerLM.from_checkpoints(  # as PlannerDeployment.__init__ builds it
        ctx["checkpoints"],
        data=ctx["data"],
        lm=ctx["lm_dir"].name,
        device=args.device,
        dtype=cfg.dtype,
        decode_mode=cfg.decode_mode,
        merge_adapters=cfg.merge_adapters,
    )
    if cfg.warm_planner and planner.decode_mode in CAPTURED:
        planner.warm()
    ctx["startup"]["in_process_planner_load_s"] = round(time.perf_counter() - start, 3)
    ctx["lm"] = {"folder": ctx["lm_dir"].name, "decode_mode": planner.decode_mode}
    body = lm_body(args)
    for _ in range(WARMUP):
        planner.generate(LmRequest(**body))

    call = _plan_call(planner, body)
    for concurrency in args.concurrency:
        row = {"work": "lm", "path": "in-process", "lm_seconds": args.lm_seconds}
        row.update(run_load(call, concurrency, args.lm_requests, client_warmup=False))
        record(row)
    device = planner.device
    del planner, call
    _free(device)


def serve_rows(args, ctx, record, attempt) -> None:
    """Start Ray and the app as the main job does, time it, then the HTTP and handle rows."""
    from ray import serve

    from hotstep_ray.distributed.runtime import ensure_ray
    from hotstep_ray.main_job import _audition_app, _replica_shares

    start = time.perf_counter()
    ray = ensure_ray()
    ctx["startup"]["ray_init_s"] = round(time.perf_counter() - start, 3)
    ctx["ray"] = ray.__version__
    ctx["startup"]["replica_shares"] = _replica_shares(ctx["lm_dir"])
    with contextlib.ExitStack() as stack:
        app = _audition_app(
            ctx["checkpoints"], ctx["data"], ctx["lm_dir"].name, args.device, ctx["lm_dir"]
        )
        start = time.perf_counter()
        base_url, token = stack.enter_context(app)
        ctx["startup"]["app_start_s"] = round(time.perf_counter() - start, 3)
        clients = HttpClients(base_url, token)
        status, _, health = clients.request("GET", "/health")
        ctx["startup"]["health"] = {"status": status, "body": json.loads(health or b"{}")}
        print(f"app up in {ctx['startup']['app_start_s']} s at {base_url}", flush=True)
        attempt("serve-decode", lambda: serve_decode(args, ctx, record, clients, serve))
        if args.lm:
            attempt("serve-lm", lambda: serve_lm(args, ctx, record, clients))
        ctx["http_reconnects"] = clients.reconnects
        clients.close()
    start = time.perf_counter()
    ray.shutdown()
    ctx["startup"]["ray_shutdown_s"] = round(time.perf_counter() - start, 3)


def serve_decode(args, ctx, record, clients: HttpClients, serve) -> None:
    codes = ctx["codes"]
    body = json.dumps({"audio_codes": codes, "format": "wav"}).encode()  # encoded once

    def http_call() -> tuple[float, bytes]:
        headers, data = clients.post_ok("/codes-decode", body)
        return float(headers.get("X-Decode-Ms", "nan")), data

    handle = serve.get_deployment_handle("CodesDecoder", app_name=APP_NAME)

    def handle_call() -> tuple[float, bytes]:
        result = handle.decode.remote(codes, "wav").result()
        return result.decode_ms, result.audio

    for _ in range(WARMUP):
        http_call()
        handle_call()
    for concurrency in args.concurrency:
        for path, call in (("serve-http", http_call), ("serve-handle", handle_call)):
            row = {"work": "decode", "path": path}
            row.update(run_load(call, concurrency, args.requests, client_warmup=True))
            record(row)


def serve_lm(args, ctx, record, clients: HttpClients) -> None:
    body = json.dumps(lm_body(args)).encode()

    def http_call() -> tuple[float, str]:
        _, data = clients.post_ok("/lm", body)
        result = json.loads(data)
        return float(result["lmMs"]), result["codesSha1"]

    for _ in range(WARMUP):
        http_call()
    for concurrency in args.concurrency:
        row = {"work": "lm", "path": "serve-http", "lm_seconds": args.lm_seconds}
        row.update(run_load(http_call, concurrency, args.lm_requests, client_warmup=False))
        record(row)


def add_overheads(report: dict[str, Any]) -> None:
    """`overhead_ms_p50` (and p99) on every Serve row against the in-process row of the same work
    and concurrency; the summary list; whether every path's audio (or codes) sha1 agrees."""
    base = {
        (r["work"], r["concurrency"]): r for r in report["rows"] if r.get("path") == "in-process"
    }
    summary = []
    for row in report["rows"]:
        ref = base.get((row.get("work"), row.get("concurrency")))
        if row.get("path", "in-process") == "in-process" or ref is None:
            continue
        row["overhead_ms_p50"] = round(row["p50_ms"] - ref["p50_ms"], 3)
        row["overhead_ms_p99"] = round(row["p99_ms"] - ref["p99_ms"], 3)
        summary.append(
            {
                "work": row["work"],
                "path": row["path"],
                "concurrency": row["concurrency"],
                "in_process_p50_ms": ref["p50_ms"],
                "serve_p50_ms": row["p50_ms"],
                "overhead_ms_p50": row["overhead_ms_p50"],
                "overhead_ms_p99": row["overhead_ms_p99"],
                "outside_ms_p50": row["outside_ms_p50"],
            }
        )
    report["overhead"] = summary
    for work, key in (("decode", "audio_sha1"), ("lm", "lm_codes_sha1")):
        modal: dict[str, set[str]] = {}  # path -> each row's most common sha1
        exact = True  # every request of every row gave the modal bytes
        for row in report["rows"]:
            if row.get("work") == work:
                modal.setdefault(row["path"], set()).add(row["sha1"])
                exact = exact and row["distinct_sha1"] == 1
        if modal:
            every = set().union(*modal.values())
            report[key] = {
                "by_path": {p: sorted(s) for p, s in modal.items()},
                "match": len(every) == 1 and len(modal) > 1,
                "every_request_identical": exact and len(every) == 1,
            }


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoints", type=Path, default=None)
    parser.add_argument(
        "--out", default=os.path.join(os.environ.get("OUT", "."), "serve_overhead.json")
    )
    parser.add_argument("--concurrency", default="1,32", help="comma list of client counts")
    parser.add_argument("--requests", type=int, default=128, help="timed decodes per row")
    parser.add_argument("--seconds", type=float, default=30.0, help="clip length of the codes")
    parser.add_argument("--device", default=None, help="cuda | cpu (default: cuda when present)")
    parser.add_argument("--lm", action="store_true", help="also time an LM plan (/lm)")
    parser.add_argument("--lm-seconds", type=float, default=30.0)
    parser.add_argument("--lm-requests", type=int, default=16, help="timed plans per row")
    parser.add_argument("--lm-size", default=None, help="LM folder size (default: as the job)")
    parser.add_argument(
        "--make-random", action="store_true", help="write a full-size random tree if absent"
    )
    parser.add_argument("--tiny", action="store_true", help="the tiny tree (CPU dry run)")
    args = parser.parse_args(argv)
    if args.tiny:  # only what the user left at its default changes
        for key, value in {
            "requests": 8,
            "seconds": 2.0,
            "lm_seconds": 2.0,
            "lm_requests": 4,
        }.items():
            if getattr(args, key) == parser.get_default(key):
                setattr(args, key, value)
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c]
    if not args.concurrency or min(args.concurrency) < 1 or args.requests < 1:
        parser.error("--concurrency needs counts >= 1 and --requests >= 1")
    return args


def _same_allocator_env(args) -> None:
    """On CUDA, re-run this process with the decoder replica's environment (serve_app's
    DECODER_ENV, which a replica gets only where the driver lacks it) unless it is set."""
    tunable = ("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")  # serve_app.DECODER_ENV
    if args.device == "cpu" or tunable[0] in os.environ:
        return
    import shutil

    if not shutil.which("nvidia-smi"):
        return
    os.environ[tunable[0]] = tunable[1]
    os.execv(sys.executable, [sys.executable, *sys.argv])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if argv is None:
        _same_allocator_env(args)
    import torch

    from hotstep_ray.audition import serve_app

    checkpoints = prepare_checkpoints(args)
    data = tempfile.mkdtemp(prefix="serve-overhead-data-")  # the app's (empty) storage root
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    app_defaults = serve_app.AuditionAppConfig(checkpoints=str(checkpoints), data=data)
    # as each replica does (_torch_setup): one torch thread on CPU
    if app_defaults.cpu_threads > 0 and not torch.cuda.is_available():
        torch.set_num_threads(app_defaults.cpu_threads)
    codes = seeded_codes(args.seconds, seed=int(args.seconds))
    ctx: dict[str, Any] = {
        "checkpoints": checkpoints,
        "data": data,
        "lm_dir": lm_folder_of(checkpoints, args.lm_size),
        "app_defaults": app_defaults,
        "codes": codes,
        "clip": {"seconds": args.seconds, "codes": len(codes)},
        "startup": {},
    }
    report: dict[str, Any] = {
        "bench": "serve_overhead",
        "started": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": _commit(),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "ray": None,
        "device": None,
        "gpu": None,
        "torch_threads": torch.get_num_threads(),
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES"),
        "tiny": args.tiny,
        "checkpoints": str(checkpoints),
        "lm_folder": ctx["lm_dir"].name,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "clip": ctx["clip"],
        "startup": ctx["startup"],
        "rows": [],
        "errors": [],
    }

    def refresh() -> None:
        report["device"] = str(ctx.get("device")) if ctx.get("device") else None
        for key in ("gpu", "ray", "dtype", "lm"):
            if key in ctx:
                report[key] = ctx[key]
        add_overheads(report)

    log = JsonReport(out, report, refresh)
    flush, record, attempt = log.write, log.record, log.attempt

    # In-process first, its models freed before Ray starts: the two never share the GPU.
    attempt("in-process-decode", lambda: in_process_decode(args, ctx, record))
    if args.lm:
        attempt("in-process-lm", lambda: in_process_lm(args, ctx, record))
    attempt("serve", lambda: serve_rows(args, ctx, record, attempt))
    report["http_reconnects"] = ctx.get("http_reconnects")
    report["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
    flush()
    for line in report["overhead"]:
        print(json.dumps(line), flush=True)
    print(json.dumps({"startup": report["startup"]}, default=str), flush=True)
    for key in ("audio_sha1", "lm_codes_sha1"):
        if key in report:
            print(f"{key} match across paths: {report[key]['match']}", flush=True)
    print(f"wrote {out}", flush=True)
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
