"""How often a JAX step computes the statistics: the spacing that keeps them within
``overhead``, measured once.

A jitted step returns before it has run, so the host cannot time each step as the other
front-ends do without making it wait. Instead the first steps of a run are timed by
waiting for each (``Pacing.timed``): after a statistics and a lean step have each compiled,
a few lean steps and two statistics steps; then the statistics steps are spaced so that
their extra time, wall or CPU (every thread of the process), the lean steps' own work and
the points' host work on the worker fit ``overhead`` of the plain step's, never closer than
``stats_every``; the spacing is decided again at each point, as the points' measured work
comes in (``repace``), and nothing waits again.

The lean steps' work (the gradient sums, the rectifier outputs' exact activity counts) is
in every step, so no step of the run is plain: the front-end times that work apart, on
zeros of the step's shapes (``lean_work``), once, when the steps have been timed.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

from tb_introspect.pipeline.governor import HEADROOM, Governor

#: Lean steps timed (their median, less the lean work timed apart, is the plain step), and
#: statistics steps (their mean: one alone gave spacings of 9 and 19 on the same model in
#: two runs).
LEAN_SAMPLES = 3
FULL_SAMPLES = 2


class Pacing:
    """Times the first steps and sets ``governor.spacing`` from them."""

    def __init__(self, governor: Governor, overhead: float | None,
                 clock: Callable[[], tuple[float, float]] | None = None,
                 lean_work: Callable[[], tuple[float, float]] | None = None) -> None:
        self.governor = governor
        self.stats_every = governor.spacing
        self.clock = clock or (lambda: (time.perf_counter(), time.process_time()))
        #: A statistics step's extra time over a lean step's and a lean step's over the plain
        #: step's, as shares of the plain step's, and its CPU seconds: measured once (None
        #: until then).
        self.share: float | None = None
        self.lean_share = 0.0
        self.plain_cpu = 0.0
        self.lean_work = lean_work
        self.overhead = overhead
        self.active = overhead is not None
        self.seen: set[bool] = set()  # phases that compiled
        self.lean: list[tuple[float, float]] = []
        self.full: list[tuple[float, float]] = []
        self._last: tuple[float, float] | None = None

    def timed(self, full: bool, wait: Callable[[], object]) -> None:
        """A step of kind ``full`` was dispatched; ``wait()`` blocks until it has run."""
        if not self.active:
            return
        wait()
        now = self.clock()
        last, self._last = self._last, now
        if full not in self.seen:  # its first run compiled
            self.seen.add(full)
            return
        if last is None:
            return
        (self.full if full else self.lean).append((now[0] - last[0], now[1] - last[1]))
        if len(self.lean) >= LEAN_SAMPLES and len(self.full) >= FULL_SAMPLES:
            # wall and CPU time (XLA's threads): a statistics step's reductions may use
            # cores the plain step leaves idle, which costs the machine if not the step
            own = self.lean_work() if self.lean_work is not None else (0.0, 0.0)
            shares, lean_shares, plains = [], [], []
            for i in (0, 1):
                lean = statistics.median(t[i] for t in self.lean)
                plain = max(lean - own[i], lean / 2)  # a timing of the work apart can err
                extra = max(statistics.fmean(t[i] for t in self.full) - lean, 0.0)
                shares.append(extra / plain if plain > 0 else 0.0)
                lean_shares.append((lean - plain) / plain if plain > 0 else 0.0)
                plains.append(plain)
            self.share, self.lean_share = max(shares), max(lean_shares)
            self.plain_cpu = plains[1]
            self.active = False
            self.repace(0)

    def resume(self, earlier: Pacing) -> None:
        """Take ``earlier``'s measurement, of the same compiled steps (a later ``fit`` of one
        Keras model): nothing is timed again."""
        if earlier.share is None or self.overhead is None:
            return
        self.share, self.lean_share = earlier.share, earlier.lean_share
        self.plain_cpu, self.active = earlier.plain_cpu, False
        self.repace(0)

    def repace(self, window_steps: int) -> None:
        """Space the statistics steps so that they, the lean steps' own work and the points'
        host work (the CPU the worker spent on each window's point and maps,
        ``Governor.worked``, over a window of ``window_steps``) fit the share of ``overhead``
        the governor plans to spend (``HEADROOM``); at least a quarter of it is left to the
        statistics steps."""
        if self.share is None:
            return
        work = sum(statistics.median(d) for kind, d in self.governor.work_seconds.items()
                   if d and kind in ("point", "activity"))
        point = work / (window_steps * self.plain_cpu) if window_steps and self.plain_cpu else 0.0
        budget = self.overhead * HEADROOM
        left = max(budget - point - self.lean_share, budget / 4)
        self.governor.spacing = max(self.stats_every, math.ceil(self.share / left))

    def skip(self) -> None:
        """Something other than a step ran since the last one (a point, an epoch's end):
        the next interval is not a step's."""
        self._last = None
