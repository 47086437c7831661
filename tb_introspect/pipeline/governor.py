"""The overhead governor: which executions of the Keras train function are statistics steps.

The callback runs one train function whose statistics part a device switch turns on or
off (``Phase.SWITCHED``); the PyTorch hooks fold everything or the counts only. A lean
step adds only what must be exact (the rectifier outputs' activity counts, the gradient sum,
the metrics); a statistics step also computes the layer outputs' and output gradients'
statistics and runs the output-gradient probes. With ``every="epoch"`` the governor makes the
first execution of each window (epoch) a statistics execution, never more often than one
execution in ``spacing`` (``stats_every``), and otherwise only when the time it has saved
covers one more: a budget of ``overhead`` times the plain step time (``HEADROOM`` of it:
the rest is kept for what no timer sees) accrues with every step, and each statistics
execution's extra time and each logged point's time are paid from it.
The plain step time is what the lean steps take, less the host time a front-end measured in
its own instrumentation of them (the PyTorch hooks run on the host, so it can: their time is
paid from the same budget, and a lean step that already costs the whole budget leaves only
each window's first statistics step). Keras compiles its lean work into the step and reports
none; its step can leave the rectifier counts out instead (a *bare* execution): after a
window whose budget paid only its first statistics step, a few bare executions time the
counts, the plain step is then the bare one's, and where they cost more than the budget's
share of a step they are taken on the steps the credit pays (the activity is then
*sampled*, ``activity_steps`` below ``steps``). The first execution of each kind is not
counted (it traces and compiles). What a point's host work costs on the front-end's worker
thread (``worked``, its CPU time) is paid from the same budget.

A paced window (the trainers' ``every="auto"``, ``paced_window``) is as long as the planned
one, or the shortest multiple of it whose budget pays a window's fixed cost: its first
statistics step's extra time and its point on both threads. Tiny models whose steps take a
few milliseconds then get fewer points instead of doubling their step time. The probe points
a paced run keeps at the planned cadence (``probed``, docs/options.md) are paid from the same
budget: their share of each step is left out of what pays a window.

Deterministic given its clock, so tests inject one.

Several processes (``lockstep``) must agree on every step, whatever their own clocks say:
each one's decisions then come from step counts only (the window's first step, then every
``shared_spacing``-th), and the spacing is decided once, by rank 0's budget
(``spacing_to_share``), and handed to every rank at each logged point (``share``, in the
point's one exchange). A forced statistics step (the non-finite rule) stays local: it
changes what that rank folds, not which collectives it makes.
"""

from __future__ import annotations

import enum
import math
import statistics
import time
from collections import deque
from collections.abc import Callable

#: Recent executions the step-time estimates are medians over.
HISTORY = 32
#: Window ends timed before a paced window may grow (the first pays one-time costs).
PACING_POINTS = 2
#: The share of ``overhead`` the governor plans to spend. ``overhead`` is a ceiling: the
#: estimates are medians of noisy timings, and part of what the instrumentation costs no
#: timer sees (the hooks' dispatch outside their own time, caches a statistics step leaves
#: cold), so a plan that spent the whole budget would exceed it about half of the time.
HEADROOM = 0.8
#: Lean executions without the rectifier counts (``bare``) that time what the counts cost,
#: taken once, in the window after one whose budget paid only its first statistics step.
EXPLORE = 3


class Phase(enum.Enum):
    """What one training step adds to the layer outputs' and output gradients' statistics,
    the same in every front-end (the gradient sum and the metrics are added on every step
    but ``OFF`` ones).

    The non-finite rule, for every front-end: a lean step whose loss or a rectifier output
    holds a NaN or an infinity is taken as a statistics step, so those values are counted in
    the outputs' states, not lost in a lean step's activity counts. Where the step can still
    decide (Keras: its one compiled step holds the statistics branch, under XLA too), that
    step is a statistics step for every output. Where it
    cannot (PyTorch: a lean step hooks only the rectifiers, before it runs), the rectifier
    output that holds it is taken whole on that step, and :meth:`Governor.force` makes the
    next step a statistics step for every output.
    """

    #: Every statistic of every monitored output and output gradient.
    STATS = "stats"
    #: Only what must be exact: the rectifier outputs' activity counts.
    LEAN = "lean"
    #: Nothing: a step between two sampled steps of ``every=N``.
    OFF = "off"
    #: The step decides itself (the custom TensorFlow loop's one traced step): ``STATS``
    #: on the window's first step, every ``stats_every``-th and non-finite steps, ``LEAN``
    #: on the others.
    AUTO = "auto"
    #: One traced step for both (the Keras callback): ``STATS`` when the host set the
    #: front-end's switch before the execution, or a step is non-finite; ``LEAN`` on the
    #: others. Tracing a statistics and a lean function cost a fresh process's first fit
    #: a second trace and graph optimization of the whole model.
    SWITCHED = "switched"


