"""The one place events are written: an event file of a run directory, without TensorFlow.

Every writer of the package (the Keras callback, both ``Introspector`` classes,
``NumpyWriter``) writes through an ``EventSink``. TensorBoard's own ``EventFileWriter``
reaches for ``tf.io.gfile`` whenever TensorFlow is installed, and its record writer
computes the records' CRC-32C in pure Python; ``google-crc32c`` computes it in C.

A local log directory gets one file, appended to. A URL (``s3://``, ``gs://``, any fsspec or,
with TensorFlow imported, any ``tf.io.gfile`` scheme: ``storage.py``) has no append: the sink
rolls, each flush with new records putting one new, complete object whose name sorts after
the previous ones (TensorBoard reads a run's files in name order), at most one per
``upload_secs``, from a thread; nothing is uploaded twice. A URL is never taken for a local
folder.
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

from tb_introspect.pipeline import storage
from tb_introspect.pipeline.worker import Job, WorkerThread

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


#: The default flush interval of a local event file (TensorBoard's live view).
LOCAL_FLUSH_SECS = 5.0
#: The default least time between a bucket run's objects. Each one is a request, and a
#: TensorBoard starting on the run reads them one by one (about half a second each):
#: 60 an hour, where 5 s would make 720.
BUCKET_UPLOAD_SECS = 60.0


class EventSink:
    """Writes ``Event`` records to a new ``events.out.tfevents.*`` file in ``log_dir`` (a
    URL: a sequence of such objects, put at most one per ``upload_secs``, by default
    ``BUCKET_UPLOAD_SECS``).

    Thread-safe. Writes are buffered in the process; ``flush()`` hands them to the file
    system, after which TensorBoard's live reload sees them.

    Example:
        >>> import tempfile
        >>> from tb_introspect import summary_pb
        >>> with EventSink(tempfile.mkdtemp()) as sink:
        ...     sink.write(1, [summary_pb.metric_pb("loss", 0.5)])
    """

    def __init__(self, log_dir: str | os.PathLike, filename_suffix: str = "", *,
                 upload_secs: float | None = None) -> None:
        self.log_dir = os.fspath(log_dir)
        # Zero-padded: TensorBoard reads a run's files in name order and skips one that
        # appears after a later-sorting file ("…7" before "…10" would be).
        host_part = f"{socket.gethostname()}.{os.getpid()}.{_next_uid():06d}"
        header = event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2")
        self._closed = False
        self._lock = threading.Lock()
        self._roller: Roller | None = None
        if storage.is_url(self.log_dir):
            self._roller = Roller(storage.open_store(self.log_dir), host_part, filename_suffix,
                                  record(header.SerializeToString()),
                                  BUCKET_UPLOAD_SECS if upload_secs is None else upload_secs)
            self.path, self._file = self._roller.path, self._roller
            weakref.finalize(self, self._roller.close, quiet=True)
            return
        name = f"events.out.tfevents.{int(time.time()):010d}.{host_part}{filename_suffix}"
        self.path, self._file = _create(self.log_dir, name)
        # An unclosed sink (a callback never closed) closes its file when collected: what
        # was written is flushed, without a ResourceWarning.
        weakref.finalize(self, self._file.close)
        self.add_event(header)
        self.flush()

    @property
    def closed(self) -> bool:
        # At interpreter exit the finalizer may have closed the file before a callback's
        # own exit hook flushes it: closed either way.
        return self._closed or bool(getattr(self._file, "closed", False))

    def add_event(self, event: event_pb2.Event) -> None:
        """Write one event (raises ``ValueError`` once closed, ``OSError`` from the file)."""
        self.add_records([event.SerializeToString()], (event.step,))

    def add_records(self, records: Iterable[bytes], steps: Sequence[int] = ()) -> None:
        """Write serialized events (``steps``: theirs, counted if a URL upload fails)."""
        data = b"".join(record(r) for r in records)
        with self._lock:
            if self.closed:
                raise ValueError(f"the event file in {self.log_dir!r} is closed")
            if self._roller is not None:
                self._roller.write(data, steps)
            else:
                self._file.write(data)

    def write(self, step: int, summaries: Sequence[summary_pb2.Summary],
              wall_time: float | None = None) -> None:
        """One event at ``step`` holding every value of ``summaries`` (none: nothing)."""
        self.write_steps([(step, summaries)], wall_time)

    def write_steps(self, batches: Iterable[tuple[int, Sequence[summary_pb2.Summary]]],
                    wall_time: float | None = None) -> None:
        """One event per ``(step, summaries)`` with any summary, all in one file write."""
        now = time.time() if wall_time is None else wall_time
        events, steps = [], []
        for step, summaries in batches:
            if not summaries:
                continue
            merged = summary_pb2.Summary(value=[v for s in summaries for v in s.value])
            events.append(event_pb2.Event(wall_time=now, step=int(step), summary=merged)
                          .SerializeToString())
            steps.append(int(step))
        if events:
            self.add_records(events, steps)

    def flush(self, now: bool = False) -> None:
        """Hand what was written to the file system (a URL: uploaded within
        ``upload_secs``, by a thread, or before returning with ``now``, as at the end of
        training; a failed upload raises here, ``WriteFailed``)."""
        with self._lock:
            if self.closed:
                return
            if self._roller is not None:
                self._roller.flush(now)
            else:
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
    """The new local event file's path and its binary file object."""
    os.makedirs(log_dir, exist_ok=True)
    path = os.path.join(log_dir, name)
    return path, open(path, "wb")  # noqa: SIM115 - closed by the sink


