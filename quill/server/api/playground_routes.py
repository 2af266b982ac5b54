"""The playground: GET /playground serves a static page (HTML, CSS and JavaScript shipped in
quill/server/api/playground/) that calls the public API from the browser, and GET / points at it.

The page holds no secret and a browser cannot attach a bearer token to a page load, so these GETs
stay open when the server requires an API key (see guards.py); the page sends the key the user
types with each API call it makes. POST / is TGI's route and is untouched.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response

from .errors import APIError

router = APIRouter()

PAGE = "index.html"
ASSETS = {  # every file the page loads; nothing else under /playground/ is served
    "playground.css": "text/css; charset=utf-8",
    "playground.js": "text/javascript; charset=utf-8",
    "api.js": "text/javascript; charset=utf-8",
    "seq2seq.js": "text/javascript; charset=utf-8",
}
# The page loads and calls nothing but this server; the policy makes the browser hold it to that.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",  # revalidate, so an upgraded server never runs an old script
}
INDEX_LINKS = {"playground": "playground", "docs": "docs", "openapi": "openapi.json", "models": "v1/models",
               "health": "health", "ready": "ready", "metrics": "metrics"}


def _file(name: str) -> bytes:
    return resources.files(__package__).joinpath("playground", name).read_bytes()


@router.api_route("/playground", methods=["GET", "HEAD"], include_in_schema=False)
async def playground_page():
    return Response(_file(PAGE), media_type="text/html; charset=utf-8", headers=PAGE_HEADERS)


@router.api_route("/playground/{name}", methods=["GET", "HEAD"], include_in_schema=False)
async def playground_asset(name: str):
    media_type = ASSETS.get(name)
    if media_type is None:
        raise APIError(404, f"no such playground file: {name}", reason="not_found")
    return Response(_file(name), media_type=media_type, headers=PAGE_HEADERS)


@router.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
async def index(http: Request):
    """Where to go from here: a short page for a browser, the same links as JSON for anything else.
    The links are relative, so they hold behind a proxy that serves Quill under a path prefix."""
    if "text/html" not in http.headers.get("accept", ""):
        return {"name": "quill", "links": INDEX_LINKS}
    items = "".join(f'<li><a href="{href}">{label}</a></li>' for label, href in INDEX_LINKS.items())
    html = ("<!doctype html><html lang=\"en\"><meta charset=\"utf-8\"><title>Quill</title>"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<h1>Quill</h1><p>Try the models in the <a href=\"playground\">playground</a>.</p><ul>{items}</ul>")
    return HTMLResponse(html, headers=PAGE_HEADERS)
