"""Serving the built frontend (``tb_introspect/static/``) safely."""

from __future__ import annotations

import mimetypes
import os

from tensorboard.backend import http_util
from werkzeug import wrappers

from tb_introspect.plugin.http_io import RequestError, not_found

STATIC_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "static")

#: Served as ``/index.js`` when the frontend bundle was not built, so the tab
#: explains what is missing instead of failing to load a module.
FALLBACK_MODULE = b"""export async function render() {
  const p = document.createElement("p");
  p.textContent = "tb-introspect: the frontend bundle is missing (tb_introspect/static/index.js)."
    + " Build it with `make frontend` (needs Node.js) or install a released wheel.";
  document.body.appendChild(p);
}
"""

_TYPES = {
    ".js": "text/javascript",
    ".mjs": "text/javascript",
    ".css": "text/css",
    ".json": "application/json",
    ".map": "application/json",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".woff2": "font/woff2",
    ".html": "text/html",
}


def resolve(relative: str, root: str = STATIC_DIR) -> str:
    """The real path of ``relative`` inside ``root``; 404 for anything outside it."""
    if not relative or "\x00" in relative or relative.startswith(("/", "\\")):
        raise not_found(f"no static file {relative!r}")
    parts = relative.replace("\\", "/").split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise not_found(f"no static file {relative!r}")
    real_root = os.path.realpath(root)
    path = os.path.realpath(os.path.join(real_root, *parts))
    # realpath also resolves symlinks pointing out of the folder.
    if os.path.commonpath([real_root, path]) != real_root or not os.path.isfile(path):
        raise not_found(f"no static file {relative!r}")
    return path


def respond_file(request: wrappers.Request, relative: str, root: str = STATIC_DIR):
    """A ``Respond`` of the file ``relative`` under ``root`` with its content type."""
    path = resolve(relative, root)
    ext = os.path.splitext(path)[1].lower()
    content_type = _TYPES.get(ext) or mimetypes.guess_type(path)[0] or "application/octet-stream"
    with open(path, "rb") as f:
        body = f.read()
    return http_util.Respond(request, body, content_type)


def respond_index(request: wrappers.Request, root: str = STATIC_DIR):
    """The frontend's ES module, or a stub that says the bundle is missing."""
    try:
        return respond_file(request, "index.js", root)
    except RequestError:
        return http_util.Respond(request, FALLBACK_MODULE, "text/javascript")
