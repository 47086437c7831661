"""The Keras side's logged point: one traced function reads and resets the window's
accumulators; every statistic is then taken on the host, in numpy, as PyTorch's are.

The traced function only reads: gradient sums with a SUM over replicas, the variables as
they are, and the layer outputs' states gathered from all replicas (one ``all_gather``) and
merged with ``stats.merge_stacked`` (the step's own merge, so a window merges exactly across
replicas as across steps). It returns them with one host copy each and resets the window.
On the host the output states are finalized by the numpy twin (``stats.finalize_rows``,
``stats_np.finalize_many``) and the weights and gradient sums by the framework-neutral
``pipeline.params``: a traced finalize cost seconds of tracing per process. What happens to
the vectors then is the pipeline's (``pipeline/point.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tb_introspect import stats
from tb_introspect.keras import private
from tb_introspect.keras.accumulators import (
    BatchLayout,
    GradientSums,
    OutputStates,
    StepCount,
)
from tb_introspect.pipeline.params import Params
from tb_introspect.pipeline.plan import Plan
from tb_introspect.pipeline.point import Block, Point


class PointGraph:
    """The window's point from the accumulators it is handed (it only reads and resets
    them); holds its traced function and the previous point's host copies (``Params``).

    ``gradient_sums`` is None without the gradient view, ``output_states`` without an
    output view or a monitored output; ``variables`` are the monitored weights."""

    def __init__(self, plan: Plan, strategy: tf.distribute.Strategy, count: StepCount,
                 gradient_sums: GradientSums | None, output_states: OutputStates | None,
                 variables: Sequence[Any]):
        self.plan = plan
        self.strategy = strategy
        self.count = count
        self.gradient_sums = gradient_sums
        self.output_states = output_states
        self.weights = list(variables) if plan.want("variable") else []
        # The previous point's weights and gradient sums live on the host, beside their
        # statistics: the first update_ratio is the change since training began.
        self.params = Params(plan, [np.asarray(value_of(v)) for v in self.weights]
                             if plan.want("variable") else None, channels_first=False)
        self._read: Callable | None = None

    def output_rows(self, view: str) -> list[int]:
        """The rows of ``view`` a point writes (not off, a gradient reaches them)."""
        return [j for j, spec in enumerate(self.plan.outputs) if self.plan.writes(view, spec)]

    def point(self, step: int) -> Callable[[], Point]:
        """The window's device copies, taken now (the window starts again); returns the
        host part, which computes the point's statistics from them and reads nothing
        training changes (the pipeline runs it beside the next steps). Every worker
        computes; the chief's sink writes."""
        if self._read is None:
            # One trace per process, short: reads, one gather and merge, resets.
            self._read = tf.function(self._compute, autograph=False)
        # Runs once per point: Grappler's optimization of its graph took longer than the
        # graph runs in a whole training.
        with self.strategy.scope(), private.without_graph_optimization():
            states, tail, weights, sums = self._read()
        activity, window, stats_steps, activity_steps, skipped = (t.numpy() for t in tail)
        weights = [w.numpy() for w in weights] if weights else None
        # The sums and states are read without a copy (read-only views that keep their
        # tensors alive): the resets gave the accumulators other buffers, so training never
        # writes these (ResNet50's sums: a 94 MB copy on the training thread). A weight is
        # copied: a view of the variable's buffer would make the next step copy it.
        sums = [np.asarray(g) for g in sums] if sums else None
        states = np.asarray(states)
        rows = {view: self.output_rows(view) for view in self.output_states.states
                } if self.output_states is not None else {}
        seed = self.plan.options.seed + step

        def host_part() -> Point:
            out = Point(window=int(window), stats_steps=int(stats_steps),
                        activity_steps=int(activity_steps),
                        activity=({} if self.output_states is None else
                                  self.output_states.layout.unpadded_activity(activity)),
                        skipped=skipped if skipped.size else None)
            self.params.add_blocks(out, weights, sums, seed)
            out.blocks += self.output_blocks(states, activity, rows)
            return out

        return host_part

    def output_blocks(self, states: np.ndarray, activity: np.ndarray,
                      rows: dict[str, list[int]]) -> list[Block]:
        """Each output view's block of its written ``rows`` (by view), from the merged
        states ``[views, outputs, L]`` and the activity rows, finalized on the host
        (``stats.finalize_rows``)."""
        if self.output_states is None:
            return []
        layout = self.output_states.layout
        blocks = []
        for position, view in enumerate(self.output_states.states):
            written = rows[view]
            if not written:
                continue
            state = unpack_rows(layout, states[position, written])
            if view == "output":  # the rectifiers' activity counts every step of the window
                state.update(layout.activity_parts(activity[written]))
            blocks.append(Block(view, [self.plan.outputs[j] for j in written],
                                stats.finalize_rows(state, view,
                                                    quantiles=self.plan.options.quantiles)))
        return blocks

    def _compute(self) -> tuple[tf.Tensor, list[tf.Tensor], list[tf.Tensor], list[tf.Tensor]]:
        """The traced body: the output views' merged states ``[views, outputs, L]``,
        ``[activity, window, stats_steps, activity_steps, skipped]``, the weights (``[]``
        without the variable view) and the gradient sums (``[]`` without the gradient view)
        of every variable."""
        resets = []  # assignments that must wait for every read
        skipped = tf.zeros([0, 3], tf.float64)
        weights = [tf.convert_to_tensor(value_of(v)) for v in self.weights]
        accumulators = self.gradient_sums.sums if self.gradient_sums is not None else []
        sums = [accumulator.read_value() for accumulator in accumulators]  # SUM over replicas
        for accumulator, value in zip(accumulators, sums, strict=True):
            resets.append(lambda accumulator=accumulator, value=value:
                          accumulator.assign(tf.zeros_like(value)))
        skipped_counts = self.gradient_sums.skipped if self.gradient_sums is not None else None
        if skipped_counts is not None:
            skipped = skipped_counts.read_value()  # SUM over replicas
            resets.append(lambda: skipped_counts.assign(tf.zeros_like(skipped)))
        states = tf.zeros([0, 0, 0], tf.float64)
        tail = [tf.zeros([0, 0], tf.float64)] + [tf.constant(0.0, tf.float64)] * 3
        if self.output_states is not None:
            results = self.strategy.run(functools.partial(
                gather_outputs, self.output_states, self.count))
            states, *tail = [self.strategy.experimental_local_results(r)[0] for r in results]
        tail.append(skipped)
        with tf.control_dependencies([states, *tail, *weights, *sums]):
            for reset in resets:
                reset()
        return tf.identity(states), [tf.identity(t) for t in tail], weights, sums


