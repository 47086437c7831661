"""What happens between training steps, the same for every framework.

A framework's front-end captures tensors and folds them on its device; between steps it
answers three questions (the ``FrontEnd`` protocol): which step is it, what is in the
metric ring, and what are the statistics of the window since the last point. The
``Pipeline`` decides when to ask: it drains the metric ring before it could wrap and before
each flush, logs a point at every N-th step or at each window's end (an epoch's end, and
with ``window=N`` every N steps), writes the window's activity maps and metric bands, keeps
the event file flushed for TensorBoard's live view (a window's end always flushes),
writes the probe points a front-end asks for between them (``probe_point``: the probes
alone, docs/options.md), and turns a failure into one warning with the part switched off.
Only the chief (rank 0) has a sink; every process asks for the same points, since reading
a distributed front-end's state is a collective. With ``on_finding`` it hands what it wrote
to ``findings.Watch``, which judges it off the training thread, and acts on what comes back
between steps (``stop``: a finding the front-end ends training on).

What a point does on the host after the front-end's device copies runs on the run's
``worker.HostWorker``, beside the next training steps: the front-end may hand its host
part back as a callable (the numpy finalize, the weights' statistics), then the summaries,
the activity maps, every event write and flush, in the order they were asked for. The
training thread blocks only when a point is already waiting (a slow disk), at an explicit
``flush()`` (the clock's flush, ``flush_secs``, is a job like the writes: it never waits),
at ``close`` and, with ``on_finding="stop"``, after each point until its findings
are judged (the stop lands on the step of the point that showed the finding).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from threadpoolctl import ThreadpoolController

from tb_introspect import summary_pb
from tb_introspect.pipeline.failures import METRICS, STATISTICS, WRITING, Part, short_error, warn
from tb_introspect.pipeline.governor import Governor
from tb_introspect.pipeline.metrics import Ring
from tb_introspect.pipeline.plan import Plan, last_sampled, window_due
from tb_introspect.pipeline.point import EpochActivity, Point, values
from tb_introspect.pipeline.sink import LOCAL_FLUSH_SECS, EventSink
from tb_introspect.pipeline.worker import HostWorker

if TYPE_CHECKING:  # the findings' rules are imported with on_finding only
    from tb_introspect.diagnose import Finding
    from tb_introspect.pipeline.findings import Watch


class FrontEnd(Protocol):
    """What a framework's front-end answers between steps."""

    plan: Plan
    #: Steps the metric ring holds; the pipeline reads it before it could wrap.
    metric_rows: int

    def current_step(self) -> int:
        """Training steps done (TensorBoard's step of a point logged now)."""

    def read_metrics(self) -> tuple[int, list[str], np.ndarray, np.ndarray]:
        """(steps done, metric names, totals ``[rows, metrics]``, counts), every replica's."""

    def point(self, step: int) -> Point | Callable[[], Point]:
        """The statistics of the window since the last point; starts a new window. The
        host work after the device copies may come back as a callable, which the
        pipeline's worker runs beside the next steps (it reads nothing training changes)."""

    def output_widths(self) -> dict[int, tuple[int, int]]:
        """Channels and positions of each layer output (by index in ``plan.outputs``)."""


