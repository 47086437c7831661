"""The Keras front-end: the thin object that wires the in-step recording (``step.py``,
writing ``accumulators.py``'s device variables) and the logged point (``point_graph.py``)
for the callback and the custom loop, and answers the framework-neutral pipeline between
steps (``pipeline.pipeline.FrontEnd``: ``current_step``, ``read_metrics``, ``point``).

Per-epoch cadence therefore gives the design's aggregation: variables at the epoch's end,
gradients summed over every step of the epoch, outputs and output gradients merged over
every batch of the epoch, on every replica.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tb_introspect.keras.accumulators import GradientSums, MetricRing, OutputStates, StepCount
from tb_introspect.keras.point_graph import PointGraph
from tb_introspect.keras.probes import ProbeStates
from tb_introspect.keras.step import StepRecorder
from tb_introspect.pipeline.failures import Part
from tb_introspect.pipeline.governor import Phase
from tb_introspect.pipeline.options import Options
from tb_introspect.pipeline.plan import Monitored, Plan, sanitize
from tb_introspect.pipeline.point import Point


class KerasFrontEnd:
    """The monitored tensors, their accumulators and the logged point, wired together.

    Life cycle: ``set_variables`` / ``set_outputs`` (host, eager), ``build`` (the
    accumulators, under ``strategy``'s scope), then per training step a ``recorder`` in the
    traced step, and the pipeline's calls from the host.
    """

    def __init__(self, options: Options, strategy: tf.distribute.Strategy | None = None,
                 loss_scaled: bool = False):
        self.plan = Plan(options)
        self.strategy = strategy or tf.distribute.get_strategy()
        # Loss scaling: the gradient sums leave out the steps the optimizer skipped.
        self.loss_scaled = bool(loss_scaled)
        self.variables: list[Any] = []
        # Built by ``build``: what the step writes, and the point that reads it.
        self.count: StepCount | None = None
        self.gradient_sums: GradientSums | None = None
        self.output_states: OutputStates | None = None
        self.metric_ring: MetricRing | None = None
        self.point_graph: PointGraph | None = None
        #: The attention layers' and the head's probe rows (sanitized names), set before
        #: ``build``: with any, the layer outputs get probe rows too (``probes.py``).
        self.probe_rows: list[str] = []
        self.probes: ProbeStates | None = None
        self._read_metrics: Callable | None = None

    @property
    def built(self) -> bool:
        return self.point_graph is not None

    def set_variables(
        self,
        variables: Sequence[Any],
        names: Sequence[str],
        layers: Sequence[str],
        depths: Sequence[int],
    ) -> None:
        """Trainable variables (for the variable and gradient views), in model order."""
        self.variables = list(variables)
        self.plan.variables = [
            Monitored(view="variable", name=sanitize(name), layer=layer, depth=int(depth),
                      shape=tuple(v.shape), dtype=tf.as_dtype(v.dtype).name)
            for v, name, layer, depth in zip(self.variables, names, layers, depths, strict=True)
        ]

    def set_outputs(self, specs: Sequence[Monitored]) -> None:
        """Layer outputs (for the output and output-gradient views), in forward order."""
        self.plan.outputs = list(specs)

    def build(self, metric_names: Sequence[str], metric_rows: int,
              initial_step: int = 0) -> None:
        """Create every accumulator (once, before the instrumented step is traced);
        ``metric_rows`` steps of the metrics are buffered between two reads."""
        plan = self.plan
        views = [v for v in plan.output_views if plan.outputs]
        with self.strategy.scope(), tf.name_scope("tb_introspect"):
            self.count = StepCount(initial_step)
            if plan.want("gradient"):
                self.gradient_sums = GradientSums(self.variables, self.loss_scaled)
            if views:
                self.output_states = OutputStates(plan.outputs, views,
                                                  plan.options.step_sample_size)
            self.metric_ring = MetricRing(metric_names, metric_rows)
            if plan.options.probes and self.probe_rows and self.output_states is not None:
                outputs = [s.name for s in plan.outputs] if "output" in views else []
                self.probes = ProbeStates(list(dict.fromkeys(outputs + self.probe_rows)),
                                          self.strategy)
        self.point_graph = PointGraph(plan, self.strategy, self.count, self.gradient_sums,
                                      self.output_states, self.variables)

    def recorder(self, loss_scale: tf.Tensor | None = None, anchor: Any = None,
                 phase: Phase = Phase.AUTO) -> StepRecorder:
        """The recorder of one traced step (``step.StepRecorder``)."""
        return StepRecorder(self.plan, self.count, self.gradient_sums, self.output_states,
                            self.metric_ring, loss_scale=loss_scale, anchor=anchor, phase=phase,
                            probe_states=self.probes)

    def device_variables(self) -> list[tf.Variable]:
        """Every accumulator on the device (what the instrumentation adds to its memory)."""
        found = [self.count.done, self.count.window, self.count.stats_steps,
                 self.count.activity_steps, self.count.statistics, self.count.counting,
                 self.metric_ring.total, self.metric_ring.count]
        if self.gradient_sums is not None:
            found += self.gradient_sums.sums
            if self.gradient_sums.skipped is not None:
                found.append(self.gradient_sums.skipped)
        if self.output_states is not None:
            found += self.output_states.states.values()
            if self.output_states.activity is not None:
                found.append(self.output_states.activity)
        if self.probes is not None:
            found.append(self.probes.state)
        return found

    # ------------------------------------------------------------------ the pipeline's

    @property
    def metric_rows(self) -> int:
        return self.metric_ring.rows if self.metric_ring is not None else 1

    def switch(self, statistics: bool, counting: bool = True) -> None:
        """The next executions of a ``Phase.SWITCHED`` step are statistics executions
        (or lean ones, which count the rectifier outputs or not)."""
        with self.strategy.scope():
            self.count.switch(statistics, counting)

    def current_step(self) -> int:
        with self.strategy.scope():
            return int(self.count.done.read_value().numpy())

    def read_metrics(self) -> tuple[int, list[str], np.ndarray, np.ndarray]:
        """(steps done, metric names, per-row metric totals, per-row counts), summed over
        replicas."""
        ring = self.metric_ring
        if self._read_metrics is None:
            @tf.function(autograph=False)
            def read():
                return (self.count.done.read_value(), ring.total.read_value(),
                        ring.count.read_value())
            self._read_metrics = read
        with self.strategy.scope():
            step, total, count = self._read_metrics()
        return int(step.numpy()), ring.names, total.numpy(), count.numpy()

    def point(self, step: int) -> Callable[[], Point]:
        """The window's device copies now, and the host part that makes its statistics
        (``PointGraph.point``; every worker computes, the chief's sink writes)."""
        host_part = self.point_graph.point(step)
        probes = None
        if self.probes is not None and not self.plan.failures.is_off("probes"):
            try:
                probes = self.probes.read()
            except Exception as e:  # the point goes on without them
                self.plan.failures.fail(Part("probes"), e)

        def finish() -> Point:
            point = host_part()
            if probes is not None:
                point.probes = probes
            return point

        return finish

    def output_widths(self) -> dict[int, tuple[int, int]]:
        if self.output_states is None:
            return {}
        return dict(enumerate(self.output_states.layout.widths))
