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
"""

from __future__ import annotations

import atexit
import threading
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


class HostWorker:
    """Runs the jobs handed over by the training thread, one after the other, on a daemon
    thread started with the first job. ``threaded=False`` runs each job at once instead
    (the caller's thread)."""

    def __init__(self, name: str = "tb_introspect-host", *, threaded: bool = True) -> None:
        self.name = name
        self.threaded = threaded
        self._cv = threading.Condition()
        self._jobs: deque[tuple[bool, Callable[..., Any], tuple]] = deque()
        self._heavy_waiting = 0
        self._running = False
        self._thread: threading.Thread | None = None
        self._closing = False

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
            if self._thread is None:
                self._closing = False
                _live.add(self)
                self._thread = threading.Thread(target=self._work, name=self.name,
                                                daemon=True)
                self._thread.start()
            self._cv.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every job handed over is done; False if ``timeout`` ran out."""
        if self._thread is threading.current_thread():
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

    def _work(self) -> None:
        while True:
            with self._cv:
                if not self._cv.wait_for(lambda: bool(self._jobs) or self._closing,
                                         IDLE_SECONDS) or not self._jobs:
                    self._thread, self._closing = None, False
                    return
                heavy, fn, args = self._jobs.popleft()
                if heavy:
                    self._heavy_waiting -= 1
                self._running = True
                self._cv.notify_all()
            try:
                fn(*args)
            except BaseException:  # noqa: BLE001 - jobs report their own errors (guard)
                pass
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
