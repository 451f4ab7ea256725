"""The page's files: served at `/` and `/static/` without the token (they hold no data) and
with a same-origin-only CSP; shipped inside the package and declared as package data; nothing
in them loads from another origin (the studio may run with no way out)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from hotstep_ray.studio import page

REPO = Path(__file__).resolve().parents[2]
SVG_NAMESPACE = "http://www.w3.org/2000/svg"  # an identifier, never fetched


def test_the_page_is_public_and_the_api_is_not(make_client):
    client = make_client(token="s3cret")
    index = client.get("/")
    assert index.status_code == 200 and index.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in index.headers["content-security-policy"]
    assert '<script src="/static/studio.js"' in index.text
    for name, media in (("studio.js", "text/javascript"), ("studio.css", "text/css")):
        served = client.get(f"/static/{name}")
        assert served.status_code == 200 and served.headers["content-type"].startswith(media)
    assert client.get("/static/nope.js").status_code == 401  # not a page file: the API's rules
    assert (
        client.get("/static/nope.js", headers={"Authorization": "Bearer s3cret"}).status_code == 404
    )
    assert client.get("/static/..%2Fapp.py").status_code in (401, 404)  # never the file
    assert client.get("/api/training/datasets").status_code == 401
    assert client.get("/api/training/previews/abc/base").status_code == 401


def test_static_files_ship_in_the_package_and_load_nothing_from_outside():
    for name in page.STATIC_FILES:
        text = page.read_static(name).decode().replace(SVG_NAMESPACE, "")
        assert text.strip()
        # no absolute URL to another origin in src/href/url()/import/fetch
        assert not re.search(r"(src|href)=[\"']?(https?:)?//", text), name
        assert not re.search(r"url\(\s*[\"']?(https?:)?//|@import|https?://", text), name
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["hotstep_ray"]
    assert "studio/static/*" in patterns


def test_preview_routes_answer_404_for_unknown_previews(client):
    assert client.get("/api/training/previews").json() == {"previews": []}
    assert client.get("/api/training/previews/0123abcd/base").status_code == 404
    assert client.get("/api/training/previews/0123abcd/nope").status_code == 404
    assert client.get("/api/training/previews/..%2F..%2Fetc/base").status_code == 404
