"""What is monitored: the tensors of each view, in the format's terms, and what is off.

A framework's collector finds its model's parameters and layer outputs and describes each
as a ``Monitored``; the ``Plan`` holds them with the options and the failures, and answers
the questions every later stage asks the same way whatever the framework: is this tensor
written, is its activity counted on every step, which cadence does the metadata name.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from tb_introspect.pipeline.failures import Failures
from tb_introspect.pipeline.options import Options, matches

#: The views a step folds layer tensors into (the others are read at logging time).
OUTPUT_VIEWS = ("output", "output_gradient")


def is_sampled(step: Any, every: str | int) -> Any:
    """The ``every=N`` rule, for every front-end: the 1-based steps N, 2N, 3N, … are the
    sampled ones (their statistics are taken, and a point is logged after each); with
    ``every="epoch"`` every step contributes. ``step`` may be a TensorFlow tensor: the
    traced Keras step decides in the graph with the same expression."""
    if every == "epoch":
        return True
    return step % int(every) == 0


def last_sampled(step: int, every: str | int) -> int:
    """The last sampled step of ``every=N`` at or before ``step`` (0 if none yet)."""
    return step - step % int(every)


def sampled_between(done: int, steps: int, every: str | int) -> bool:
    """Whether steps ``done + 1`` to ``done + steps`` (one execution of several steps)
    hold a sampled step."""
    return every == "epoch" or last_sampled(done + steps, every) > done


def window_due(last_point: int, step: int, window: int | None) -> bool:
    """The window rule (``window=N`` beside ``every="epoch"``), for every front-end: a window
    closes, and its point is logged, at the first step boundary at or after each multiple
    of N past the last point (an execution of several steps that crosses one closes it at
    its end), as well as at each epoch's end. Without ``window`` only epoch ends close one."""
    return bool(window) and last_sampled(step, window) > last_point


#: The trainers' default (``every="auto"``): at least about this many points per run...
MIN_POINTS = 20
#: ... and at most this many (unless ``window`` or ``every`` says otherwise).
MAX_POINTS = 300


def auto_window(epochs: float | None, steps: float | None,
                log_every: int | None = None) -> int | None:
    """The window a trainer's run gets by default: None (a point per epoch) where it has
    ``MIN_POINTS`` to ``MAX_POINTS`` planned ``epochs`` or its planned ``steps`` are not
    known, else about ``steps / MIN_POINTS`` steps, aligned to the trainer's logging
    interval ``log_every`` (a multiple of it, or a divisor of it when under half of it),
    never fewer than ``steps / MAX_POINTS``."""
    if epochs is not None and MIN_POINTS <= epochs <= MAX_POINTS:
        return None
    if steps is None or not math.isfinite(steps) or steps < 1:
        return None
    steps = int(steps)
    window = max(steps // MIN_POINTS, 1)
    if log_every and log_every > 1:
        if 2 * window >= log_every:
            # A multiple: a window just short of the interval would otherwise fall to
            # half of it, doubling the points (and their cost) for ~20 more.
            window = max(window // log_every, 1) * log_every
        else:
            window = max(d for d in range(1, window + 1) if log_every % d == 0)
    return max(window, -(-steps // MAX_POINTS))


def sanitize(name: str) -> str:
    """A tag-safe tensor name (TensorBoard tags allow most characters; drop whitespace and
    outer slashes)."""
    name = re.sub(r"\s+", "_", str(name))
    return name.strip("/") or "tensor"


@dataclass
class Monitored:
    """One monitored tensor: what its summary metadata says. A parameter is one ``Monitored``
    for both its views (``view`` "variable"), a layer output for both of its."""

    view: str
    name: str
    layer: str
    depth: int
    shape: tuple[int | None, ...] = ()
    dtype: str = ""
    has_grad: bool = True  # outputs only: does a gradient reach it?
    # Outputs only: a rectifier's output, whose activity is counted on every step (exact);
    # any other output's activity comes from the statistics steps (sampled).
    exact: bool = False


@dataclass
class Plan:
    """The options, the monitored tensors of both kinds and the parts switched off."""

    options: Options
    variables: list[Monitored] = field(default_factory=list)
    outputs: list[Monitored] = field(default_factory=list)
    failures: Failures = field(default_factory=Failures)
    #: The window grows with the points' measured cost (``Governor.paced_window``): the
    #: trainers' ``every="auto"``, whose window the tool chose, not the user.
    paced: bool = False

    @property
    def every(self) -> str | int:
        return self.options.every

    @property
    def per_epoch(self) -> bool:
        """Aggregated points (``every="epoch"``, with or without ``window``), not sampled."""
        return self.options.every == "epoch"

    @property
    def window(self) -> int | None:
        """``window=N``: the aggregated windows also close every N steps (``window_due``)."""
        return self.options.window

    @property
    def cadence(self) -> str:
        """The metadata's cadence: a point per epoch, per window of steps (aggregated as an
        epoch is) or per N steps (sampled)."""
        if not self.per_epoch:
            return "step"
        return "window" if self.window else "epoch"

    @property
    def stats_every(self) -> int:
        """The densest statistics-step spacing (every sampled step with ``every=N``)."""
        return self.options.stats_every if self.per_epoch else 1

    def want(self, view: str) -> bool:
        return view in self.options.views

    @property
    def output_views(self) -> list[str]:
        return [v for v in OUTPUT_VIEWS if self.want(v)]

    def chosen(self, layer: str) -> bool:
        """Whether ``layers=`` keeps ``layer`` (every layer when it is not given)."""
        return self.options.layers is None or matches(self.options.layers, layer)

    def named_rectifier(self, layer: str) -> bool:
        """Whether ``rectifiers=`` names ``layer``."""
        return matches(self.options.rectifiers, layer)

    def writes(self, view: str, spec: Monitored) -> bool:
        """Whether ``spec``'s ``view`` is written (not off; a gradient reaches it)."""
        if self.failures.is_off(view, spec.name):
            return False
        return view != "output_gradient" or spec.has_grad

    def exact_activity(self, spec: Monitored) -> bool:
        """Whether ``spec``'s activity counts every step of a window (else its statistics
        steps only)."""
        return spec.exact and self.per_epoch
