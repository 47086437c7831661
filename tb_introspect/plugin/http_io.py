"""JSON encoding, responses and query-parameter checks for the plugin's routes."""

from __future__ import annotations

import functools
import gzip
import json
from collections.abc import Callable
from typing import Any

from tensorboard import errors as tb_errors
from tensorboard.backend import http_util
from werkzeug import wrappers

# One NaN -> null conversion for the routes, the findings and the CLI.
from tb_introspect.read.json_values import int_list as int_list
from tb_introspect.read.json_values import num_list as num_list

JSON = "application/json"


class RequestError(Exception):
    """Bad input from the client; answered with ``status`` and a JSON message."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def not_found(message: str) -> RequestError:
    """A 404 error for an unknown run, tag or file."""
    return RequestError(message, 404)


def encode(obj: Any) -> bytes:
    """Compact JSON bytes; refuses NaN so that a missed conversion fails loudly in tests."""
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode("utf-8")


def gzip_bytes(data: bytes) -> bytes:
    """Gzip as TensorBoard's ``Respond`` does (level 3, fixed mtime) for cached bodies."""
    return gzip.compress(data, compresslevel=3, mtime=0)


def json_response(request: wrappers.Request, obj: Any, status: int = 200) -> wrappers.Response:
    """JSON response, gzip-compressed when the client accepts it."""
    return http_util.Respond(request, encode(obj), JSON, code=status)


def gzipped_json_response(request: wrappers.Request, body_gz: bytes) -> wrappers.Response:
    """A cached gzip body; ``Respond`` inflates it for clients without gzip."""
    return http_util.Respond(request, body_gz, JSON, content_encoding="gzip")


def file_response(request: wrappers.Request, body: bytes, mime: str,
                  filename: str) -> wrappers.Response:
    """A download: ``body`` as the attachment ``filename`` (gzip-compressed in transit)."""
    response = http_util.Respond(request, body, mime)
    response.headers["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


def error_response(request: wrappers.Request, error: RequestError) -> wrappers.Response:
    """``{"error": message}`` with the error's status."""
    return json_response(request, {"error": str(error)}, status=error.status)


def required(request: wrappers.Request, name: str) -> str:
    """The single value of query parameter ``name``; 400 when missing or empty."""
    values = request.args.getlist(name)
    if not values or values[0] == "":
        raise RequestError(f"missing query parameter {name!r}")
    if len(values) > 1:
        raise RequestError(f"query parameter {name!r} given {len(values)} times; expected once")
    return values[0]


def repeated(request: wrappers.Request, name: str, *, required_: bool = False) -> list[str]:
    """All values of a repeatable query parameter, in order, without duplicates."""
    values = list(dict.fromkeys(v for v in request.args.getlist(name) if v != ""))
    if required_ and not values:
        raise RequestError(f"missing query parameter {name!r}")
    return values


#: Values of integer parameters above this are read as this: they all mean
#: "every point", and larger ones overflow the Rust data server's int64 fields
#: (a 500 before this cap).
MAX_INT_PARAM = 1_000_000_000


def non_negative_int(request: wrappers.Request, name: str, default: int) -> int:
    """An optional non-negative integer parameter, at most ``MAX_INT_PARAM``; 400 if malformed."""
    text = request.args.get(name)
    if text is None or text == "":
        return default
    try:
        value = int(text)
    except ValueError:
        raise RequestError(f"query parameter {name!r} must be an integer, got {text!r}") from None
    if value < 0:
        raise RequestError(f"query parameter {name!r} must be >= 0, got {value}")
    return min(value, MAX_INT_PARAM)


def route(method: Callable[..., Any]) -> Callable[..., Any]:
    """Turns a route method into a WSGI app that answers bad input with 4xx JSON."""

    @functools.wraps(method)
    def app(self: Any, environ, start_response):
        request = wrappers.Request(environ)
        try:
            response = method(self, request)
        except RequestError as e:
            response = error_response(request, e)
        except tb_errors.PublicError as e:  # e.g. an unknown experiment
            response = error_response(request, RequestError(str(e), e.http_code))
        return response(environ, start_response)

    return app
