"""`hotstep-ray audition ...`: run the audition service; decode a codes file to audio.

`audition serve`'s options are the fields of the app's contract (`audition.options.
AuditionAppConfig`, the same the Serve configs and the main job build the app from), generated
from it with its defaults and descriptions; only the ones given reach it. `--port`, `--host` and
`--ray-address` are where the app runs, not what it is; the bearer token comes from
$HOTSTEP_TOKEN only.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer

from hotstep_ray.audition.options import AuditionAppConfig
from hotstep_ray.cli.common import console, given, handle_errors, with_contract_options
from hotstep_ray.core.errors import InputError

app = typer.Typer(help="Hear adapters: the audition service and offline codes decoding.")


# What a None default resolves to, for --help.
_SHOWN_DEFAULTS = {
    "device": "cuda when present, else cpu",
    "dtype": "bf16 on CUDA, else fp32",
    "lm": "the first usable LM",
    "dit": "a turbo DiT",
}


def _serve(
    checkpoints: Path = typer.Option(..., "--checkpoints", help="The checkpoints/ folder."),
    data: str = typer.Option("./data", "--data", help="Storage root (adapters, previews)."),
    port: int = typer.Option(8000, min=1, max=65535, help="HTTP port."),
    host: str = typer.Option("127.0.0.1", help="Bind address (loopback by default)."),
    ray_address: str = typer.Option("", help="Join this Ray cluster (default: a local one)."),
    **values: Any,
) -> None:
    """Deploy the audition app on Ray Serve and block (Ctrl-C stops it). Bearer token: set
    HOTSTEP_TOKEN before starting."""
    config = AuditionAppConfig.model_validate(
        {**given(values), "checkpoints": str(checkpoints.resolve()), "data": data}
    )
    from ray import serve

    from hotstep_ray.audition import serve_app
    from hotstep_ray.distributed.runtime import ensure_ray

    ensure_ray(ray_address or None, quiet=False)
    serve.start(http_options={"host": host, "port": port})
    serve.run(serve_app.build_app(config), name="audition", route_prefix="/")
    console.print(f"[green]audition on http://{host}:{port}[/]  (docs: /docs)", soft_wrap=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()


# The token stays out of the options (a command line is visible to every user of the machine).
serve_cmd = app.command("serve")(
    handle_errors(
        with_contract_options(
            AuditionAppConfig,
            skip={"checkpoints", "data", "token"},
            shown_defaults=_SHOWN_DEFAULTS,
        )(_serve)
    )
)


@app.command("decode")
@handle_errors
def decode_cmd(
    codes_file: Path = typer.Argument(..., help="Codes: <|audio_code_N|> tokens or CSV ints."),
    checkpoints: Path = typer.Option(..., "--checkpoints", help="The checkpoints/ folder."),
    out: Path = typer.Option(Path("codes.wav"), "--out", help="Output .wav or .flac."),
    dit: str = typer.Option("", help="DiT folder whose detokenizer to use (default: a turbo)."),
    device: str = typer.Option("", help="cuda / cpu (default: cuda when present)."),
) -> None:
    """Decode 5 Hz codes to 48 kHz stereo audio without the DiT (the pure-LM preview)."""
    from hotstep_ray.audition.decode import CodesDecoder

    fmt = out.suffix.lower().lstrip(".")
    if fmt not in ("wav", "flac"):
        raise InputError(f"--out {out}: use a .wav or .flac file name")
    text = codes_file.read_text(encoding="utf-8")
    decoder = CodesDecoder.from_checkpoints(checkpoints, dit=dit or None, device=device or None)
    result = decoder.decode(text, fmt)
    out.write_bytes(result.audio)
    console.print(
        f"[green]{out}[/]: {result.codes_count} codes = {result.duration_s:g} s, "
        f"{result.decode_ms:.0f} ms, sha1 {result.codes_sha1}",
        soft_wrap=True,
    )
