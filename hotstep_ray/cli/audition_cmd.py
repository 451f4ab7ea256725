"""`hotstep-ray audition ...`: run the audition service; decode a codes file to audio."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from hotstep_ray.cli.common import console, handle_errors
from hotstep_ray.core.errors import InputError

app = typer.Typer(help="Hear adapters: the audition service and offline codes decoding.")


@app.command("serve")
@handle_errors
def serve_cmd(
    checkpoints: Path = typer.Option(..., "--checkpoints", help="The checkpoints/ folder."),
    data: str = typer.Option("./data", "--data", help="Storage root (adapters, previews)."),
    port: int = typer.Option(8000, help="HTTP port."),
    host: str = typer.Option("127.0.0.1", help="Bind address (loopback by default)."),
    device: str = typer.Option("", help="cuda / cpu (default: cuda when present)."),
    no_dit: bool = typer.Option(False, "--no-dit", help="Skip the DiT audition deployment."),
    decode_mode: str = typer.Option(
        "compiled",
        help="LM decoding: compiled (a torch.compile'd step in a CUDA graph; static off CUDA), "
        "auto (CUDA graphs on CUDA), eager, static or graph.",
    ),
    ray_address: str = typer.Option("", help="Join this Ray cluster (default: a local one)."),
) -> None:
    """Deploy the audition app on Ray Serve and block (Ctrl-C stops it). Bearer token: set
    HOTSTEP_TOKEN before starting."""
    from ray import serve

    from hotstep_ray.audition import serve_app as module
    from hotstep_ray.distributed.runtime import ensure_ray

    config = module.AuditionAppConfig(
        checkpoints=str(checkpoints.resolve()),
        data=data,
        device=device or None,
        enable_dit=not no_dit,
        decode_mode=decode_mode,
    )
    ensure_ray(ray_address or None, quiet=False)
    serve.start(http_options={"host": host, "port": port})
    serve.run(module.build_app(config), name="audition", route_prefix="/")
    console.print(f"[green]audition on http://{host}:{port}[/]  (docs: /docs)", soft_wrap=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()


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
