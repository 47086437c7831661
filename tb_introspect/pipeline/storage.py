"""Where a URL log directory's event files go: whole objects put into a bucket.

An object store has no append: TensorBoard's stub S3 file system re-uploads the whole file
on every flush, and an fsspec file is invisible until closed. So a URL run is written as a
sequence of complete objects (``sink.EventSink`` rolls), each put once, and this module
only puts them. Which client puts them, as TensorBoard reads them without TensorFlow:

- ``s3://bucket/prefix``: boto3, with the endpoint of ``S3_ENDPOINT`` (TensorBoard's reader
  reads the same variable) or boto3's own ``AWS_ENDPOINT_URL``;
- any other scheme fsspec knows (``gs://`` through gcsfs, ``file://``, ...): fsspec;
- a scheme fsspec does not know but TensorFlow's file systems do (``ram://``), when
  TensorFlow is imported.

A scheme whose package is missing is refused when the store is opened, naming the extra to
install; nothing is ever written to a local folder named after a URL.
"""

from __future__ import annotations

import os
import sys
import uuid
from typing import Any, Protocol

#: The package extra that brings each scheme's client.
EXTRAS = {"s3": "s3", "gs": "gcs", "gcs": "gcs"}


def is_url(log_dir: str) -> bool:
    """Whether ``log_dir`` names a file system by scheme (``s3://``, ``gs://``...)."""
    return "://" in log_dir


class Store(Protocol):
    """A URL directory that takes whole objects."""

    url: str

    def put(self, name: str, data: bytes) -> None:
        """Write object ``name`` (a file name, no slash) holding ``data``."""

    def delete(self, name: str) -> None:
        """Remove object ``name``."""


def open_store(url: str) -> Store:
    """The store of ``url``, or a ``ValueError`` naming the package to install.

    Example:
        >>> store = open_store("memory://runs/demo")
        >>> store.put("events.out.tfevents.1", b"")
    """
    scheme, _, rest = url.partition("://")
    if not scheme or not rest.strip("/"):
        raise ValueError(f"log_dir {url!r} is not a URL of a directory")
    if scheme == "s3":
        return S3Store(url)
    try:
        import fsspec
    except ImportError as e:  # no fsspec at all: TensorFlow's file systems, or nothing
        fsspec, missing = None, e
    try:
        if fsspec is None:
            raise missing
        fs, root = fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as e:
        # A scheme fsspec does not know at all may be one of TensorFlow's; one it knows
        # whose package is missing (gs:// without gcsfs) is the user's to install, fsspec
        # itself missing or not.
        unknown_to_fsspec = (scheme not in EXTRAS if fsspec is None
                             else not isinstance(e, ImportError))
        if unknown_to_fsspec and _tensorflow_knows(scheme):
            return GfileStore(url)
        extra = EXTRAS.get(scheme)
        hint = (f"pip install 'tb-introspect[{extra}]'" if extra
                else f"install fsspec and its {scheme}:// implementation")
        raise ValueError(f"log_dir {url!r}: no file system for {scheme}:// is installed"
                         f" ({hint}): {e}") from e
    return FsspecStore(url, fs, root)


def probe(url: str) -> None:
    """Prove ``url`` takes objects: one probe object put and removed (``OSError`` if not)."""
    store = open_store(url)
    name = f".tb_introspect_probe_{uuid.uuid4().hex}"
    store.put(name, b"ok")
    try:
        store.delete(name)
    except Exception:
        pass  # write-only credentials: the probe object stays, TensorBoard skips it


class S3Store:
    """``s3://bucket/prefix`` through boto3."""

    def __init__(self, url: str) -> None:
        try:
            import boto3
            from botocore.config import Config
        except ImportError as e:
            raise ValueError(f"log_dir {url!r}: writing s3:// needs boto3"
                             " (pip install 'tb-introspect[s3]')") from e
        self.url = url.rstrip("/")
        bucket, _, prefix = self.url[len("s3://"):].partition("/")
        if not bucket:
            raise ValueError(f"log_dir {url!r} names no bucket")
        self.bucket, self.prefix = bucket, prefix
        # Few, short retries: a failed upload costs training time (the sink uploads from a
        # thread, but closing waits for it) and is reported, not retried forever.
        config = Config(connect_timeout=5, read_timeout=30,
                        retries={"max_attempts": 2, "mode": "standard"})
        endpoint = os.environ.get("S3_ENDPOINT") or None
        if endpoint is not None and "://" not in endpoint:
            # TensorFlow's old S3 file system took a bare host; boto3 and TensorBoard's reader
            # take the URL as it is.
            raise ValueError(f"S3_ENDPOINT={endpoint!r} must be a URL such as"
                             " http://127.0.0.1:9000")
        self.client = boto3.client("s3", endpoint_url=endpoint, config=config)

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def put(self, name: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self._key(name), Body=data)

    def delete(self, name: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(name))


class FsspecStore:
    """Any fsspec URL (``gs://`` through gcsfs, ``file://``...)."""

    def __init__(self, url: str, fs: Any, root: str) -> None:
        self.url, self.fs, self.root = url.rstrip("/"), fs, root.rstrip("/")
        if "file" in _protocols(fs):
            fs.makedirs(self.root, exist_ok=True)  # a local directory must exist

    def put(self, name: str, data: bytes) -> None:
        self.fs.pipe_file(f"{self.root}/{name}", data)

    def delete(self, name: str) -> None:
        self.fs.rm_file(f"{self.root}/{name}")


class GfileStore:
    """A scheme of TensorFlow's own file systems, where TensorFlow is already imported."""

    def __init__(self, url: str) -> None:
        import tensorflow as tf

        self.url, self.gfile = url.rstrip("/"), tf.io.gfile
        self.gfile.makedirs(self.url)

    def put(self, name: str, data: bytes) -> None:
        with self.gfile.GFile(f"{self.url}/{name}", "wb") as f:
            f.write(data)

    def delete(self, name: str) -> None:
        self.gfile.remove(f"{self.url}/{name}")


def _protocols(fs: Any) -> tuple[str, ...]:
    p = fs.protocol
    return (p,) if isinstance(p, str) else tuple(p)


def _tensorflow_knows(scheme: str) -> bool:
    """Whether an imported TensorFlow has a file system for ``scheme`` (never imports it:
    a Keras user's process has it, a viewing server's or a PyTorch user's need not)."""
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return False
    try:
        return scheme in tf.io.gfile.get_registered_schemes()
    except Exception:
        return False