class WriteFailed(OSError):
    """An upload to a URL log directory failed; says how many steps' values were lost."""


class Roller:
    """A URL log directory's event file as a sequence of objects, each put once.

    The first object (the file-version record alone) is put at construction, so a bucket
    that cannot be written is refused then. Each later ``flush`` with new records has a
    thread put one object of them, at most one per ``every`` seconds (records written
    meanwhile join it); ``close`` puts the rest and waits. Every object starts with the
    file-version record: each is an event file of its own.
    """

    def __init__(self, store: storage.Store, host_part: str, suffix: str, header: bytes,
                 every: float) -> None:
        self.store, self.host_part, self.suffix = store, host_part, suffix
        self.header, self.every = header, float(every)
        self.closed = False
        self.objects = 0  # objects put
        self.bytes = 0  # bytes put
        self._cond = threading.Condition()
        self._buf: list[bytes] = []
        self._steps: list[int] = []
        self._due = False  # a flush asked for the buffer to go up
        self._now = False  # ... without waiting for the interval
        self._busy = False  # the thread is putting what it took
        self._closing = False
        self._error: BaseException | None = None
        self._lost: set[int] = set()  # steps whose values were not written
        self._seq = 0
        self._time = 0
        self._last_put = -float("inf")
        # Woken by a flush and by the interval's clock, never idle: it ends when the sink
        # closes (close puts the rest itself) or an upload failed.
        self._worker = WorkerThread("tb_introspect-upload", self._cond, self._take_due,
                                    stop=lambda: self._closing or self._error is not None,
                                    due_in=self._due_in, idles=False)
        try:
            self.path = self._put(b"")
        except Exception as e:
            raise OSError(f"tb_introspect: log_dir {store.url!r} is not writable:"
                          f" {type(e).__name__}: {e}") from e

    def _put(self, data: bytes) -> str:
        """Put one object after every earlier one in name order; its URL."""
        # The wall clock orders the objects of every writer of the run directory; never
        # backwards within one writer, the sequence number orders one writer's objects.
        self._time = max(self._time, int(time.time()))
        self._seq += 1
        name = (f"events.out.tfevents.{self._time:010d}.{self.host_part}.{self._seq:08d}"
                f"{self.suffix}")
        body = self.header + data
        self.store.put(name, body)
        self._last_put = time.monotonic()
        self.objects += 1
        self.bytes += len(body)
        return f"{self.store.url}/{name}"

    def _failure(self) -> WriteFailed:
        lost = sorted(self._lost)
        what = (f"the values of {len(lost)} steps ({lost[0]} to {lost[-1]}) were not written"
                if lost else "nothing was lost")
        e = self._error
        return WriteFailed(f"uploading to {self.store.url} failed, {what}:"
                           f" {type(e).__name__}: {e}")

    def write(self, data: bytes, steps: Sequence[int]) -> None:
        with self._cond:
            if self._error is not None:
                self._lost.update(steps)
                raise self._failure()
            self._buf.append(data)
            self._steps.extend(steps)

    def flush(self, now: bool = False) -> None:
        with self._cond:
            if self._error is not None:
                raise self._failure()
            if not self._buf or self._closing:
                return
            self._due = True
            self._now = self._now or now
            self._worker.wake()
            while now and (self._buf or self._busy) and self._error is None:
                self._cond.wait()
            if self._error is not None:
                raise self._failure()

    def _take(self) -> tuple[bytes, list[int]]:
        data, steps = b"".join(self._buf), self._steps
        self._buf, self._steps, self._due = [], [], False
        return data, steps

    def _upload(self, data: bytes, steps: list[int]) -> None:
        try:
            self._put(data)
        except Exception as e:
            with self._cond:
                self._error = e
                # What was written since is lost too: nothing may go up after a gap.
                self._lost.update(steps, self._steps)
                self._buf, self._steps = [], []

    def _due_in(self) -> float | None:
        """Seconds until the buffer may go up (None: not asked for)."""
        return self._last_put + self.every - time.monotonic() if self._due else None

    def _take_due(self) -> Job | None:
        if self._closing or self._error is not None:
            return None  # close puts the rest itself
        wait = self._due_in()
        if wait is None or (wait > 0 and not self._now):
            return None
        data, steps = self._take()
        self._busy, self._now = True, False
        return lambda: self._upload_taken(data, steps)

    def _upload_taken(self, data: bytes, steps: list[int]) -> None:
        try:
            self._upload(data, steps)
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def close(self, quiet: bool = False) -> None:
        """Put what is left and stop the thread (``WriteFailed`` if writing failed)."""
        with self._cond:
            if self.closed:
                return
            self.closed = self._closing = True
            self._cond.notify_all()
        self._worker.join()
        with self._cond:
            pending = self._error is None and bool(self._buf)
            data, steps = self._take()
            self._cond.notify_all()  # a flush(now=True) waiting: close puts it
        if pending:
            self._upload(data, steps)
        if self._error is not None and not quiet:
            raise self._failure()
