"""Findings that act: the ``diagnose`` rules judged while training runs (``on_finding=``).

Every value the pipeline writes is also kept here (the ``summary_pb.Value`` it encodes: the
array in the dtype written), as TensorBoard's data provider hands it to ``tb-introspect
diagnose``: a tag's first metadata and every point's array, assembled by the reader's own
``parse_tag_info``, ``series_from_datums`` and ``assemble_run``. So the rules see the same
``RunSeries`` as ``diagnose`` reading this process's event files, with no second producer
of any number, no proto decoded and no file read back. After each logged point a worker
thread runs ``diagnose.find_issues`` on it; the training thread only queues what it wrote
and, at its next step or epoch end, takes the findings that reached the severity asked
for, each rule once. A callable is called there; ``"stop"`` is handed to the front-end, which ends
training its way (Keras: ``model.stop_training``; a loop: :class:`FindingStop`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tensorboard.data.provider import TensorDatum

from tb_introspect import metadata, summary_pb
from tb_introspect.diagnose import Finding, find_issues
from tb_introspect.diagnose.core import SEVERITY_RANK
from tb_introspect.pipeline.failures import Failures, Part, short_error
from tb_introspect.pipeline.options import check_on_finding, check_severity
from tb_introspect.pipeline.worker import Job, WorkerThread
from tb_introspect.read import provider
from tb_introspect.read.series import RunSeries, Series

logger = logging.getLogger("tb_introspect")

#: The host part switched off when judging the findings fails (training goes on).
FINDINGS = "findings"
#: A note that some rules still lack points, not something that happened to the run.
NOT_A_FINDING = ("insufficient_data",)
#: How long the end of training waits for the last judgement before giving up on it.
JUDGED_SECONDS = 60.0

Batches = Sequence[tuple[int, Sequence[summary_pb.Value]]]


class FindingStop(Exception):
    """Ends a training loop when ``on_finding="stop"`` and a finding appeared.

    The PyTorch and the custom-loop ``Introspector`` raise it from ``step()`` /
    ``end_epoch()``, after the point that showed the finding is written
    and flushed. ``finding`` is the :class:`~tb_introspect.diagnose.Finding`, ``step`` the
    training step it stopped at. A callable ``on_finding`` may raise it too: the same stop.

    Example:
        >>> from tb_introspect.torch import FindingStop
        >>> try:
        ...     pass  # the training loop, with Introspector(..., on_finding="stop")
        ... except FindingStop as stop:
        ...     print(stop.finding.kind)
    """

    def __init__(self, finding: Finding, step: int | None = None):
        self.finding = finding
        self.step = step
        at = "" if step is None else f" at step {step}"
        super().__init__(f"training stopped{at}: {describe(finding)}")


def describe(finding: Finding) -> str:
    """One line naming a finding: severity, rule, title and where it starts."""
    when = [f"{name} {v}" for name, v in (("epoch", finding.first_epoch),
                                          ("step", finding.first_step)) if v is not None]
    where = f" (from {', '.join(when)})" if when else ""
    return f"{finding.severity} {finding.kind}: {finding.title}{where}"


class WrittenRun:
    """What was written so far, as ``tb-introspect diagnose`` would read it from the files."""

    def __init__(self, run: str = "."):
        self.run = run
        self._content: dict[str, bytes] = {}  # introspect tags: their first metadata
        self._other: set[str] = set()  # tags of other plugins (none are written today)
        self._datums: dict[str, list[TensorDatum]] = {}
        self._series: dict[str, Series] = {}  # rebuilt only for tags with new points

    def add(self, batches: Batches, wall_time: float) -> None:
        for step, values in batches:
            for v in values:
                tag = v.tag
                # TensorBoard keeps the first metadata of a tag (later ones are ignored).
                new = tag not in self._content and tag not in self._other
                if new and v.metadata is not None:
                    if v.metadata.plugin_data.plugin_name == metadata.PLUGIN_NAME:
                        self._content[tag] = v.metadata.plugin_data.content
                    else:
                        self._other.add(tag)
                if tag not in self._content:
                    continue
                self._datums.setdefault(tag, []).append(TensorDatum(
                    step=int(step), wall_time=float(wall_time), numpy=v.array))
                self._series.pop(tag, None)

    def series(self) -> RunSeries:
        infos, skipped = {}, []
        for tag, content in self._content.items():
            datums = self._datums.get(tag, [])
            try:
                infos[tag] = provider.parse_tag_info(
                    tag, content, max((d.step for d in datums), default=-1),
                    max((d.wall_time for d in datums), default=0.0))
            except ValueError as e:
                skipped.append((tag, str(e)))
        series = {}
        for tag, info in infos.items():
            if info.kind == provider.KIND_VIEW_SUMMARY:
                continue  # read_run leaves them out too
            if tag not in self._series:
                try:
                    self._series[tag] = provider.series_from_datums(info, self._datums[tag])
                except ValueError as e:
                    skipped.append((tag, str(e)))
                    continue
            series[tag] = self._series[tag]
        return provider.assemble_run(self.run, infos, series, skipped)


class Watch:
    """Judges the written points on a worker thread and hands back the findings that act.

    The training thread calls :meth:`written` with every batch it wrote, :meth:`point`
    after a logged point, :meth:`take` at each step or epoch end, and :meth:`judged` when
    training ends. When points come faster than the rules run, the ones that arrived
    meanwhile are judged together.
    """

    def __init__(self, action: Any, severity: str, failures: Failures):
        self.action = check_on_finding(action)
        self.severity = check_severity(severity)
        self.failures = failures
        self.run = WrittenRun()
        self._cv = threading.Condition()
        self._pending: list[tuple[Batches, float]] = []
        self._asked = self._answered = 0  # judgements asked for and done
        self._ready: list[Finding] = []
        self._fired: set[str] = set()
        self._error: BaseException | None = None
        # Ends when nothing was asked for worker.IDLE_SECONDS (the next point starts one),
        # after a failure (reported from the training thread, in take()) and once off.
        self._worker = WorkerThread("tb_introspect-findings", self._cv, self._take,
                                    stop=lambda: self._error is not None or self.off)
        #: Seconds the worker spent per judgement (for the overhead benchmark).
        self.seconds: list[float] = []

    @property
    def off(self) -> bool:
        return Part(FINDINGS) in self.failures.off

    def acts_on(self, finding: Finding) -> bool:
        return (SEVERITY_RANK[finding.severity] <= SEVERITY_RANK[self.severity]
                and finding.kind not in NOT_A_FINDING)

    # ------------------------------------------------------------ the training thread

    def written(self, batches: Batches, wall_time: float) -> None:
        """``batches`` were written at ``wall_time`` (kept as they are; parsed later)."""
        if not self.off:
            with self._cv:
                self._pending.append((list(batches), wall_time))

    def point(self) -> None:
        """A point is written: judge what is written so far (on the worker)."""
        if self.off:
            return
        with self._cv:
            self._asked += 1
            self._worker.wake()

    def take(self) -> list[Finding]:
        """The findings judged since the last call that act, each rule once."""
        with self._cv:
            ready, self._ready = self._ready, []
            error = self._error
        if error is not None:
            self.failures.switch_off(Part(FINDINGS))  # before the error is cleared: no
            with self._cv:  # point asked meanwhile is judged
                self._error = None
            self.failures.warn_once(
                FINDINGS, f"judging the findings during training failed ({type(error).__name__}:"
                f" {short_error(error)}); on_finding is off for the rest of training, training"
                " goes on")
        return ready

    def judged(self, timeout: float = JUDGED_SECONDS) -> list[Finding]:
        """Judge everything written (waiting for the worker), then :meth:`take`."""
        with self._cv:
            pending = bool(self._pending) or self._answered < self._asked
        if pending and not self.off:
            self.point()
            with self._cv:
                asked = self._asked
                if not self._cv.wait_for(lambda: self._answered >= asked or
                                         self._error is not None, timeout):
                    logger.warning("tb_introspect: the last findings were not judged within"
                                   " %.0f s; on_finding did not see them", timeout)
        return self.take()

    def act(self, findings: Iterable[Finding], stop: Callable[[Finding], None] | None,
            why_not: str = "") -> None:
        """Run the action on each of ``findings``: a callable is called (its error warns
        once and turns it off; a ``FindingStop`` it raises is a stop); a stop calls
        ``stop`` (None: it cannot stop now, ``why_not`` says why, the finding is logged)."""
        for f in findings:
            if self.off:
                return
            if self.action != "stop":
                try:
                    self.action(f)
                    continue
                except FindingStop:
                    pass
                except Exception as e:
                    self.failures.switch_off(Part(FINDINGS))
                    self.failures.warn_once(
                        FINDINGS, f"the on_finding callable failed on {f.kind}"
                        f" ({type(e).__name__}: {short_error(e)}); it is not called again,"
                        " training goes on")
                    return
            if stop is not None:
                stop(f)
            else:
                logger.warning("tb_introspect: finding %s (%s)", describe(f), why_not)

    # ------------------------------------------------------------ the worker thread

    def _take(self) -> Job | None:
        if self._asked <= self._answered or self._error is not None or self.off:
            return None
        asked, pending, self._pending = self._asked, self._pending, []
        return lambda: self._judge(asked, pending)

    def _judge(self, asked: int, pending: list[tuple[Batches, float]]) -> None:
        try:
            t0 = time.perf_counter()
            for batches, wall_time in pending:
                self.run.add(batches, wall_time)
            found = [f for f in find_issues(self.run.series()) if self.acts_on(f)]
            self.seconds.append(time.perf_counter() - t0)
        except Exception as e:  # reported from the training thread, in take()
            with self._cv:
                self._error = e
                self._answered = asked
                self._cv.notify_all()
            return
        with self._cv:
            for f in found:
                if f.kind not in self._fired:
                    self._fired.add(f.kind)
                    self._ready.append(f)
            self._answered = asked
            self._cv.notify_all()