class Governor:
    """Chooses statistics or lean per execution and keeps the budget.

    Args:
        overhead: share of the plain step time the statistics may add (None: no budget,
            a statistics execution every ``spacing``); ``HEADROOM`` of it is spent.
        spacing: the densest cadence, in executions.
        clock: seconds (``time.perf_counter``; tests pass a fake).
    """

    def __init__(self, overhead: float | None, spacing: int,
                 clock: Callable[[], float] = time.perf_counter):
        self.overhead = overhead
        #: What each step's plain time adds to the budget, as a share of it.
        self.rate = None if overhead is None else overhead * HEADROOM
        self.spacing = max(int(spacing), 1)
        self.clock = clock
        self.lean: deque[float] = deque(maxlen=HISTORY)  # seconds per step
        self.bare: deque[float] = deque(maxlen=HISTORY)  # lean, the counts off
        self.lean_added: deque[float] = deque(maxlen=HISTORY)  # of which instrumentation
        self.full: deque[float] = deque(maxlen=HISTORY)
        self.compile_seconds: dict[bool, float] = {}
        self.credit = 0.0
        self.log_seconds: deque[float] = deque(maxlen=HISTORY)
        self.window_seconds: deque[float] = deque(maxlen=HISTORY)  # a window's end, of them
        # The worker thread's CPU seconds per job kind (appended there; a deque's append
        # and popleft are atomic, so the training thread alone touches ``credit``).
        self.work_seconds: dict[str, deque[float]] = {}
        self._unpaid: deque[float] = deque()
        # Probe points (``probed``): each one's seconds on the training thread (its step's
        # probes included) and on the worker, and the steps between two of them.
        self.probe_seconds: deque[float] = deque(maxlen=HISTORY)
        self.probe_work: deque[float] = deque(maxlen=HISTORY)
        self.probe_every = 1
        self.since_stats = 0
        self.window_start = True
        self.forced = False
        self.window_runs = 0
        self.window_stats_runs = 0
        #: (statistics executions, executions) of the last window that ended.
        self.last_window = (0, 0)
        #: Several processes: the spacing they all use (None: one process, the budget).
        self.shared_spacing: int | None = None
        # The rectifier counts of a front-end that can leave them out of a lean execution
        # (``run``'s ``bare_fn``): on every step of this window (exact), or as the credit
        # pays them; the bare executions still to take to time them.
        self.skippable_counts = False
        self.count_all = True
        self._explore: int | None = None
        #: Seconds the counts add to a lean step, once timed (``_plan_counts``; None: not).
        self.counts_seconds: float | None = None
        self._window_times: dict[bool, list[float]] = {True: [], False: []}  # counted, bare

    # -------------------------------------------------------------- decisions

    def begin_window(self) -> None:
        """A new window (epoch): its first execution is a statistics execution."""
        self.window_start = True
        if self.window_runs:  # what the window that ended ran, for the benchmarks
            self.last_window = self.cadence()
            self._plan_counts()
        self.window_runs = self.window_stats_runs = 0
        self._window_times = {True: [], False: []}

    def _plan_counts(self) -> None:
        """After the window that timed the rectifier counts: on every step from now on if
        they cost at most the budget's share of a plain step, else on the steps the credit
        pays (``choose_counts``; the activity is then *sampled*). Decided once, from the
        lean and bare executions of that one window (medians of two kinds taken apart in
        time would differ by the machine's drift, not the counts). The counts are timed
        (``EXPLORE`` bare executions) in the window after one whose budget paid only its
        first statistics step: until then every step counts."""
        if not self.skippable_counts or self.overhead is None or self.counts_seconds is not None:
            return
        counted, bare = self._window_times[True], self._window_times[False]
        if len(bare) >= EXPLORE and counted:
            self.counts_seconds = max(statistics.median(counted) - statistics.median(bare), 0.0)
            plain = statistics.median(bare)
            self.count_all = self.counts_seconds <= self.rate * plain
        elif self._explore is None and self.last_window[0] <= 1:
            self._explore = EXPLORE

    def choose_counts(self) -> bool:
        """True: the next lean execution counts the rectifier outputs' activity."""
        if not self.skippable_counts or self.overhead is None:
            return True
        if self._explore:
            self._explore -= 1
            return False
        if self.count_all:
            return True
        self._pay_work()
        return self.credit >= (self.counts_seconds or 0.0)

    def force(self) -> None:
        """The next execution is a statistics execution (a non-finite step was seen: the
        rule in :class:`Phase`)."""
        self.forced = True

    def choose(self) -> bool:
        """True: the next execution computes statistics."""
        if self.window_start or self.forced:
            return True
        if self.shared_spacing is not None:
            return self.since_stats + 1 >= self.shared_spacing
        if self.since_stats + 1 < self.spacing:
            return False
        if self.overhead is None:
            return True
        extra = self.extra_per_stats_step()
        if extra is None:  # no estimate yet: the densest cadence
            return True
        self._pay_work()
        return self.credit >= extra

    def lockstep(self) -> None:
        """Several processes: decide from step counts, at the densest cadence until the
        first shared spacing."""
        self.shared_spacing = self.spacing

    def spacing_to_share(self) -> float:
        """The spacing this governor's budget affords (rank 0's, shared with every rank):
        one statistics step per that many steps keeps its extra time, with the lean steps'
        instrumentation and the logged points', within ``overhead`` of the plain step."""
        extra, plain = self.extra_per_stats_step(), self.plain_step()
        if self.overhead is None or extra is None or not plain:
            return float(self.spacing)
        added = statistics.median(self.lean_added) if self.lean_added else 0.0
        log = statistics.median(self.log_seconds) if self.log_seconds else 0.0
        log += self._work_per_window()
        steps = max(self.window_runs, 1)
        spare = self.rate * plain - added - log / steps - self.probe_share()
        if spare <= 0:
            return float(2**31)
        return float(min(max(self.spacing, math.ceil(extra / spare)), 2**31))

    def paced_window(self, planned: int) -> int | None:
        """The steps of a paced window: ``planned``, or once ``PACING_POINTS`` points were
        timed, the shortest multiple of it whose budget (``overhead`` times the plain step,
        less the lean steps' instrumentation, per step) pays a window's fixed cost: a
        statistics step's extra time and a point's, on the training thread and its worker
        (medians, the first point left out), with the probe points' share of each step
        (``probe_share``) left out of the budget. None: no window pays it; points at epoch
        ends only."""
        extra, plain = self.extra_per_stats_step(), self.plain_step()
        if (self.overhead is None or extra is None or not plain
                or len(self.window_seconds) < PACING_POINTS):
            return planned
        added = statistics.median(self.lean_added) if self.lean_added else 0.0
        spare = self.rate * plain - added - self.probe_share()
        if spare <= 0:
            return None
        fixed = extra + _later(self.window_seconds) + self._work_per_window()
        steps = math.ceil(fixed / spare)
        return max(planned, planned * math.ceil(steps / planned))

    def _work_per_window(self) -> float:
        """A window's CPU seconds on the worker: each kind of job's median (``worked``)."""
        return sum(_later(s) for s in list(self.work_seconds.values()))

    def share(self, spacing: float) -> None:
        """The spacing rank 0 decided (``spacing_to_share``), used from the next step."""
        if self.shared_spacing is not None and math.isfinite(spacing) and spacing >= 1:
            self.shared_spacing = int(spacing)

    def extra_per_stats_step(self) -> float | None:
        """Seconds a statistics step takes beyond a plain one (median estimates): what it
        is charged."""
        plain = self.plain_step()
        if plain is None or not self.full:
            return None
        return max(statistics.median(self.full) - plain, 0.0)

    def plain_step(self) -> float | None:
        """The plain step time it can observe: the bare steps' median where the counts are
        left out, else the lean steps', less the median instrumentation time reported in
        them."""
        if self.bare and not self.count_all:
            return statistics.median(self.bare)
        if not self.lean:
            return None
        added = statistics.median(self.lean_added) if self.lean_added else 0.0
        return max(statistics.median(self.lean) - added, 0.0)

    # -------------------------------------------------------------- accounting

    def run(self, stats_fn: Callable, lean_fn: Callable, *args, steps: int = 1,
            full: bool | None = None, bare_fn: Callable | None = None):
        """Run and account one execution of ``steps`` steps: the statistics function when
        ``full`` (None: ``choose()``), the lean one otherwise, or ``bare_fn`` (the lean one
        without the rectifier counts, where the front-end has one) when the counts are
        not taken (``choose_counts``)."""
        full = self.choose() if full is None else full
        self.skippable_counts = bare_fn is not None
        counted = full or self.choose_counts()
        start = self.clock()
        out = (stats_fn if full else lean_fn if counted else bare_fn)(*args)
        self.ran(full, self.clock() - start, steps, counted=counted)
        return out

    def ran(self, full: bool, seconds: float | None, steps: int = 1,
            instrumented: float = 0.0, counted: bool = True) -> None:
        """Account one execution that took ``seconds`` wall time for ``steps`` steps
        (None: not timed, e.g. across an epoch end; it still counts for the cadence), of
        which ``instrumented`` seconds were the front-end's own instrumentation; a lean one
        that did not count the rectifiers is not ``counted``."""
        steps = max(int(steps), 1)
        self.window_start = self.forced = False
        self.window_runs += 1
        self.since_stats = 0 if full else self.since_stats + 1
        self.window_stats_runs += int(full)
        if seconds is None:
            return
        if full not in self.compile_seconds:  # the first call traces and compiles
            self.compile_seconds[full] = seconds
            return
        if not full:
            self._window_times[counted].append(seconds / steps)
        if not counted:
            self.bare.append(seconds / steps)
            self._accrue(steps)
            return
        (self.full if full else self.lean).append(seconds / steps)
        if not full:
            self.lean_added.append(min(instrumented, seconds) / steps)
        plain = self.plain_step()
        if self.overhead is None or plain is None:
            return
        self._accrue(steps)
        if full:
            self.credit -= max(seconds - plain * steps, 0.0)
        elif not self.count_all:  # counts the credit chose to pay
            self.credit -= (self.counts_seconds or 0.0) * steps
        else:
            self.credit -= instrumented

    def _accrue(self, steps: int) -> None:
        plain = self.plain_step()
        if self.overhead is not None and plain is not None:
            self.credit += self.rate * plain * steps

    def logged(self, seconds: float) -> None:
        """A logged point (statistics at logging time and writing) took ``seconds``."""
        self.log_seconds.append(seconds)
        if self.overhead is not None:
            self.credit -= seconds

    def worked(self, kind: str, seconds: float) -> None:
        """The front-end's worker thread spent ``seconds`` of CPU on a ``kind`` of a
        window's host work (a point's finalize, its activity maps): paid from the budget
        by the training thread (called from the worker)."""
        self.work_seconds.setdefault(kind, deque(maxlen=HISTORY)).append(seconds)
        if self.overhead is not None:
            self._unpaid.append(seconds)

    def probed(self, seconds: float, every: int, step_seconds: float = 0.0) -> None:
        """A probe point took ``seconds`` on the training thread (paid here), after a step
        whose probes took ``step_seconds`` (paid as that step's instrumentation); one comes
        every ``every`` steps."""
        self.probe_seconds.append(seconds + step_seconds)
        self.probe_every = max(int(every), 1)
        if self.overhead is not None:
            self.credit -= seconds

    def probe_worked(self, seconds: float) -> None:
        """A probe point's host work took ``seconds`` of CPU on the worker thread (called
        from there; paid by the training thread, as ``worked``)."""
        self.probe_work.append(seconds)
        if self.overhead is not None:
            self._unpaid.append(seconds)

    def probe_share(self) -> float:
        """The probe points' seconds per step, both threads (medians, the first left out);
        0 without any."""
        if not self.probe_seconds:
            return 0.0
        return (_later(self.probe_seconds) + _later(self.probe_work)) / self.probe_every

    def _pay_work(self) -> None:
        while self._unpaid:
            self.credit -= self._unpaid.popleft()

    def timed_log(self, fn: Callable, *args, window: bool = False):
        """``fn(*args)``, its time paid as a logged point's (``window``: a window's end,
        whose point and maps are what ``paced_window`` weighs)."""
        start = self.clock()
        try:
            return fn(*args)
        finally:
            seconds = self.clock() - start
            self.logged(seconds)
            if window:
                self.window_seconds.append(seconds)

    # -------------------------------------------------------------- reporting

    def cadence(self) -> tuple[int, int]:
        """(statistics executions, executions) of the current window."""
        return self.window_stats_runs, self.window_runs

    def every_step_cost(self, budget: float) -> str | None:
        """One line on what logging every step costs and which ``every`` fits ``budget``,
        once both a step and a logged point were timed (``every=1``)."""
        if not self.full or not self.log_seconds:
            return None
        step = statistics.median(self.full)
        log = statistics.median(self.log_seconds)
        fits = max(math.ceil(log / (budget * step) - 1e-9), 2) if step > 0 else None
        share = 100.0 * log / step if step > 0 else float("inf")
        return (f"every=1: each step's logged point takes {1e3 * log:.0f} ms on top of a"
                f" {1e3 * step:.0f} ms instrumented step (+{share:.0f} %); every={fits} would"
                f" keep logging within {100 * budget:.0f} %")


def _later(seconds: deque[float]) -> float:
    """The median of timings after the first (which pays one-time costs), if any."""
    return statistics.median(list(seconds)[1:] or seconds) if seconds else 0.0
