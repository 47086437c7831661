"""The device variables a Keras training step writes, one class per kind (the transformer
probes keep theirs beside their computation, ``probes.ProbeStates``).

Only the traced step (``step.StepRecorder``) adds to them; a logged point
(``point_graph``) reads and resets the window's, the host reads the step count and the
metric ring. Each is an ON_READ variable created under the strategy's scope, so every
replica writes its own copy and nothing synchronizes inside the step; a cross-replica read
aggregates as the variable says (SUM, ONLY_FIRST_REPLICA), and the point gathers the
output states (NONE) itself.

Device memory: one copy of the trainable variables (the gradient sums) plus
``[tensors, ~2 * step_sample_size + channels + positions]`` float64 per output view and
``[tensors, 1 + channels + positions]`` for the activity counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tb_introspect import stats
from tb_introspect.keras import kernels
from tb_introspect.pipeline.plan import Monitored

_AGGREGATION = tf.VariableAggregation

#: The state keys of the activity rows: what the rectifier outputs count on every step.
ACTIVITY_KEYS = ("activity_count", "channel_nnz", "spatial_nnz")


def _variable(initial: Any, name: str, aggregation: tf.VariableAggregation,
              dtype: tf.DType | None = None) -> tf.Variable:
    return tf.Variable(initial, dtype=dtype, trainable=False, name=name,
                       synchronization=tf.VariableSynchronization.ON_READ,
                       aggregation=aggregation)


class BatchLayout:
    """The accumulator states of all monitored outputs, one row each, in one variable.

    Row ``j`` packs ``stats``' state (``STATE_MERGE`` keys) of output ``j`` in
    its canonical shape (``kernels.activation_shape``); counts are zero-padded
    to the widest tensor so that every row has the same length and one
    vectorised merge folds a step into all of them.
    """

    def __init__(self, shapes: Sequence[Sequence[int | None]], sample_size: int):
        self.canonical = [kernels.activation_shape(s) for s in shapes]
        self.sample_size = int(sample_size)
        #: (channels, positions) of each output.
        self.widths = [(int(c[-1]), int(c[1]) if len(c) == 3 else 0) for c in self.canonical]
        self.max_channels = max([w[0] for w in self.widths], default=1)
        self.max_positions = max([w[1] for w in self.widths], default=0)
        self.rows = len(self.canonical)
        channels, positions = self.max_channels, self.max_positions
        empty = stats.empty_state(tf.TensorShape([None, positions or 1, channels]
                                                 if positions else [None, channels]),
                                  sample_size=self.sample_size)
        empty["spatial_nnz"] = tf.zeros([positions], tf.float64)
        self.keys = list(stats.STATE_MERGE)
        self.shapes = [tf.TensorShape(empty[k].shape) for k in self.keys]
        self.sizes = [int(sh.num_elements()) for sh in self.shapes]
        self.empty_row = {k: np.asarray(empty[k], np.float64) for k in self.keys}
        row = np.concatenate([self.empty_row[k].reshape(-1) for k in self.keys])
        self.empty = np.tile(row, (max(self.rows, 1), 1))
        # Activity rows: [count, channel non-zero counts, position non-zero counts].
        self.activity_width = 1 + channels + positions

    def activity_row(self, state: dict[str, tf.Tensor]) -> tf.Tensor:
        """[N, activity_width] activity rows of stacked states (or ``activity_state``
        parts)."""
        return tf.concat([tf.reshape(state["activity_count"], [-1, 1]), state["channel_nnz"],
                          state["spatial_nnz"]], axis=1)

    def activity_parts(self, rows: tf.Tensor) -> dict[str, tf.Tensor]:
        """The state keys of ``activity_row``'s rows."""
        channels = self.max_channels
        return {"activity_count": rows[:, 0], "channel_nnz": rows[:, 1:1 + channels],
                "spatial_nnz": rows[:, 1 + channels:]}

    def unpadded_activity(self, rows: np.ndarray) -> dict[int, np.ndarray]:
        """Each output's activity row without the padding: [count, its channels, its
        positions]."""
        start = 1 + self.max_channels
        return {j: np.concatenate([rows[j, :1 + channels],
                                   rows[j, start:start + positions]])
                for j, (channels, positions) in enumerate(self.widths[:rows.shape[0]])}

    def pad(self, state: dict[str, tf.Tensor], j: int) -> dict[str, tf.Tensor]:
        """Output ``j``'s state (or activity parts), its counts padded to the widest."""
        channels, positions = self.widths[j]
        state["channel_nnz"].set_shape([channels])
        state["spatial_nnz"].set_shape([positions])
        return kernels.pad_state(state, self.max_channels, self.max_positions)

    def pack(self, stacked: dict[str, tf.Tensor]) -> tf.Tensor:
        """[N, ...] fields -> [N, L]."""
        return tf.concat(
            [tf.reshape(tf.cast(stacked[k], tf.float64), [self.rows, -1]) for k in self.keys], 1
        )

    def unpack(self, flat: tf.Tensor) -> dict[str, tf.Tensor]:
        """[..., N, L] -> fields with the same leading axes."""
        parts = tf.split(flat, self.sizes, axis=-1)
        lead = flat.shape[:-1].as_list()
        return {k: tf.reshape(p, lead + s.as_list())
                for k, p, s in zip(self.keys, parts, self.shapes, strict=True)}


