"""The one place events are written: an event file of a run directory, without TensorFlow.

Every writer of the package (the Keras callback, both ``Introspector`` classes,
``NumpyWriter``) writes through an ``EventSink``. TensorBoard's own ``EventFileWriter``
reaches for ``tf.io.gfile`` whenever TensorFlow is installed, and its record writer
computes the records' CRC-32C in pure Python; ``google-crc32c`` computes it in C.

A log directory is a local path, or a URL of one of TensorFlow's file systems (``gs://``)
where TensorFlow is installed, as the Keras callback has always written; a URL is never
taken for a local folder.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import google_crc32c
from tensorboard.compat.proto import event_pb2, summary_pb2

_uid_lock = threading.Lock()
_uid = 0


def _next_uid() -> int:
    global _uid
    with _uid_lock:
        _uid += 1
        return _uid


def _masked_crc(data: bytes) -> bytes:
    """TFRecord's masked CRC-32C of ``data``."""
    crc = google_crc32c.value(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


def record(data: bytes) -> bytes:
    """``data`` framed as one TFRecord: length, its CRC, the data, its CRC."""
    header = struct.pack("<Q", len(data))
    return header + _masked_crc(header) + data + _masked_crc(data)


class EventSink:
    """Writes ``Event`` records to a new ``events.out.tfevents.*`` file in ``log_dir``.

    Thread-safe. Writes are buffered in the process; ``flush()`` hands them to the file
    system, after which TensorBoard's live reload sees them.

    Example:
        >>> import tempfile
        >>> from tb_introspect import summary_pb
        >>> with EventSink(tempfile.mkdtemp()) as sink:
        ...     sink.write(1, [summary_pb.metric_pb("loss", 0.5)])
    """

    def __init__(self, log_dir: str | os.PathLike, filename_suffix: str = "") -> None:
        self.log_dir = os.fspath(log_dir)
        name = (f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}"
                f".{os.getpid()}.{_next_uid()}{filename_suffix}")
        self.path, self._file = _create(self.log_dir, name)
        self._closed = False
        self._lock = threading.Lock()
        # An unclosed sink (a callback never closed) closes its file when collected: what
        # was written is flushed, without a ResourceWarning.
        weakref.finalize(self, self._file.close)
        self.add_event(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))
        self.flush()

    @property
    def closed(self) -> bool:
        # At interpreter exit the finalizer may have closed the file before a callback's
        # own exit hook flushes it: closed either way.
        return self._closed or bool(getattr(self._file, "closed", False))

    def add_event(self, event: event_pb2.Event) -> None:
        """Write one event (raises ``ValueError`` once closed, ``OSError`` from the file)."""
        self.add_records([event.SerializeToString()])

    def add_records(self, records: Iterable[bytes]) -> None:
        data = b"".join(record(r) for r in records)
        with self._lock:
            if self.closed:
                raise ValueError(f"the event file in {self.log_dir!r} is closed")
            self._file.write(data)

    def write(self, step: int, summaries: Sequence[summary_pb2.Summary],
              wall_time: float | None = None) -> None:
        """One event at ``step`` holding every value of ``summaries`` (none: nothing)."""
        self.write_steps([(step, summaries)], wall_time)

    def write_steps(self, batches: Iterable[tuple[int, Sequence[summary_pb2.Summary]]],
                    wall_time: float | None = None) -> None:
        """One event per ``(step, summaries)`` with any summary, all in one file write."""
        now = time.time() if wall_time is None else wall_time
        events = []
        for step, summaries in batches:
            if not summaries:
                continue
            merged = summary_pb2.Summary(value=[v for s in summaries for v in s.value])
            events.append(event_pb2.Event(wall_time=now, step=int(step), summary=merged)
                          .SerializeToString())
        if events:
            self.add_records(events)

    def flush(self) -> None:
        with self._lock:
            if not self.closed:
                self._file.flush()

    def close(self) -> None:
        """Flush and close (closed even when the flush fails)."""
        with self._lock:
            if self.closed:
                return
            self._closed = True
            try:
                self._file.flush()
            finally:
                self._file.close()

    def __enter__(self) -> EventSink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _create(log_dir: str, name: str) -> tuple[str, Any]:
    """The new event file's path and its binary file object."""
    if "://" not in log_dir:
        os.makedirs(log_dir, exist_ok=True)
        path = os.path.join(log_dir, name)
        return path, open(path, "wb")  # noqa: SIM115 - closed by the sink
    try:  # only TensorFlow's file systems are known to take a URL here
        import tensorflow as tf
    except ImportError as e:
        raise ValueError(f"log_dir {log_dir!r}: writing to a URL needs TensorFlow's file"
                         " systems (gs://); write to a local directory instead") from e
    tf.io.gfile.makedirs(log_dir)
    path = log_dir.rstrip("/") + "/" + name
    return path, tf.io.gfile.GFile(path, "wb")