def gather_outputs(output_states: OutputStates, count: StepCount) -> list[tf.Tensor]:
    """Replica context: every replica's output states merged (one all_gather), then the
    activity counts ``[outputs, 1 + channels + positions]`` summed over replicas (``[0, 0]``
    without the output view), the window's steps, its statistics steps and the steps that
    counted the rectifiers; resets the window. The states are ``[views, outputs, L]``
    (``BatchLayout`` rows)."""
    context = tf.distribute.get_replica_context()
    layout, views = output_states.layout, list(output_states.states)
    local = tf.stack([output_states.states[v].read_value() for v in views])  # [V, N, L]
    replicas = context.num_replicas_in_sync if context is not None else 1
    activity = (output_states.activity.read_value() if output_states.activity is not None
                else None)
    window = tf.cast(count.window.read_value(), tf.float64)
    stats_steps = tf.cast(count.stats_steps.read_value(), tf.float64)
    activity_steps = tf.cast(count.activity_steps.read_value(), tf.float64)
    merged = local
    if replicas > 1:
        gathered = context.all_gather(local[tf.newaxis], axis=0)  # [R, V, N, L]
        gathered = tf.reshape(gathered, [replicas, len(views), layout.rows, sum(layout.sizes)])
        # Every view's rows merge in one stack: [R, V * N, L].
        state = stats.merge_stacked(layout.unpack(
            tf.reshape(gathered, [replicas, len(views) * layout.rows, -1])))
        merged = tf.reshape(tf.concat([tf.reshape(state[k], [len(views) * layout.rows, -1])
                                       for k in layout.keys], 1),
                            [len(views), layout.rows, -1])
        if activity is not None:
            activity = tf.reduce_sum(context.all_gather(activity[tf.newaxis], axis=0), 0)
    out = [merged, activity if activity is not None else tf.zeros([0, 0], tf.float64),
           window, stats_steps, activity_steps]
    with tf.control_dependencies(out):
        for view in views:
            output_states.states[view].assign(tf.constant(layout.empty))
        if activity is not None:
            output_states.activity.assign(tf.zeros_like(activity))
        count.window.assign(0)
        count.stats_steps.assign(0)
        count.activity_steps.assign(0)
    return [tf.identity(t) for t in out]


def unpack_rows(layout: BatchLayout, rows: np.ndarray) -> dict[str, np.ndarray]:
    """``[n, L]`` state rows (``BatchLayout``'s) -> the stacked state, in numpy."""
    parts = np.split(rows, np.cumsum(layout.sizes)[:-1], axis=-1)
    return {k: p.reshape(rows.shape[:-1] + tuple(shape.as_list()))
            for k, p, shape in zip(layout.keys, parts, layout.shapes, strict=True)}


def value_of(v: Any) -> Any:
    """The TF value of a Keras 3 variable (or a tf.Variable itself)."""
    if isinstance(v, tf.Variable):
        return v
    return getattr(v, "value", v)
