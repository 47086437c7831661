"""The probe points of a paced run (docs/options.md, "Probe points").

A paced window (the trainers' ``every="auto"``, ``Governor.paced_window``) grows with the
points' cost; the attention modules' and the head's probes keep the planned window. Every
planned-window-th step is a light probe step (``Probes.follow(phase, light=True)``) unless
a statistics step since the last point or probe point took the probes; where no point is
logged at that step, its probes are read and reset (``Probes.take(light=True)``: the layer
outputs' stay for the next point) and written alone as a probe point at that step
(``Pipeline.probe_point``). A point logged at an epoch's end at the same step takes them
instead: one PROBES value per step.

The probe point is held until the next step is told (or an epoch's end, or ``close``):
only then is it known whether an epoch's point comes at its step. Its state is read at its
own step, so the next step's probes are not in it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tb_introspect.pipeline import probe_window
from tb_introspect.pipeline.failures import STATISTICS
from tb_introspect.pipeline.governor import Governor
from tb_introspect.pipeline.pipeline import Pipeline
from tb_introspect.pipeline.plan import Plan
from tb_introspect.torch.probes import PROBES, Probes
from tb_introspect.torch.ranks import Ranks


@dataclass
class Held:
    """A probe point taken and not yet written."""

    step: int
    every: int  # the steps between two probe points
    probed: float  # host seconds of its step's light probes (paid as instrumentation)
    taken: tuple[np.ndarray, list[str]] | None  # ``Probes.take(light=True)``; None: failed
    seconds: float  # the governor's seconds to take it


class ProbePoints:
    """When a step takes the light probes, and the probe points' state until written."""

    def __init__(self, plan: Plan, probes: Probes, pipeline: Pipeline, ranks: Ranks,
                 governor: Governor) -> None:
        self.plan, self.probes, self.pipeline = plan, probes, pipeline
        self.ranks, self.governor = ranks, governor
        #: A step since the last point or probe point took the probes.
        self.probed = False
        self.held: Held | None = None  # to write at the next step (``hold``)
        self.merge: Held | None = None  # to put in the epoch's point (``to_point``)

    def every(self) -> int | None:
        """The steps between two probe points: the planned window of a paced run whose
        model has attention modules to probe (a transformer: its attention logits can grow
        tenfold within a paced window; a classifier's head moves slower and is read at its
        points), whatever the paced window became; None where there are none."""
        plan = self.plan
        if not (plan.paced and plan.per_epoch and plan.window and self.probes.has_attention):
            return None
        if self.pipeline.is_off(STATISTICS) or plan.failures.is_off(PROBES.view):
            return None
        return plan.window

    def is_probe_step(self, step: int) -> bool:
        """Whether ``step`` (1-based) takes the light probes (``StepHooks.probe_step``):
        every ``every()``-th step, unless a step since the last point or probe point took
        them (a statistics step), so each point and probe point holds a step's."""
        every = self.every()
        return every is not None and step % every == 0 and not self.probed

    def hold(self, step: int, probed: float) -> bool:
        """After the pipeline's ``after_steps``: when ``step`` is a probe point's (every
        ``every()``-th, no point logged at it), read and reset this rank's state of the
        attention modules' and the head's probes, held until the next ``release``.
        ``probed``: the host seconds of this step's light probes."""
        every = self.every()
        if every is None or step % every or self.pipeline.last_log_step >= step:
            return False
        start = self.governor.clock()
        self.probed = False
        taken = self.pipeline.guard(PROBES.view, self.probes.take, True)
        self.held = Held(step, every, probed, taken, self.governor.clock() - start)
        return True

    def release(self) -> bool:
        """Write the probe point held, if any (``Pipeline.probe_point``): the one exchange
        of its state between ranks (every rank releases at the same steps), the PROBES
        summary written on the worker."""
        held, self.held = self.held, None
        if held is None:
            return False
        self.pipeline.probe_point(held.step, lambda: self._values(held), held.every,
                                  step_seconds=held.probed, seconds=held.seconds)
        return True

    def _values(self, held: Held) -> Callable[[], dict[str, np.ndarray]] | None:
        taken = held.taken
        state = self.probes.empty_state() if taken is None else taken[0]
        copies, _ = self.ranks.exchange(state.reshape(-1))
        if not self.ranks.writes or taken is None:
            return None
        return lambda: self.pipeline.guard(PROBES.view, self.probes.values, copies,
                                           taken[1]) or {}

    # -------------------------------------------------------------- an epoch's point

    def to_point(self) -> None:
        """An epoch ends: a probe point held at its step goes with its point (``taken``)."""
        self.merge, self.held = self.held, None

    def after_epoch(self) -> None:
        """After an epoch's end: where no point took the probe point, it is written."""
        if self.merge is not None:
            self.held, self.merge = self.merge, None
            self.release()

    def taken(self, probes: tuple[np.ndarray, list[str]] | None
              ) -> tuple[np.ndarray, list[str]] | None:
        """A point's window state (``Probes.take``) with the probe point held at its step
        (``to_point``) added; the next probe step counts from here."""
        self.probed = False
        merge, self.merge = self.merge, None
        if probes is None or merge is None or merge.taken is None:
            return probes
        return (probe_window.merge(probes[0], merge.taken[0]),
                sorted({*probes[1], *merge.taken[1]}, key=self.probes.rows.get))
