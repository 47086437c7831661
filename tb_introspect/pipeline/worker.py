"""A point's host work beside training: one background thread per run, in order, bounded.

After a logged point's device copies the training thread has nothing left to wait for: the
numpy finalize, the weights' and gradient sums' statistics, the summaries, the activity
maps and the event writes run here, as TensorBoard's own writer hands its events to a
thread. Jobs run one at a time in the order they were handed over, so what a tag gets is
written in step order. At most one point waits (``submit(heavy=True)`` blocks the training
thread while another point has not started): a slow disk or bucket slows training down
instead of holding copy after copy in memory. Every job is run through the pipeline's
guard (``failures.py``): a failure warns once and switches its part off, from this
thread. ``wait`` returns once everything handed over is done (a flush at the end of
training, ``close``); at interpreter exit every worker finishes its jobs before the event
files are closed (a crashed training keeps what it logged).

The thread itself is a ``WorkerThread``, the package's one kind of background thread: the
findings' judge (``findings.Watch``) and a bucket run's uploader (``sink.Roller``) are the
others. Each starts when there is work and ends when it has had none for ``IDLE_SECONDS``
(the uploader, which a clock wakes, when its sink closes).
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

#: Points that may wait for the worker besides the one it runs.
WAITING_POINTS = 1
#: A worker thread with nothing to do for this long ends (the next job starts another).
IDLE_SECONDS = 30.0
#: How long interpreter exit waits for a worker's jobs (a bucket that no longer answers).
EXIT_SECONDS = 60.0

_live: weakref.WeakSet[HostWorker] = weakref.WeakSet()

Job = Callable[[], Any]


class WorkerThread:
    """The package's one kind of background thread: a daemon thread over its owner's
    condition, started when there is work, which ends once it has had nothing to do for
    ``IDLE_SECONDS`` (unless ``idles=False``) or when ``stop()`` says so.

    The owner keeps its state under ``cond`` and tells the thread what to do with callables
    it calls with ``cond`` held: ``take()`` hands over the next job (a callable the thread
    runs without the lock) or ``None`` while nothing is due; ``stop()`` ends the thread when
    nothing is taken (closing, a failure); ``due_in()`` is how many seconds until a job can
    come due without a ``wake`` (a clock), ``None`` for never. A job reports its own errors
    (the pipeline's guard, the findings' ``take``, an upload's ``WriteFailed``); what
    escapes one is dropped and the thread goes on. The uploader of a bucket run, the
    findings' judge and every run's host work (``HostWorker``) are one of these.
    """

    def __init__(self, name: str, cond: threading.Condition, take: Callable[[], Job | None],
                 *, stop: Callable[[], bool] = lambda: False,
                 due_in: Callable[[], float | None] = lambda: None,
                 idles: bool = True) -> None:
        self.name, self.cond, self.idles = name, cond, idles
        self._take, self._stop, self._due_in = take, stop, due_in
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        """Whether the thread is started and has not ended (``cond`` held)."""
        return self._thread is not None

    def on_thread(self) -> bool:
        """Whether the caller is this worker's thread (a job never waits for itself)."""
        return self._thread is threading.current_thread()

    def wake(self) -> None:
        """Something may be due (``cond`` held): start the thread if none runs, and notify."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        self.cond.notify_all()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the thread has ended (``cond`` not held); False if ``timeout`` ran out."""
        if self.on_thread():
            return False
        with self.cond:
            return self.cond.wait_for(lambda: self._thread is None, timeout)

    def _next(self) -> Job | None:
        """The next job, waiting for one; None once the thread is to end (``cond`` held)."""
        idle_since = time.monotonic()
        while True:
            job = self._take()
            if job is not None:
                return job
            if self._stop():
                return None
            waits = [self._due_in()]
            if self.idles:
                left = idle_since + IDLE_SECONDS - time.monotonic()
                if left <= 0:
                    return None
                waits.append(left)
            self.cond.wait(min((w for w in waits if w is not None), default=None))

    def _run(self) -> None:
        while True:
            with self.cond:
                job = self._next()
                if job is None:
                    self._thread = None  # no thread left behind; the next wake starts one
                    self.cond.notify_all()
                    return
            try:
                job()
            except BaseException:  # noqa: BLE001 - jobs report their own errors
                pass


class HostWorker:
    """Runs the jobs handed over by the training thread, one after the other, on a daemon
    thread (``WorkerThread``) started with the first job. ``threaded=False`` runs each job at
    once instead (the caller's thread)."""

    def __init__(self, name: str = "tb_introspect-host", *, threaded: bool = True) -> None:
        self.name = name
        self.threaded = threaded
        self._cv = threading.Condition()
        self._jobs: deque[tuple[bool, Callable[..., Any], tuple]] = deque()
        self._heavy_waiting = 0
        self._running = False
        self._closing = False
        self._worker = WorkerThread(name, self._cv, self._take, stop=lambda: self._closing)

    def submit(self, fn: Callable[..., Any], *args: Any, heavy: bool = False) -> None:
        """Run ``fn(*args)`` after every job handed over before. ``heavy``: a point's
        copies; blocks while another point is waiting (``WAITING_POINTS``)."""
        if not self.threaded:
            fn(*args)
            return
        with self._cv:
            if heavy:
                self._cv.wait_for(lambda: self._heavy_waiting < WAITING_POINTS)
                self._heavy_waiting += 1
            self._jobs.append((heavy, fn, args))
            if not self._worker.running:
                self._closing = False
                _live.add(self)
            self._worker.wake()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every job handed over is done; False if ``timeout`` ran out."""
        if self._worker.on_thread():
            return False  # a job never waits for itself
        with self._cv:
            return self._cv.wait_for(lambda: not self._jobs and not self._running, timeout)

    @property
    def idle(self) -> bool:
        with self._cv:
            return not self._jobs and not self._running

    def close(self) -> None:
        """Finish every job; the thread ends (a later job starts another)."""
        self.wait()
        with self._cv:
            self._closing = True
            self._cv.notify_all()

    def _take(self) -> Job | None:
        if not self._jobs:
            return None
        heavy, fn, args = self._jobs.popleft()
        if heavy:
            self._heavy_waiting -= 1
        self._running = True
        self._cv.notify_all()
        return lambda: self._run_job(fn, args)

    def _run_job(self, fn: Callable[..., Any], args: tuple) -> None:
        try:
            fn(*args)
        finally:
            with self._cv:
                self._running = False
                self._cv.notify_all()


def _finish_all() -> None:
    for worker in list(_live):
        worker.wait(EXIT_SECONDS)


class _Anchor:
    pass


# At interpreter exit every worker finishes its jobs before an unclosed event file is
# closed by its finalizer: making a finalizer now registers weakref's own exit hook first,
# and atexit runs hooks in reverse order. The Keras callback's exit flush, registered
# after this module is imported, runs before (its flush is one more job to finish).
_anchor = _Anchor()
weakref.finalize(_anchor, int)
atexit.register(_finish_all)
