"""A real S3-compatible server on 127.0.0.1 (moto's server mode) for the bucket tests, a TCP
relay to it that a test can cut, and a reader of the event records of the objects under a
prefix, by their own framing."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from tensorboard.compat.proto import event_pb2

#: Fake credentials: moto accepts any; boto3 and TensorBoard's reader need some.
ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
       "AWS_DEFAULT_REGION": "us-east-1"}


@dataclass
class S3:
    endpoint: str
    server: object

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint)


@contextlib.contextmanager
def s3_server() -> Iterator[S3]:
    """An S3 server on a free port of 127.0.0.1, with ``S3_ENDPOINT`` and fake credentials
    set in ``os.environ`` (what the writers and a TensorBoard started meanwhile read)."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    s3 = S3(f"http://{host}:{port}", server)
    saved = {k: os.environ.get(k) for k in (*ENV, "S3_ENDPOINT")}
    os.environ.update(ENV, S3_ENDPOINT=s3.endpoint)
    try:
        yield s3
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        with contextlib.suppress(Exception):  # a fault test may have stopped it already
            server.stop()


def keys(client, bucket: str, prefix: str) -> list[str]:
    """The object keys under ``prefix``, in name order."""
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def records(data: bytes) -> Iterator[bytes]:
    """The data of each TFRecord in ``data`` (length, its CRC, data, its CRC)."""
    i = 0
    while i < len(data):
        (n,) = struct.unpack("<Q", data[i:i + 8])
        yield data[i + 12:i + 12 + n]
        i += 12 + n + 4


def events(client, bucket: str, prefix: str) -> list[event_pb2.Event]:
    """Every event of the event files under ``prefix``, files in name order."""
    out = []
    for key in keys(client, bucket, prefix):
        if "tfevents" in key.rsplit("/", 1)[-1]:
            body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
            out += [event_pb2.Event.FromString(r) for r in records(body)]
    return out


def point_steps(evs: list[event_pb2.Event], view: str = "gradient") -> list[int]:
    """The steps of the events holding a logged point (a tensor of ``view``)."""
    prefix = f"introspect/{view}/"
    return [e.step for e in evs if any(v.tag.startswith(prefix) for v in e.summary.value)]


class Relay:
    """A TCP relay to the S3 server on another port of 127.0.0.1. ``cut()`` is the network
    going down: the port stops accepting and every open connection is dropped (stopping
    moto's server would leave its keep-alive connections served)."""

    def __init__(self, endpoint: str) -> None:
        self.target = int(endpoint.rsplit(":", 1)[1])
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        self.down = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            with self.lock:
                if self.down:
                    client.close()
                    server.close()
                    return
                self.sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        with self.lock:
            self.down = True
            for s in (self.listener, *self.sockets):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
