"""The studio's one page (`/`) and its static files, shipped inside the package
(`hotstep_ray/studio/static/`, listed in pyproject's package-data).

No CDN and no build step: plain HTML, CSS and one script, so the page works on a machine with no
way out. The files are public (they hold no data); every API call the page makes carries the
bearer token the user typed, kept in the tab's sessionStorage. The Content-Security-Policy allows
only this origin, so a caption or a file name containing markup can never run script here.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

from hotstep_ray.studio.errors import NotFoundError

STATIC_PREFIX = "/static/"
# name -> media type: only these files are served (no path from the URL reaches the disk).
STATIC_FILES = {
    "index.html": "text/html; charset=utf-8",
    "studio.css": "text/css; charset=utf-8",
    "studio.js": "text/javascript; charset=utf-8",
}
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; media-src 'self' blob:; "
        "style-src 'self'; script-src 'self'; connect-src 'self'; "
        "object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def is_public(path: str) -> bool:
    """Paths served without the bearer token: the page and its own files."""
    return path == "/" or (
        path.startswith(STATIC_PREFIX) and path[len(STATIC_PREFIX) :] in STATIC_FILES
    )


def read_static(name: str) -> bytes:
    if name not in STATIC_FILES:
        raise NotFoundError(f"no static file {name!r}")
    return resources.files("hotstep_ray.studio").joinpath("static", name).read_bytes()


def _file(name: str) -> Response:
    return Response(read_static(name), media_type=STATIC_FILES[name], headers=SECURITY_HEADERS)


def router() -> APIRouter:
    api = APIRouter(include_in_schema=False)

    @api.get("/")
    def index() -> Response:
        return _file("index.html")

    @api.get(STATIC_PREFIX + "{name}")
    def static(name: str) -> Response:
        return _file(name)

    return api