class Pipeline:
    """Metric drains, logged points, activity maps, window bands and flushes of one run."""

    def __init__(self, front_end: FrontEnd, sink: EventSink | None, *, lockstep: bool = False,
                 governor: Governor | None = None):
        self.front_end = front_end
        self.plan = front_end.plan
        self.failures = self.plan.failures
        self.sink = sink
        # Under a multi-worker strategy or several ranks every read of the front-end is a
        # collective: all processes read at the same steps, so reads are never triggered by
        # (process-local) wall-clock time.
        self.lockstep = bool(lockstep)
        self.governor = governor
        # A bucket's sink holds what it is handed to its own, longer interval.
        asked = self.plan.options.flush_secs
        self.flush_secs = LOCAL_FLUSH_SECS if asked is None else float(asked)
        self.ring = Ring()
        self.activity = EpochActivity()
        # Each view's VIEW_SUMMARY rows, fixed at its first point, and which views' metadata
        # the current sink has had.
        self.summaries = summary_pb.ViewSummaries()
        self.epoch = 0
        self.last_log_step = 0
        #: Steps done, counted on the host from ``after_steps`` (the window rule needs no
        #: read of the device's count).
        self.steps_done = 0
        self.since_drain = 0
        self._last_flush = time.monotonic()
        options = self.plan.options
        #: ``on_finding``: the findings judged on what this process writes (the chief's).
        self.findings: Watch | None = None
        if options.on_finding is not None:
            from tb_introspect.pipeline.findings import Watch

            self.findings = Watch(options.on_finding, options.on_finding_severity,
                                  self.failures)
        #: The finding ``on_finding`` stops on, until the front-end takes it (``take_stop``).
        self.stop: Finding | None = None
        #: A point's host work, the event writes and flushes, beside training.
        self.worker = HostWorker()
        # on_finding="stop": a point was handed over whose findings the step waits for
        self._judge_now = False
        self._paced: int | None = 0  # a paced plan's window (0: the planned one)
        self._told_pace = False

    def set_sink(self, sink: EventSink | None) -> None:
        """Write to ``sink`` from now on (a new event file carries the metadata again)."""
        self.worker.wait()
        self.sink = sink
        self.summaries.restart()

    def start(self, step: int) -> None:
        """Training (re)starts after ``step`` steps."""
        self.ring.start(step)
        self.last_log_step = self.steps_done = int(step)

    def is_off(self, part: str) -> bool:
        return Part(part) in self.failures.off

    # -------------------------------------------------------------- never break training

    def guard(self, part: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn``; on an error warn once and switch ``part`` off (training goes on)."""
        return self.failures.guard(part, fn, *args, on_write_error=self._writer_broken)

    def _job(self, part: str, fn: Callable[..., Any], *args: Any) -> None:
        """The worker: ``fn(*args)``, a failure reported as ``guard`` reports it. Run even
        when ``part`` went off after the job was handed over: what was read before the
        failure is still written."""
        try:
            fn(*args)
        except Exception as e:
            self.guard(part, _reraise, e)

    def _paid_job(self, kind: str, fn: Callable[..., Any], *args: Any) -> None:
        """The worker: a statistics ``_job``, its CPU time paid from the governor's budget:
        a window's ``kind`` of host work (``Governor.worked``), or a probe point's
        (``kind="probe"``, ``Governor.probe_worked``)."""
        start = time.thread_time()
        try:
            self._job(STATISTICS, fn, *args)
        finally:
            g = self.governor
            if g is not None:
                seconds = time.thread_time() - start
                if kind == "probe":
                    g.probe_worked(seconds)
                else:
                    g.worked(kind, seconds)

    def _writer_broken(self, error: BaseException) -> bool:
        """Whether ``error`` says the event file cannot be written (a full disk, a size
        limit...); if so all writing stops, with one warning for the cause."""
        if self.is_off(WRITING):
            return True
        if self.sink is None:
            return False
        if not isinstance(error, OSError):
            try:
                self.sink.flush()
                return False
            except Exception as e:
                error = e
        self.stop_writing(error)
        return True

    def stop_writing(self, error: BaseException) -> None:
        """One warning for a log directory that cannot be written; all logging stops (every
        part writes through the one sink: per-part warnings would repeat one cause)."""
        if self.is_off(WRITING):
            return
        self.failures.off.update((Part(WRITING), Part(METRICS), Part(STATISTICS)))
        warn(f"cannot write to the log directory ({short_error(error)}); logging is off"
             " for the rest of training, training goes on")

    def _timed(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn``, its time paid from the governor's budget."""
        if self.governor is None:
            return fn(*args)
        return self.governor.timed_log(fn, *args)

    # -------------------------------------------------------------- per execution

    def after_steps(self, steps: int, running: Mapping[str, Any] | None = None) -> None:
        """Call after ``steps`` training steps ran (one Keras execution, one loop step);
        ``running``: metrics that are not running means, written at the current step."""
        self.since_drain += int(steps)
        self.steps_done += int(steps)
        flush_due = time.monotonic() - self._last_flush >= self.flush_secs
        # Drain before the ring could wrap during the next execution, and before each flush
        # so that what is on disk is complete up to now.
        drain_now = flush_due and not self.lockstep
        if self.since_drain + int(steps) >= self.front_end.metric_rows or running or drain_now:
            self._timed(self.guard, METRICS, self.drain, running)
        if not self.plan.per_epoch:
            self.guard(STATISTICS, self._log_due)
        elif window_due(self.last_log_step, self.steps_done, self.window()):
            self.end_window()
            return
        if flush_due:
            # The clock's flush is one more job for the worker, after what was handed over:
            # on disk as soon as the worker gets to it. Waiting for it here held the step
            # behind a point's host work, which shares the interpreter with this thread.
            self.flush(wait=False)
        self.act()

    def window(self) -> int | None:
        """The steps of the current window: ``window=N``, or a paced plan's, decided after
        each window's end (``_pace``)."""
        return self._paced if self._paced != 0 else self.plan.window

    def _pace(self) -> None:
        """A window ended: a paced plan's next window grows with the points' measured cost
        (``Governor.paced_window``); several processes keep the planned one (their
        windows must close at the same steps, whatever their own clocks say)."""
        planned = self.plan.window
        if not planned or not self.plan.paced or self.governor is None or self.lockstep:
            return
        self._paced = self.governor.paced_window(planned)
        if self._paced != planned and not self._told_pace:
            self._told_pace = True
            logging.getLogger("tb_introspect").info(
                "tb_introspect: %s, to keep the points' cost within overhead=%g of the"
                " plain step (planned: every %d steps; window= or overhead=None says"
                " otherwise)", "points at epoch ends only" if self._paced is None
                else f"a point every {self._paced} or more steps",
                self.plan.options.overhead, planned)

    def _log_due(self) -> None:
        step = self.front_end.current_step()
        due = last_sampled(step, self.plan.every)
        if due > self.last_log_step:
            self._timed(self.log, due)
            if self.findings is not None and self.sink is not None:
                if not self.lockstep:  # the metrics up to the point, as at an epoch's end
                    self.guard(METRICS, self.drain)
                self._judge()

    def drain(self, running: Mapping[str, Any] | None = None) -> None:
        """Write the per-step metric values held since the last drain."""
        self.since_drain = 0
        step, names, total, count = self.front_end.read_metrics()
        self.write_steps(self.ring.steps(names, step, total, count, self.epoch, running))

    def log(self, step: int) -> None:
        """One logged point at TensorBoard ``step``: the front-end's window (its device
        copies, here), finished and written on the worker."""
        point = self.front_end.point(step)
        self.last_log_step = step
        self.worker.submit(self._paid_job, "point", self._finish, point, step, self.epoch,
                           heavy=True)

    def probe_point(self, step: int, read: Callable[[], Any], every: int, *,
                    step_seconds: float = 0.0, seconds: float = 0.0) -> None:
        """A probe point at TensorBoard ``step`` (a paced run's probes between its points,
        docs/options.md): the metrics drained as at a point, then the front-end's probes
        alone (``read()``: module -> probe values, a callable the worker runs for them, or
        None where this process writes none) written on the worker as the step's PROBES
        summary, no view's (the views' series keep their points). Its time is paid from
        the governor's budget (``Governor.probed``; ``seconds``: the front-end's already
        spent on it, ``step_seconds``: its step's probes, one every ``every`` steps);
        with ``on_finding`` the findings are judged on it."""
        clock = self.governor.clock if self.governor is not None else time.perf_counter
        start = clock()
        self.guard(METRICS, self.drain)
        probes = self.guard(STATISTICS, read)
        if probes is not None and self.sink is not None:
            self.worker.submit(self._paid_job, "probe", self._write_probes, probes, step,
                               self.epoch)
        if self.governor is not None:
            self.governor.probed(clock() - start + seconds, every, step_seconds)
        if self.findings is not None and self.sink is not None:
            self._judge()
        self.act()

    def _write_probes(self, probes: Any, step: int, epoch: int) -> None:
        with _one_blas_thread():
            if callable(probes):
                probes = probes()
            if probes and self.plan.options.probes:
                value = self.summaries.probes(probes, epoch=epoch, cadence=self.plan.cadence)
                self._write([(step, [value])])

    def _finish(self, point: Point | Callable[[], Point], step: int, epoch: int) -> None:
        """The worker: the point's host part, its summaries written."""
        with _one_blas_thread():
            if callable(point):
                point = point()
            self.activity.add(point.activity)
            if self.sink is not None:
                self._write([(step, values(self.plan, point, epoch, self.summaries))])

    # -------------------------------------------------------------- per window

    def begin_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        self.ring.begin_window()

    def end_epoch(self, extra: Mapping[str, Any] | None = None) -> None:
        """Drain; the epoch's point (``every="epoch"``: the window since the last point),
        activity maps and metric bands (``extra``: values such as ``val_loss`` written at
        this step); flush."""
        self.end_window(extra)

    def end_window(self, extra: Mapping[str, Any] | None = None) -> None:
        """The end of a window (an epoch's, or ``window=N``'s every N steps): drain, the
        window's point (``every="epoch"``), activity maps and metric bands; flush. The
        next window's first step is a statistics step (``Governor.begin_window``)."""
        if self.governor is None:
            self._end_window(extra)
        else:
            self.governor.timed_log(self._end_window, extra, window=True)
        if self.governor is not None and self.plan.per_epoch:
            self.governor.begin_window()
            self._pace()
        if self.findings is not None and self.sink is not None:
            self._judge()
        self.act()

    def _end_window(self, extra: Mapping[str, Any] | None) -> None:
        self.guard(METRICS, self.drain)
        if self.plan.per_epoch:
            self.guard(STATISTICS, self._log_epoch)
        self.guard(STATISTICS, self._write_activity)
        self.guard(METRICS, self._write_bands, extra)
        self.ring.begin_window()
        self.flush(wait=False)

    def _log_epoch(self) -> None:
        step = self.front_end.current_step()
        if step > self.last_log_step:
            self.log(step)

    def _write_activity(self) -> None:
        self.worker.submit(self._paid_job, "activity", self._write_maps,
                           self.front_end.output_widths(), self.front_end.current_step(),
                           self.epoch)

    def _write_maps(self, widths: dict[int, tuple[int, int]], step: int, epoch: int) -> None:
        """The worker: the epoch's activity maps, after its last point's counts."""
        maps = self.activity.take(self.plan, widths, epoch, self.summaries)
        self._write([(step, maps)])

    def _write_bands(self, extra: Mapping[str, Any] | None) -> None:
        bands = self.ring.epoch_bands(self.epoch, extra)
        self.write_steps([(self.front_end.current_step(), bands)])

    # -------------------------------------------------------------- findings that act

    def _judge(self) -> None:
        """Judge what is written once the worker has written the point."""
        self.worker.submit(self.findings.point)
        self._judge_now = True

    def act(self, final: bool = False) -> None:
        """Run ``on_finding`` on the findings judged since the last call (``final``: training has
        ended: wait for the judgement of everything written; nothing to stop).
        With ``on_finding="stop"`` a point just handed over is written and judged first:
        the step that logged it stops on what it shows."""
        w = self.findings
        if w is None or w.off:
            return
        wait = final or (self._judge_now and w.action == "stop")
        self._judge_now = False
        if wait:
            self.worker.wait()
        found = w.judged() if wait else w.take()
        if not found:
            return
        if final:
            w.act(found, None, "found after the last step")
        elif self.lockstep:
            # Only the chief judges: one process stopping alone would leave the others
            # waiting in their next collective.
            w.act(found, None, "on_finding='stop' does not stop a training of several"
                  " processes")
        else:
            w.act(found, self._stop)

    def _stop(self, finding: Finding) -> None:
        from tb_introspect.pipeline.findings import describe

        if self.stop is None:
            self.stop = finding
            logging.getLogger("tb_introspect").warning(
                "tb_introspect: stopping training at step %d: %s", self.front_end.current_step(),
                describe(finding))

    def take_stop(self) -> Finding | None:
        """The finding to stop on (once), the written points flushed; None if none."""
        stop, self.stop = self.stop, None
        if stop is not None:
            self.flush(wait=True)
        return stop

    def raise_stop(self) -> None:
        """A training loop's stop: raise ``FindingStop`` when there is one to stop on."""
        stop = self.take_stop()
        if stop is not None:
            from tb_introspect.pipeline.findings import FindingStop

            raise FindingStop(stop, self.front_end.current_step())

    # -------------------------------------------------------------- writing

    def write_steps(self, batches: list, part: str = METRICS) -> None:
        """Write each ``(step, values)`` (``summary_pb.Value``) on the worker (the chief's
        sink; nothing elsewhere); a failure switches ``part`` off, or all writing (the file's)."""
        if self.sink is not None and not self.is_off(WRITING):
            self.worker.submit(self._job, part, self._write, batches, time.time())

    def _write(self, batches: list, now: float | None = None) -> None:
        """The worker: write ``batches`` (and hand their values to ``on_finding``'s watch)."""
        if self.sink is not None and not self.is_off(WRITING):
            now = time.time() if now is None else now
            self.sink.write_steps([(step, [summary_pb.encode(values)] if values else [])
                                   for step, values in batches], now)
            if self.findings is not None:
                self.findings.written(batches, now)

    def flush(self, now: bool = False, wait: bool = True) -> None:
        """Flush the sink after everything handed to the worker is written (``now``: a
        bucket's uploads too, as at the end of training; ``wait``: return once done)."""
        self._last_flush = time.monotonic()
        if self.sink is not None and not self.is_off(WRITING):
            self.worker.submit(self._flush_sink, now)
        if wait or now:
            self.worker.wait()

    def _flush_sink(self, now: bool) -> None:
        if self.sink is not None and not self.is_off(WRITING):
            try:
                self.sink.flush(now)
            except Exception as e:  # a flush failure must not end training either
                self.stop_writing(e)

    def close(self) -> None:
        """Finish the worker's jobs, flush and close the sink (a later ``set_sink`` can
        open another)."""
        self.worker.wait()
        self.act(final=True)
        self.flush()
        self.worker.close()
        if self.sink is not None:
            try:
                self.sink.close()
            except Exception as e:
                self.stop_writing(e)
            self.sink = None


def _reraise(error: BaseException) -> None:
    raise error


_blas: ThreadpoolController | None = None


def _one_blas_thread() -> Any:
    """numpy's BLAS on one thread while a point is built. Its dot products there are small
    and gain nothing from a second thread, and a thread that waits for a core the training's
    own threads hold costs milliseconds per call: a PyTorch CNN's point took twice as long."""
    global _blas
    if _blas is None:  # the libraries loaded by now (numpy's BLAS among them)
        _blas = ThreadpoolController()
    return _blas.limit(limits=1, user_api="blas")
