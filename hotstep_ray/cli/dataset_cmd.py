"""`hotstep-ray dataset …`: scan a folder, build Side-Step's dataset.json, show and inspect.

Bad input (a missing folder, an unreadable sidecar given to `inspect`, an output path outside the
allowed roots) prints one red line and exits with code 2 (`handle_errors`). `build` with songs it
cannot read (audio or sidecar) writes the others and exits 3 (`EXIT_PARTIAL`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

import typer
from rich.markup import escape
from rich.table import Table

from hotstep_ray.audio.io import probe_audio
from hotstep_ray.cli.common import console, finish_stage, handle_errors, print_json
from hotstep_ray.core.contracts import (
    AUDIO_EXTENSIONS,
    AUDIO_PRIORITY,
    BuildOptions,
    CreateDatasetInput,
    DatasetDetail,
    TagPosition,
)
from hotstep_ray.core.errors import InputError
from hotstep_ray.core.storage import Storage
from hotstep_ray.dataset.scan import ensure_folder, scan_preview
from hotstep_ray.dataset.sidecar import (
    LEGACY_ENCODING,
    load_sidecar,
    normalize_sidecar,
    parse_sidecar_text,
    read_sidecar_text,
)
from hotstep_ray.dataset.store import (
    build_from_detail,
    create_dataset,
    find_dataset_by_source,
    included_samples,
    load_dataset,
    resolve_output,
    update_dataset,
)

app = typer.Typer(
    help="Scan a folder of songs, read Side-Step sidecars and build dataset.json.",
    no_args_is_help=True,
)

TAG_POSITIONS: tuple[str, ...] = get_args(TagPosition)
CONVENTIONS = {
    "txt": "<stem>.txt with a caption",
    "split": "<stem>.caption.txt / <stem>.lyrics.txt",
    "lyrics_only": "<stem>.txt without a caption: the whole text is lyrics",
    "none": "no sidecar",
}


def _short(value: Any, width: int = 48) -> str:
    text = "" if value is None else str(value).replace("\n", " ⏎ ")
    return escape(text if len(text) <= width else text[: width - 1] + "…")


def _print_warnings(warnings: list[str]) -> None:
    for warning in warnings:
        console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False, soft_wrap=True)


@app.command()
@handle_errors
def scan(
    source: str = typer.Argument(..., help="Folder of songs (a path or a URL such as s3://…)."),
    recursive: bool = typer.Option(True, "--recursive/--no-recursive", help="Include subfolders."),
    as_json: bool = typer.Option(False, "--json", help="Print the preview as JSON."),
) -> None:
    """Preview what a dataset of SOURCE would hold (no audio is decoded)."""
    preview = scan_preview(Storage(source), recursive)
    if as_json:
        print_json(preview.to_json_dict())
        return
    table = Table(title=escape(preview.root), show_header=False)
    table.add_row("audio files", str(preview.audio_files))
    table.add_row("with a sidecar", str(preview.with_sidecar))
    table.add_row("with a caption", str(preview.with_caption))
    table.add_row("dataset.json", "yes" if preview.has_dataset_json else "no")
    table.add_row("extensions", ", ".join(f"{k} {v}" for k, v in preview.extensions.items()))
    table.add_row("first files", escape("\n".join(preview.sample_names)))
    console.print(table)
    _print_warnings(preview.warnings)


def _settings(**options: Any) -> dict[str, Any]:
    given = {k: v for k, v in options.items() if v is not None}
    if given.get("tag_position") not in (None, *TAG_POSITIONS):
        raise InputError(f"--tag-position must be one of {', '.join(TAG_POSITIONS)}")
    return given


@app.command()
@handle_errors
def build(
    source: str = typer.Argument(..., help="Folder of songs (a path or a URL)."),
    name: str | None = typer.Option(None, help="Dataset name (default: the folder's name)."),
    data: str = typer.Option("./data", help="Storage root that holds dataset records."),
    tag: str | None = typer.Option(None, help="Trigger word added to every caption."),
    tag_position: str | None = typer.Option(None, help="prepend | append | replace."),
    genre_ratio: int | None = typer.Option(
        None, min=0, max=100, help="Percent of songs whose prompt uses the genre."
    ),
    language: str | None = typer.Option(None, help="Default language (ISO 639-1 or a name)."),
    output: str | None = typer.Option(
        None, help="Where to write dataset.json (inside SOURCE or --data)."
    ),
) -> None:
    """Create or update the dataset of SOURCE and write its dataset.json.

    Exits 3 when some songs could not be read (the others are written), 2 on bad input."""
    storage = Storage(data)
    folder = Storage(source)
    ensure_folder(folder)
    settings = _settings(
        name=name,
        custom_tag=tag,
        tag_position=tag_position,
        genre_ratio=genre_ratio,
        default_language=language,
    )
    if output:  # refuse a bad output before creating anything
        resolve_output(storage, folder, "check", output)
    slug = find_dataset_by_source(storage, folder.url)
    if slug is None:
        detail = create_dataset(storage, CreateDatasetInput(source_dir=source, **settings))
        console.print(f"created dataset [bold]{escape(detail.slug)}[/]", highlight=False)
    else:
        if settings:
            update_dataset(storage, slug, settings)
        detail = load_dataset(storage, slug)
    path = build_from_detail(storage, detail, BuildOptions(output_path=output or ""))
    _print_warnings(detail.warnings)
    written = len(included_samples(detail.samples))
    console.print(
        f"wrote [bold]{escape(path)}[/] with {written} samples "
        f"({detail.sample_count} found, {detail.labeled_count} labeled, "
        f"{detail.excluded_count} excluded)",
        highlight=False,
        soft_wrap=True,  # keep paths whole so they can be copied
    )
    # A song on disk that could not be read was left out: that is a failed sample. Excluded
    # songs (the user's choice) and files gone from disk (nothing to read) are not.
    failed = sum(1 for s in detail.samples if s.error and not (s.excluded or s.file_missing))
    finish_stage(f"{written} samples written", failed)


def _sample_table(detail: DatasetDetail) -> Table:
    table = Table(title=f"{escape(detail.name)} ({escape(detail.slug)})")
    table.add_column("id", no_wrap=True)
    for column in ("file", "caption", "genre", "bpm", "key", "sec", "status"):
        table.add_column(column, overflow="fold")
    for sample in detail.samples:
        status = "missing" if sample.file_missing else sample.label_status
        if sample.excluded:
            status += ", excluded"
        table.add_row(
            sample.sample_id,
            _short(sample.rel_path, 40),
            _short(sample.caption),
            _short(sample.genre, 24),
            "" if sample.bpm is None else str(sample.bpm),
            _short(sample.key, 12),
            f"{sample.duration:.1f}",
            status,
        )
    return table


@app.command()
@handle_errors
def show(
    slug: str = typer.Argument(..., help="Dataset slug."),
    data: str = typer.Option("./data", help="Storage root that holds dataset records."),
    as_json: bool = typer.Option(False, "--json", help="Print the dataset as JSON."),
) -> None:
    """Show a dataset: its settings and every sample (rescanned from disk)."""
    detail = load_dataset(Storage(data), slug)
    if as_json:
        print_json(detail.to_json_dict())
        return
    console.print(
        f"source {escape(detail.source_dir)}\n"
        f"status {detail.status}  samples {detail.sample_count}  labeled {detail.labeled_count}"
        f"  excluded {detail.excluded_count}\n"
        f"tag {escape(detail.custom_tag or '-')} ({detail.tag_position})  "
        f"genre ratio {detail.genre_ratio}%  language {escape(detail.default_language)}\n"
        f"dataset.json {escape(detail.dataset_json_path or '-')}",
        highlight=False,
        soft_wrap=True,
    )
    console.print(_sample_table(detail))
    _print_warnings(detail.warnings)


def _split_location(file: str) -> tuple[Storage, str]:
    if "://" in file:
        parent, name = file.rsplit("/", 1)
        return Storage(parent), name
    path = Path(file).expanduser().resolve()
    return Storage(path.parent), path.name


def _stem_of(name: str) -> str:
    lower = name.lower()
    for suffix in (".caption.txt", ".lyrics.txt", ".txt", *AUDIO_EXTENSIONS):
        if lower.endswith(suffix):
            return name[: -len(suffix)]
    raise InputError(f"{name}: expected a sidecar .txt or an audio file")


def inspect_sidecar(file: str) -> dict[str, Any]:
    """What the loader reads for FILE's stem, and what Side-Step's parser makes of FILE."""
    folder, name = _split_location(file)
    stem = _stem_of(name)
    if not folder.exists(name):
        raise InputError(f"not found: {folder.url_of(name)}")
    text = read_sidecar_text(folder, name) if name.lower().endswith(".txt") else None
    loaded = load_sidecar(folder, stem)
    audio = next((f"{stem}{ext}" for ext in AUDIO_PRIORITY if folder.exists(f"{stem}{ext}")), None)
    if name.lower().endswith(AUDIO_EXTENSIONS):
        audio = name
    normalized = None
    if audio is not None:
        try:
            seconds = probe_audio(folder, audio).duration_s
        except InputError:
            seconds = 0.0
        normalized = normalize_sidecar(loaded.fields, audio, seconds)
    return {
        "file": folder.url_of(name),
        "convention": loaded.convention,
        "sidecar_files": [folder.url_of(k) for k in loaded.files],
        "legacy_encoded": [folder.url_of(k) for k in loaded.legacy_files],
        "audio": folder.url_of(audio) if audio else None,
        "parsed": parse_sidecar_text(text) if text is not None else None,
        "fields": loaded.fields,
        "normalized": normalized,
    }


def _fields_table(title: str, fields: dict[str, Any]) -> Table:
    table = Table(title=title, show_header=False)
    for key, value in fields.items():
        table.add_row(key, escape("" if value is None else str(value)))
    return table


@app.command()
@handle_errors
def inspect(
    file: str = typer.Argument(..., help="A sidecar <stem>.txt, or the audio file it belongs to."),
    as_json: bool = typer.Option(False, "--json", help="Print the fields as JSON."),
) -> None:
    """Show the fields read from ONE sidecar, with Side-Step's loader convention."""
    report = inspect_sidecar(file)
    if as_json:
        print_json(report)
        return
    convention = report["convention"]
    console.print(
        f"{escape(report['file'])}\nconvention: {convention} ({escape(CONVENTIONS[convention])})",
        highlight=False,
        soft_wrap=True,
    )
    for legacy in report["legacy_encoded"]:
        console.print(
            f"[yellow]not UTF-8, read as {LEGACY_ENCODING}:[/] {escape(legacy)} (the next write "
            "stores it as UTF-8 and keeps these bytes as a backup)",
            highlight=False,
            soft_wrap=True,
        )
    console.print(_fields_table("fields (loader)", report["fields"]))
    parsed = report["parsed"]
    if parsed is not None and parsed != report["fields"]:
        ignored = sorted(set(parsed) - set(report["fields"]))
        if ignored:
            console.print(f"[yellow]parsed but not used by the loader:[/] {', '.join(ignored)}")
    if report["normalized"] is not None:
        console.print(_fields_table("normalised (what preprocessing uses)", report["normalized"]))
