"""The dashboard's static files at /ui, and GET / for browsers.

The page is four fixed files shipped in the package (no build step, nothing fetched from
elsewhere); it reads everything through the JSON admin API with the operator's token, so it
holds no secret itself. The file list is fixed: no path is ever built from a request.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from aiohttp import web

FILES = {  # URL name → (package file, content type)
    "": ("index.html", "text/html"),
    "app.js": ("app.js", "text/javascript"),
    "add.js": ("add.js", "text/javascript"),
    "app.css": ("app.css", "text/css"),
}
# Only our own files and same-origin fetches; no inline script, no framing by another page.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}


@cache
def _read(name: str) -> bytes:
    return (resources.files("mlxd.supervisor.ui") / "static" / name).read_bytes()


def page_response(name: str = "") -> web.Response:
    """One of the dashboard's files, with the CSP and no-sniff headers."""
    filename, content_type = FILES[name]
    return web.Response(
        body=_read(filename), content_type=content_type, charset="utf-8", headers=HEADERS
    )


def wants_html(accept: str) -> bool:
    """Whether an Accept header prefers a page (browsers) over plain text (Ollama probes).

    text/html must be listed with a quality above 0 and at least that of text/plain and */*.
    """
    q: dict[str, float] = {}
    for part in accept.split(","):
        mime, *params = (p.strip() for p in part.split(";"))
        weight = 1.0
        for p in params:
            key, _, value = p.partition("=")
            if key.strip().lower() == "q":
                try:
                    weight = float(value)
                except ValueError:
                    weight = 0.0
        q[mime.lower()] = max(weight, q.get(mime.lower(), 0.0))
    html = q.get("text/html", 0.0)
    return html > 0 and html >= max(q.get("text/plain", 0.0), q.get("*/*", 0.0))


def _handler(name: str):
    async def handler(request: web.Request) -> web.Response:
        return page_response(name)

    return handler


def add_ui_routes(app: web.Application) -> None:
    """GET /ui, /ui/ and the page's scripts and styles; anything else under /ui is a 404."""
    app.router.add_get("/ui", _handler(""))
    app.router.add_get("/ui/", _handler(""))
    for name in FILES:
        if name:
            app.router.add_get(f"/ui/{name}", _handler(name))
