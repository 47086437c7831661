"""Helpers of the fault, security and load tests .

- An independent reader of event files at the byte level (TFRecord framing
  with CRC checks, written from the format, sharing no code with TensorBoard's
  loaders or the plugin), so a test can say exactly which points a damaged
  file still holds.
- Real ``tensorboard`` processes under both loaders (``--load_fast=false`` and
  ``true``), started without TensorFlow as on a viewing server (reuses
  ``browser_support.tensorboard``).
- Raw HTTP requests whose request line is sent byte for byte (no client-side
  normalisation of ``..``, ``%2e`` or backslashes).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import socket
import struct
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
from tensorboard.util import tensor_util

from tb_introspect import metadata
from tests.browser.browser_support import tensorboard as _tensorboard

LOADERS = ("false", "true")  # --load_fast values: Python loader, Rust data server


# -- event files at the byte level ---------------------------------------------------


@dataclass
class Record:
    """One TFRecord: its byte range and payload (``None`` when a CRC does not match)."""

    start: int
    end: int
    payload: bytes | None


def scan_records(data: bytes) -> tuple[list[Record], int]:
    """Split ``data`` into TFRecords; returns (records, offset where parsing stopped).

    Parsing stops at the first incomplete record or bad length CRC (a reader
    cannot know where the next record starts after that). A record whose data
    CRC is wrong is returned with ``payload=None`` and parsing goes on.
    """
    records, pos = [], 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        (length_crc,) = struct.unpack_from("<I", data, pos + 8)
        if masked_crc32c(data[pos:pos + 8]) != length_crc:
            break
        end = pos + 12 + length + 4
        if end > len(data):
            break
        payload = data[pos + 12:pos + 12 + length]
        (data_crc,) = struct.unpack_from("<I", data, pos + 12 + length)
        records.append(Record(pos, end, payload if masked_crc32c(payload) == data_crc else None))
        pos = end
    return records, pos


def points_in_bytes(data: bytes) -> dict[str, dict[int, np.ndarray]]:
    """``{tag: {step: vector}}`` of the tb-introspect values in intact records of ``data``.

    Records are read in order up to the first one a reader cannot get past
    (incomplete, or a CRC mismatch): that is all a sequential reader can trust.
    """
    out: dict[str, dict[int, np.ndarray]] = {}
    records, _ = scan_records(data)
    for rec in records:
        if rec.payload is None:
            break
        event = event_pb2.Event.FromString(rec.payload)
        for value in event.summary.value:
            if value.tag.startswith(metadata.TAG_PREFIX):
                vec = tensor_util.make_ndarray(value.tensor).reshape(-1)
                out.setdefault(value.tag, {})[int(event.step)] = vec
    return out


def points_in_dir(run_dir: str | os.PathLike) -> dict[str, dict[int, np.ndarray]]:
    """:func:`points_in_bytes` over every event file of a run directory (name order)."""
    out: dict[str, dict[int, np.ndarray]] = {}
    for name in sorted(os.listdir(run_dir)):
        if "tfevents" in name:
            for tag, pts in points_in_bytes(Path(run_dir, name).read_bytes()).items():
                out.setdefault(tag, {}).update(pts)
    return out


def event_file(run_dir: str | os.PathLike) -> Path:
    """The single event file of a run directory."""
    files = [p for p in Path(run_dir).iterdir() if "tfevents" in p.name]
    assert len(files) == 1, files
    return files[0]


# -- real TensorBoard ------------------------------------------------------------------


@contextlib.contextmanager
def serve(logdir: Path, load_fast: str, wait_runs: int = 1, extra: tuple[str, ...] = ()
          ) -> Iterator:
    """A real ``tensorboard`` (no TensorFlow) with the given loader serving ``logdir``."""
    with _tensorboard(Path(logdir), wait_runs=wait_runs,
                      extra_args=(f"--load_fast={load_fast}", *extra)) as tb:
        yield tb


def http_get(url: str, timeout: float = 60.0) -> tuple[int, dict, bytes]:
    """GET ``url`` (path sent as given): (status, lower-cased headers, inflated body)."""
    u = urllib.parse.urlsplit(url)
    target = u.path + (f"?{u.query}" if u.query else "")
    return raw_request(u.hostname, u.port, target.encode("latin-1"), timeout=timeout)


def raw_request(host: str, port: int, target: bytes, timeout: float = 60.0,
                accept_gzip: bool = True) -> tuple[int, dict, bytes]:
    """Send ``GET <target> HTTP/1.1`` byte for byte; (status, headers, body)."""
    request = (b"GET " + target + b" HTTP/1.1\r\nHost: " + f"{host}:{port}".encode()
               + b"\r\nConnection: close\r\n"
               + (b"Accept-Encoding: gzip\r\n" if accept_gzip else b"") + b"\r\n")
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(request)
        chunks = []
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    raw = b"".join(chunks)
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    if headers.get("transfer-encoding") == "chunked":
        body = _dechunk(body)
    if headers.get("content-encoding") == "gzip":
        body = gzip.decompress(body)
    return status, headers, body


def _dechunk(body: bytes) -> bytes:
    out, pos = [], 0
    while True:
        line_end = body.index(b"\r\n", pos)
        size = int(body[pos:line_end].split(b";")[0], 16)
        if size == 0:
            return b"".join(out)
        out.append(body[line_end + 2:line_end + 2 + size])
        pos = line_end + 2 + size + 2


def q(value: str) -> str:
    """URL-encode a query value (run and tag names hold '/', '<', '&', ...)."""
    return urllib.parse.quote(value, safe="")


def get(tb, route: str) -> tuple[int, object]:
    """GET a plugin route of ``tb``: (status, parsed JSON or the raw body)."""
    status, headers, body = http_get(tb.plugin_url(route))
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body


def served_points(tb, run: str) -> dict[str, dict[int, dict[str, float]]]:
    """Every point the plugin serves for ``run``: ``{tag: {step: {field: value}}}``."""
    status, doc = get(tb, f"run?run={q(run)}")
    assert status == 200, (status, doc)
    tags = [t["tag"] for view in doc["views"].values() for t in view]
    tags += [t for m in doc["metrics"] for t in (m["tag"], m["epoch_tag"]) if t]
    if not tags:
        return {}
    route = f"series?run={q(run)}" + "".join(f"&tag={q(t)}" for t in tags)
    status, doc = get(tb, route)
    assert status == 200, (status, doc)
    out = {}
    for tag, s in doc["series"].items():
        out[tag] = {
            step: {f: vals[i] for f, vals in s["values"].items()}
            for i, step in enumerate(s["steps"])
        }
    return out
