"""The Keras side's collector: the monitored tensors, their accumulators, and what the
host asks of them between steps.

The work is split by when it runs (``docs/design.md``): ``step.py`` is traced into the
training step and only folds into the accumulators created here; ``point.py`` is the one
traced function of a logged point (the outputs finalized; weights and gradient sums go to
``pipeline.params`` as they are); everything after the packed vectors is the
framework-neutral pipeline's (``pipeline/``), which calls ``current_step``,
``read_metrics`` and ``point`` (the ``pipeline.pipeline.FrontEnd`` protocol).

Per-epoch cadence therefore gives the design's aggregation: variables at the epoch's end,
gradients summed over every step of the epoch, outputs and output gradients merged over
every batch of the epoch, on every replica.

Device memory: one copy of the trainable variables (the gradient accumulator) plus
``[tensors, ~2 * step_sample_size + channels + positions]`` float64 per output view and
``[tensors, 1 + channels + positions]`` for the activity counts. The host keeps the
previous point's weights (float64, for ``update_ratio``) and gradient sums (for
``cos_prev``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tb_introspect.collect import point as point_fn
from tb_introspect.collect import private
from tb_introspect.collect.step import BatchLayout
from tb_introspect.pipeline.failures import Part
from tb_introspect.pipeline.options import Options
from tb_introspect.pipeline.params import Params
from tb_introspect.pipeline.plan import Monitored, Plan, is_sampled, sanitize
from tb_introspect.pipeline.point import Block, Point

_ON_READ = tf.VariableSynchronization.ON_READ
_AGG = tf.VariableAggregation


class Collector:
    """Monitored tensors, their in-step accumulators and the logging function.

    Life cycle: ``set_variables`` / ``set_outputs`` / ``set_metrics`` (host, eager),
    ``build`` (creates the tf.Variables under ``strategy``'s scope), then per training step
    a ``step.StepRecorder`` in the traced step, and the pipeline's calls from the host.
    """

    def __init__(self, options: Options, strategy: tf.distribute.Strategy | None = None,
                 loss_scaled: bool = False):
        self.plan = Plan(options)
        self.options = options
        self.views = options.views
        self.every = options.every
        self.quantiles = options.quantiles
        self.sample_size = options.sample_size
        self.step_sample_size = options.step_sample_size
        self.stats_every = self.plan.stats_every
        self.seed = options.seed
        self.strategy = strategy or tf.distribute.get_strategy()
        # Loss scaling: a step whose gradients overflowed is skipped by the optimizer; its
        # gradients leave the sum and their non-finite values are counted.
        self.loss_scaled = bool(loss_scaled)
        self.grad_skipped: tf.Variable | None = None
        self.variables: list[Any] = []
        self.var_index: dict[int, int] = {}
        self.out_index: dict[str, int] = {}
        self.metric_names: list[str] = []
        self.metric_rows = 1
        self.built = False
        self._point_fns: dict[frozenset, Callable] = {}
        self._read_metrics_fn: Callable | None = None
        self.output_grad_seen: set[int] = set()

    # ------------------------------------------------------------------ registration

    @property
    def var_specs(self) -> list[Monitored]:
        return self.plan.variables

    @property
    def out_specs(self) -> list[Monitored]:
        return self.plan.outputs

    def want(self, view: str) -> bool:
        return self.plan.want(view)

    def is_off(self, view: str, name: str | None = None) -> bool:
        return self.plan.failures.is_off(view, name)

    def switch_off(self, part: Part) -> None:
        """Stop monitoring ``part`` quietly."""
        self.plan.failures.switch_off(part)

    def fail(self, parts: Part | Sequence[Part], error: BaseException) -> None:
        """Report one instrumentation failure once; the parts are off from then on."""
        self.plan.failures.fail(parts, error)

    def warn_once(self, key: str, message: str) -> None:
        self.plan.failures.warn_once(key, message)

    def set_variables(
        self,
        variables: Sequence[Any],
        names: Sequence[str],
        layers: Sequence[str],
        depths: Sequence[int],
    ) -> None:
        """Trainable variables (for the variable and gradient views), in model order."""
        self.variables = list(variables)
        self.var_index = {id(v): i for i, v in enumerate(self.variables)}
        self.plan.variables = [
            Monitored(view="variable", name=sanitize(name), layer=layer, depth=int(depth),
                      shape=tuple(v.shape), dtype=tf.as_dtype(v.dtype).name)
            for v, name, layer, depth in zip(self.variables, names, layers, depths, strict=True)
        ]

    def set_outputs(self, specs: Sequence[Monitored]) -> None:
        """Layer outputs (for the output and output-gradient views), in forward order."""
        self.plan.outputs = list(specs)
        self.out_index = {s.name: j for j, s in enumerate(specs)}

    def set_metrics(self, names: Sequence[str], rows: int) -> None:
        """Per-step scalars buffered in the step (``rows`` steps between two reads)."""
        self.metric_names = list(names)
        self.metric_rows = max(int(rows), 1)

    # ------------------------------------------------------------------ variables

    def build(self, initial_step: int = 0) -> None:
        """Create all accumulators (once, before the instrumented step is traced)."""
        with self.strategy.scope(), tf.name_scope("tb_introspect"):
            self.counter = tf.Variable(
                int(initial_step), dtype=tf.int64, trainable=False, name="step",
                synchronization=_ON_READ, aggregation=_AGG.ONLY_FIRST_REPLICA,
            )
            self.grad_acc = []
            if self.want("gradient"):
                for v in self.variables:
                    self.grad_acc.append(tf.Variable(
                        tf.zeros(v.shape, v.dtype), trainable=False, name="grad_acc",
                        synchronization=_ON_READ, aggregation=_AGG.SUM,
                    ))
                if self.loss_scaled:
                    # NaN, +Inf, -Inf values of the steps the optimizer skipped.
                    self.grad_skipped = tf.Variable(
                        tf.zeros([len(self.variables), 3], tf.float64), trainable=False,
                        name="grad_skipped", synchronization=_ON_READ, aggregation=_AGG.SUM,
                    )
            self.layout = BatchLayout([sp.shape for sp in self.out_specs], self.step_sample_size)
            self.out_vars: dict[str, tf.Variable] = {}
            for view in ("output", "output_gradient"):
                if self.want(view) and self.out_specs:
                    self.out_vars[view] = tf.Variable(
                        self.layout.empty, trainable=False, name=f"{view}_states",
                        synchronization=_ON_READ, aggregation=_AGG.NONE,
                    )
            if "output" in self.out_vars:
                self.act_var = tf.Variable(
                    np.zeros([self.layout.n, self.layout.act_width]), trainable=False,
                    name="activity", synchronization=_ON_READ, aggregation=_AGG.NONE,
                )
            # Steps since the last logged point, and how many of them were statistics
            # steps (the ``steps`` and ``stats_steps`` slots of the output views).
            self.window = tf.Variable(
                0, dtype=tf.int64, trainable=False, name="window",
                synchronization=_ON_READ, aggregation=_AGG.ONLY_FIRST_REPLICA,
            )
            self.stat_steps = tf.Variable(
                0, dtype=tf.int64, trainable=False, name="stat_steps",
                synchronization=_ON_READ, aggregation=_AGG.ONLY_FIRST_REPLICA,
            )
            m = max(len(self.metric_names), 1)
            self.metric_total = tf.Variable(
                tf.zeros([self.metric_rows, m], tf.float64), trainable=False,
                name="metric_total", synchronization=_ON_READ, aggregation=_AGG.SUM,
            )
            self.metric_count = tf.Variable(
                tf.zeros([self.metric_rows, m], tf.float64), trainable=False,
                name="metric_count", synchronization=_ON_READ, aggregation=_AGG.SUM,
            )
        # The previous point's weights and gradient sums live on the host, beside their
        # statistics: the first update_ratio is the change since training began.
        self.params = Params(self.plan, [np.asarray(point_fn.value_of(v)) for v in self.variables]
                             if self.want("variable") else None, channels_first=False)
        self.built = True

    # ------------------------------------------------------------------ in-step

    def sampled(self, step: tf.Tensor) -> bool | tf.Tensor:
        """Whether this (1-based) step contributes: always per epoch / every step."""
        return True if self.every == 1 else is_sampled(step, self.every)

    # ------------------------------------------------------------------ host side

    def current_step(self) -> int:
        with self.strategy.scope():
            return int(self.counter.read_value().numpy())

    def read_metrics(self) -> tuple[int, list[str], np.ndarray, np.ndarray]:
        """(steps done, metric names, per-row metric totals, per-row counts), summed over
        replicas."""
        if self._read_metrics_fn is None:
            @tf.function(autograph=False)
            def read():
                return (
                    self.counter.read_value(),
                    self.metric_total.read_value(),
                    self.metric_count.read_value(),
                )
            self._read_metrics_fn = read
        with self.strategy.scope():
            step, total, count = self._read_metrics_fn()
        return int(step.numpy()), self.metric_names, total.numpy(), count.numpy()

    def output_blocks(self) -> list[tuple[str, list[Monitored]]]:
        """The output views' blocks ``point.compute`` returns, in order: (view, monitored
        tensors of its block)."""
        plan = [(view, [self.out_specs[j] for j in range(self.layout.n)
                        if self.writes_output(view, j)]) for view in self.out_vars]
        return [(view, specs) for view, specs in plan if specs]

    def writes_output(self, view: str, j: int) -> bool:
        return self.plan.writes(view, self.out_specs[j])

    def point(self, step: int) -> Point:
        """The window's statistics (every worker computes; the chief's sink writes)."""
        # Traced once per set of switched-off tensors: reads, and the outputs' finalize
        # vectorised over all of them, so the trace is short.
        key = frozenset(self.plan.failures.off)
        fn = self._point_fns.get(key)
        if fn is None:
            fn = tf.function(lambda: point_fn.compute(self), autograph=False)
            self._point_fns = {key: fn}
        blocks = self.output_blocks()
        # Runs once per point: Grappler's optimization of its graph took longer than the
        # graph runs in a whole training.
        with self.strategy.scope(), private.without_graph_optimization():
            vectors, (activity, window, stat_steps, skipped), ws, gs = fn()
        act = activity.numpy()
        cmax = self.layout.cmax
        rows = {}
        for j in range(act.shape[0]):
            c, p = self.layout.widths[j]
            rows[j] = np.concatenate([act[j, :1 + c], act[j, 1 + cmax:1 + cmax + p]])
        skipped = skipped.numpy()
        out = Point(window=int(window.numpy()), stats_steps=int(stat_steps.numpy()),
                    activity=rows, skipped=skipped if skipped.size else None)
        self.params.add_blocks(out, [w.numpy() for w in ws] if ws else None,
                               [g.numpy() for g in gs] if gs else None, self.seed + step)
        out.blocks += [Block(view, specs, v.numpy())
                       for (view, specs), v in zip(blocks, vectors, strict=True)]
        return out

    def output_widths(self) -> dict[int, tuple[int, int]]:
        return dict(enumerate(self.layout.widths))
