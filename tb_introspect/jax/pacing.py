"""How often a JAX step computes the statistics: the spacing that keeps them within
``overhead``, measured once.

A jitted step returns before it has run, so the host cannot time each step as the other
front-ends do without making it wait. Instead the first steps of a run are timed by
waiting for each (``Pacing.timed``): after a statistics and a lean step have each compiled,
a few lean steps and two statistics steps; then the statistics steps are spaced so that
their extra time, wall or CPU (every thread of the process), and the points' host work on
the worker fit ``overhead`` of the plain step's, never closer than ``stats_every``; the
spacing is decided again at each point, as the points' measured work comes in (``repace``),
and nothing waits again.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

from tb_introspect.pipeline.governor import Governor

#: Lean steps timed (their median is the plain step), and statistics steps (their mean:
#: one alone gave spacings of 9 and 19 on the same model in two runs).
LEAN_SAMPLES = 3
FULL_SAMPLES = 2


class Pacing:
    """Times the first steps and sets ``governor.spacing`` from them."""

    def __init__(self, governor: Governor, overhead: float | None,
                 clock: Callable[[], tuple[float, float]] | None = None) -> None:
        self.governor = governor
        self.stats_every = governor.spacing
        self.clock = clock or (lambda: (time.perf_counter(), time.process_time()))
        #: A statistics step's extra time over the plain step's, as a share of it, and the
        #: plain step's CPU seconds: measured once (None until then).
        self.share: float | None = None
        self.plain_cpu = 0.0
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
            shares = []
            for i in (0, 1):
                plain = statistics.median(t[i] for t in self.lean)
                extra = max(statistics.fmean(t[i] for t in self.full) - plain, 0.0)
                shares.append(extra / plain if plain > 0 else 0.0)
            self.share, self.plain_cpu = max(shares), statistics.median(t[1] for t in self.lean)
            self.active = False
            self.repace(0)

    def repace(self, window_steps: int) -> None:
        """Space the statistics steps so that they and the points' host work (the CPU the
        worker spent on each window's point and maps, ``Governor.worked``, over a window of
        ``window_steps``) fit ``overhead``; at least a quarter of it is left to the
        statistics steps."""
        if self.share is None:
            return
        work = sum(statistics.median(d) for kind, d in self.governor.work_seconds.items()
                   if d and kind in ("point", "activity"))
        point = work / (window_steps * self.plain_cpu) if window_steps and self.plain_cpu else 0.0
        left = max(self.overhead - point, self.overhead / 4)
        self.governor.spacing = max(self.stats_every, math.ceil(self.share / left))

    def skip(self) -> None:
        """Something other than a step ran since the last one (a point, an epoch's end):
        the next interval is not a step's."""
        self._last = None