class StepCount:
    """Training steps done, and the window's: steps since the last point, how many of
    them were statistics steps and how many counted the rectifier outputs' activity (the
    ``steps``, ``stats_steps`` and ``activity_steps`` slots of the output views); and the
    switches the host sets before an execution of the callback's one train function
    (``Phase.SWITCHED``: a statistics execution; a lean one that counts the rectifiers)."""

    def __init__(self, initial_step: int):
        first = _AGGREGATION.ONLY_FIRST_REPLICA
        self.done = _variable(int(initial_step), "step", first, tf.int64)
        self.window = _variable(0, "window", first, tf.int64)
        self.stats_steps = _variable(0, "stats_steps", first, tf.int64)
        self.activity_steps = _variable(0, "activity_steps", first, tf.int64)
        # Mirrored (written between executions only): an assign from the host reaches
        # every replica.
        self.statistics = tf.Variable(True, trainable=False, name="statistics_step")
        self.counting = tf.Variable(True, trainable=False, name="counting_step")
        self._set = (True, True)

    def switch(self, statistics: bool, counting: bool = True) -> None:
        """The next executions are statistics executions, or lean ones that count the
        rectifiers or not; an assign only when it changes (an eager op costs tens of
        microseconds)."""
        statistics, counting = bool(statistics), bool(counting)
        if statistics != self._set[0]:
            self.statistics.assign(statistics)
        if counting != self._set[1]:
            self.counting.assign(counting)
        self._set = (statistics, counting)


class GradientSums:
    """Each monitored variable's gradients summed over the window on each replica (a read
    sums the replicas). With loss scaling, a step whose gradients overflowed is skipped by
    the optimizer: its gradients leave the sum and ``skipped`` counts their NaN, +Inf and
    -Inf values (``pipeline/point.fill``)."""

    def __init__(self, variables: Sequence[Any], loss_scaled: bool):
        #: The position of each variable (by ``id``) in the monitored ones.
        self.index = {id(v): i for i, v in enumerate(variables)}
        self.sums = [_variable(tf.zeros(v.shape, v.dtype), "grad_acc", _AGGREGATION.SUM)
                     for v in variables]
        self.skipped = (_variable(tf.zeros([len(self.sums), 3], tf.float64), "grad_skipped",
                                  _AGGREGATION.SUM) if loss_scaled else None)

    def add(self, gradients: Sequence[tuple[int, tf.Tensor]]) -> None:
        """Add (variable position, dense gradient) pairs to the sums."""
        for i, g in gradients:
            self.sums[i].assign_add(g)

    def count_skipped(self, gradients: Sequence[tuple[int, tf.Tensor]]) -> None:
        """Count the non-finite values of a skipped step's (position, gradient) pairs."""
        rows = tf.stack([tf.stack([
            tf.reduce_sum(tf.cast(tf.math.is_nan(g), tf.float64)),
            tf.reduce_sum(tf.cast(tf.equal(g, np.inf), tf.float64)),
            tf.reduce_sum(tf.cast(tf.equal(g, -np.inf), tf.float64))]) for _, g in gradients])
        index = tf.constant([[i] for i, _ in gradients], tf.int32)
        self.skipped.assign_add(tf.scatter_nd(index, rows, tf.shape(self.skipped.read_value())))


class OutputStates:
    """The output views' stacked states (one variable per view, a row per monitored
    output, ``BatchLayout``) and, with the output view, the rectifiers' activity counts."""

    def __init__(self, outputs: Sequence[Monitored], views: Sequence[str],
                 step_sample_size: int):
        self.layout = BatchLayout([s.shape for s in outputs], step_sample_size)
        #: The row of each output (by its sanitized name).
        self.index = {s.name: j for j, s in enumerate(outputs)}
        none = _AGGREGATION.NONE  # the point gathers every replica's
        self.states = {view: _variable(self.layout.empty, f"{view}_states", none)
                       for view in views}
        self.activity = (_variable(np.zeros([self.layout.rows, self.layout.activity_width]),
                                   "activity", none) if "output" in views else None)
        #: The outputs a traced backward pass reached (their output gradient view exists).
        self.gradient_reached: set[int] = set()

    def fold(self, view: str, new: dict[str, tf.Tensor]) -> None:
        """Merge one step's stacked states of ``view`` into its accumulator."""
        layout, state = self.layout, self.states[view]
        state.assign(layout.pack(stats.merge_pair(layout.unpack(state.read_value()), new)))


class MetricRing:
    """Per-step metric totals and counts, a row per step in a ring of ``rows`` steps that
    the host drains before it wraps (``pipeline/metrics.py``)."""

    def __init__(self, names: Sequence[str], rows: int):
        self.names = list(names)
        self.rows = max(int(rows), 1)
        shape = [self.rows, max(len(self.names), 1)]
        self.total = _variable(tf.zeros(shape, tf.float64), "metric_total", _AGGREGATION.SUM)
        self.count = _variable(tf.zeros(shape, tf.float64), "metric_count", _AGGREGATION.SUM)

    def record(self, step: tf.Tensor, totals: tf.Tensor, counts: tf.Tensor) -> None:
        """Write the (1-based) ``step``'s totals and counts into its row."""
        row = tf.reshape((step - 1) % self.rows, [1, 1])
        self.total.assign(tf.tensor_scatter_nd_update(self.total, row, totals[tf.newaxis]))
        self.count.assign(tf.tensor_scatter_nd_update(self.count, row, counts[tf.newaxis]))
