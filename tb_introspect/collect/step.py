"""The Keras side's in-step code: what a training step captures and folds on the device.

Traced into the user's compiled step (XLA-safe, no summary ops, no host calls). Gradients
are added to per-replica accumulators; layer outputs and output gradients (every row of
the batch) become ``stats`` states by ``stats.batch_state`` and are folded, all tensors at
once, into one stacked state per view with ``stats.merge_pair``; a step counter advances.
With ``every=N`` this happens only on sampled steps (``tf.cond``). With ``every="epoch"``
the statistics states take the epoch's *statistics steps* (its first step, then one in
``stats_every``, and any step whose outputs or metrics hold a NaN); every other step adds
only the exact activity counts (``stats.activity_state``) of the *rectifier* outputs
(``Monitored.exact``): a dead unit is one that is zero for every sample of the epoch, and
only a rectifier's own function makes exact zeros. Which steps are statistics steps is
decided in the graph (``StepMode.AUTO``: the custom loop) or on the host, which then runs
one of two compiled steps (``StepMode.STATS`` / ``StepMode.LEAN``: the Keras callback with
its overhead governor, ``pipeline/governor.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from tb_introspect import stats
from tb_introspect.collect import capture, kernels, private
from tb_introspect.pipeline.failures import Part
from tb_introspect.pipeline.governor import StepMode
from tb_introspect.pipeline.plan import sanitize
from tb_introspect.stats.numeric import in_xla_context

if TYPE_CHECKING:
    from tb_introspect.collect.collector import Collector


#: Under XLA, the most layer outputs and output gradients (both views together) whose
#: statistics are compiled into the training step. XLA inlines every ``batch_state`` into
#: one module, and compiling it grows faster than linearly (``benchmarks/engine_bench.py``:
#: 16 tensors 11 s and 1.2 GB, 32 tensors 24 s and 1.6 GB on a 2-core CPU); MobileNetV2's
#: ~300 ran out of 24 GB in ``benchmarks/overhead.py``.
#: 48 keeps both benchmark CNNs whole.
XLA_STEP_TENSORS = 48



#: The state keys of the activity rows: what the rectifier outputs count on every step.
ACTIVITY_KEYS = ("activity_count", "channel_nnz", "spatial_nnz")


class BatchLayout:
    """The accumulator states of all monitored outputs, one row each, in one variable.

    Row ``j`` packs ``stats``' state (``STATE_MERGE`` keys) of output ``j`` in
    its canonical shape (``kernels.activation_shape``); counts are zero-padded
    to the widest tensor so that every row has the same length and one
    vectorised merge folds a step into all of them.
    """

    def __init__(self, shapes: Sequence[Sequence[int | None]], sample_size: int):
        self.canonical = [kernels.activation_shape(s) for s in shapes]
        self.k = int(sample_size)
        self.widths = [(int(c[-1]), int(c[1]) if len(c) == 3 else 0) for c in self.canonical]
        self.cmax = max([w[0] for w in self.widths], default=1)
        self.smax = max([w[1] for w in self.widths], default=0)
        self.n = len(self.canonical)
        empty = stats.empty_state(tf.TensorShape([None, self.smax or 1, self.cmax]
                                                 if self.smax else [None, self.cmax]),
                                  sample_size=self.k)
        empty["spatial_nnz"] = tf.zeros([self.smax], tf.float64)
        self.keys = list(stats.STATE_MERGE)
        self.shapes = [tf.TensorShape(empty[k].shape) for k in self.keys]
        self.sizes = [int(sh.num_elements()) for sh in self.shapes]
        self.empty_row = {k: np.asarray(empty[k], np.float64) for k in self.keys}
        row = np.concatenate([self.empty_row[k].reshape(-1) for k in self.keys])
        self.empty = np.tile(row, (max(self.n, 1), 1))
        # Activity rows: [count, channel non-zero counts, position non-zero counts].
        self.act_width = 1 + self.cmax + self.smax

    def activity_row(self, state: dict[str, tf.Tensor]) -> tf.Tensor:
        """[N, act_width] activity rows of stacked states (or ``activity_state`` parts)."""
        return tf.concat([tf.reshape(state["activity_count"], [-1, 1]), state["channel_nnz"],
                          state["spatial_nnz"]], axis=1)

    def pack(self, stacked: dict[str, tf.Tensor]) -> tf.Tensor:
        """[N, ...] fields -> [N, L]."""
        return tf.concat(
            [tf.reshape(tf.cast(stacked[k], tf.float64), [self.n, -1]) for k in self.keys], 1
        )

    def unpack(self, flat: tf.Tensor) -> dict[str, tf.Tensor]:
        """[..., N, L] -> fields with the same leading axes."""
        parts = tf.split(flat, self.sizes, axis=-1)
        lead = flat.shape[:-1].as_list()
        return {k: tf.reshape(p, lead + s.as_list())
                for k, p, s in zip(self.keys, parts, self.shapes, strict=True)}


class StepRecorder:
    """Per-trace recording inside one replica's training step.

    Created at the start of the traced step (it reads the step counter), fed
    by the layer-call wrappers (``layer_output``) and the optimizer wrapper
    (``gradients``), closed by ``finish`` (advances the counter).
    """

    def __init__(self, collector: Collector, loss_scale: tf.Tensor | None = None,
                 anchor: Any = None, mode: StepMode = StepMode.AUTO):
        self.c = collector
        self.mode = mode
        # Ops without data inputs run as soon as the function starts, even when
        # fetching the batch then fails (end of a dataset of unknown length):
        # tie the counter to the batch so that a step without data counts nothing.
        anchors = [t for t in tf.nest.flatten(anchor) if isinstance(t, tf.Tensor)][:1]
        self.anchor = anchors
        with tf.control_dependencies(anchors):
            self.step = collector.counter.read_value() + 1
            self.window_step = collector.window.read_value()  # 0-based step in the window
        self.sampled = collector.sampled(self.step)
        self.metrics_finite: tf.Tensor | None = None
        self.loss_scale = loss_scale
        ctx = tf.distribute.get_replica_context()
        rid = ctx.replica_id_in_sync_group if ctx is not None else 0
        self.replica = tf.cast(rid, tf.int64)
        self.calls: dict[str, int] = {}
        self.grads_done = False
        self.stash: dict[str, dict[int, tf.Tensor]] = {"output": {}, "output_gradient": {}}

    # -- helpers

    def _when_sampled(self, fn: Callable[[], Any]) -> None:
        if self.sampled is True:
            fn()
        else:
            _run_if(self.sampled, fn)

    def _seed_base(self) -> tf.Tensor:
        """``[step * 4, replica * 100003 + seed]``: a tensor's sampling seed is this plus
        ``[salt, j]``, one add (seven ops per tensor were 2.1 of the 20 profiled seconds of
        MobileNetV2's statistics-step trace)."""
        return tf.stack([self.step * 4, self.replica * 100003 + self.c.seed])

    def _unscale(self, t: tf.Tensor) -> tf.Tensor:
        if self.loss_scale is None:
            return t
        return t / tf.cast(self.loss_scale, t.dtype)

    # -- layer outputs (called by capture.LayerPatcher wrappers)

    def layer_output(self, name: str, outputs: Any) -> Any:
        count = self.calls.get(name, 0)
        self.calls[name] = count + 1
        base = name if count == 0 else f"{name}@{count}"
        leaves = capture.leaves_with_names(base, outputs)
        new = []
        for leaf_name, leaf in leaves:
            j = self.c.out_index.get(sanitize(leaf_name))
            if j is None or not capture.capturable(leaf):
                new.append(leaf)
                continue
            new.append(private.copy_keras_mask(leaf, self._capture(j, leaf)))
        return capture.replace_leaves(outputs, new)

    def _capture(self, j: int, x: tf.Tensor) -> tf.Tensor:
        c = self.c
        spec = c.out_specs[j]
        if self.mode is StepMode.LEAN and c.every != "epoch":
            return x  # nothing between sampled steps
        if "output" in c.out_vars and not c.is_off("output", spec.name):
            self.output_value(j, x)
        if (
            "output_gradient" in c.out_vars
            and self.mode is not StepMode.LEAN
            and capture.is_float(x.dtype)
            and not c.is_off("output_gradient", spec.name)
        ):
            def on_grad(dy, j=j):
                self.output_gradient(j, dy)
                c.output_grad_seen.add(j)

            try:
                return capture.probe(x, on_grad)
            except Exception as e:
                c.fail(Part("output_gradient", spec.name), e)
        return x

    def fail(self, part: Part, error: BaseException) -> None:
        self.c.fail(part, error)

    def output_value(self, j: int, x: tf.Tensor) -> None:
        """Stash a layer output for this step's accumulator update."""
        self._stash("output", j, x)

    def output_gradient(self, j: int, dy: tf.Tensor) -> None:
        """Stash an output gradient (of the unscaled loss) for this step's update."""
        self._stash("output_gradient", j, dy)

    def _stash(self, view: str, j: int, x: tf.Tensor) -> None:
        c = self.c
        name = c.out_specs[j].name
        if view not in c.out_vars or c.is_off(view, name):
            return
        try:
            stats.to_float(x, name)  # unsupported dtypes (strings) fail here, alone
            if view == "output_gradient":
                x = self._unscale(x)
            self.stash[view][j] = kernels.as_activation(x, self.c.layout.canonical[j])
        except Exception as e:  # never break training
            c.fail(Part(view, name), e)

    def finish(self) -> None:
        """Fold the stashed tensors into the accumulators (one merge per view); count the step."""
        c = self.c
        if any(self.stash.values()):
            try:
                self._fold()
            except Exception as e:
                c.fail([Part(view) for view in c.out_vars], e)  # the fold covers both
        with tf.control_dependencies(self.anchor + [self.step, self.window_step]):
            c.counter.assign_add(1)
            c.window.assign_add(1)

    def _fold(self) -> None:
        """Statistics states on statistics steps; the rectifiers' activity counts on the
        others (every step with ``every="epoch"``)."""
        c = self.c
        if in_xla_context():
            self._limit_for_xla()
        wants_activity = "output" in c.out_vars
        none = self._no_activity()
        if c.every != "epoch":
            rows = self._fold_stats() if self.sampled is True else tf.cond(
                self.sampled, self._fold_stats, lambda: none)
        elif self.mode is StepMode.STATS:
            rows = self._fold_stats()
        else:
            activity = self._activity() if wants_activity else none
            # A NaN makes its column's counts NaN: that step is taken exactly by the
            # statistics (non-finite values counted, the activity of the finite ones).
            stat = tf.logical_not(tf.math.is_finite(tf.reduce_sum(activity)))
            if self.metrics_finite is not None:
                stat = stat | tf.logical_not(self.metrics_finite)
            if self.mode is StepMode.AUTO:
                stat = stat | tf.equal(self.window_step % c.stats_every, 0)
            if self.mode is StepMode.LEAN and in_xla_context():
                # XLA compiles both branches of a cond: a statistics branch would make the
                # lean step's compile as large as the full one's. NaN columns count nothing.
                rows = tf.where(tf.math.is_finite(activity), activity, 0.0)
            else:
                rows = tf.cond(stat, self._fold_stats, lambda: activity)
        if wants_activity:
            c.act_var.assign_add(rows)

    def _limit_for_xla(self) -> None:
        """Keep at most ``XLA_STEP_TENSORS`` stashed tensors, evenly spread over the model
        order of each view; switch the others off, with one warning (the alternative is a
        compile that can take the machine's memory and the user's training with it)."""
        c = self.c
        total = sum(len(stash) for stash in self.stash.values())
        if total <= XLA_STEP_TENSORS:
            return
        share = XLA_STEP_TENSORS * np.array([len(s) for s in self.stash.values()]) // total
        dropped = 0
        for (view, stash), keep in zip(self.stash.items(), share, strict=True):
            order = sorted(stash)
            kept = {order[int(i)] for i in np.linspace(0, len(order) - 1, keep).round()}
            for j in order:
                if j not in kept:
                    del stash[j]
                    c.switch_off(Part(view, c.out_specs[j].name))
                    dropped += 1
        c.warn_once("xla limit", f"jit_compile=True: statistics of {total - dropped} of"
                    f" {total} layer outputs and output gradients are compiled into the"
                    " training step (XLA's compile time and memory grow with each); the others"
                    " are off. Train with jit_compile=False to monitor every layer.")

    def _no_activity(self) -> tf.Tensor:
        """The activity rows of a step that adds none (zero width without the output view)."""
        c = self.c
        width = c.layout.act_width if "output" in c.out_vars else 0
        return tf.zeros([c.layout.n, width], tf.float64)

    def _activity(self) -> tf.Tensor:
        """[N, act_width] exact activity counts of this step's stashed rectifier outputs
        (zero rows for the others: their activity comes from the statistics steps)."""
        c, layout = self.c, self.c.layout
        rows = []
        for j in range(layout.n):
            t = self.stash["output"].get(j) if c.out_specs[j].exact else None
            part = None
            if t is not None:
                try:
                    # Inline, not a nested function: a few ops, where each call of a
                    # nested function costs about 45 us (MobileNetV2 counts 35 outputs).
                    part = stats.activity_state(t)
                    part["channel_nnz"].set_shape([layout.widths[j][0]])
                    part["spatial_nnz"].set_shape([layout.widths[j][1]])
                    part = kernels.pad_state(part, layout.cmax, layout.smax)
                except Exception as e:  # this tensor only
                    c.fail(Part("output", c.out_specs[j].name), e)
                    part = None
            if part is None:
                part = {k: tf.constant(layout.empty_row[k]) for k in ACTIVITY_KEYS}
            rows.append(part)
        return layout.activity_row({k: tf.stack([r[k] for r in rows]) for k in ACTIVITY_KEYS})

    def _fold_stats(self) -> tf.Tensor:
        """Fold this step into the statistics states; its output activity rows."""
        c, layout = self.c, self.c.layout
        xla = in_xla_context()
        empty = {k: tf.constant(v) for k, v in layout.empty_row.items()}
        activity = self._no_activity()
        base = self._seed_base()
        for view, stash in self.stash.items():
            if not stash:
                continue
            rows = []
            for j in range(layout.n):
                t = stash.get(j)
                if t is None:
                    rows.append(empty)
                    continue
                try:
                    fn = kernels.activation_parts_fn(t.shape.rank, t.dtype.name, layout.k, xla)
                    part = fn(t, base + tf.constant([2 if view == "output" else 3, j], tf.int64))
                    part["channel_nnz"].set_shape([layout.widths[j][0]])
                    part["spatial_nnz"].set_shape([layout.widths[j][1]])
                    rows.append(kernels.pad_state(part, layout.cmax, layout.smax))
                except Exception as e:  # this tensor only
                    c.fail(Part(view, c.out_specs[j].name), e)
                    rows.append(empty)
            new = {k: tf.stack([r[k] for r in rows]) for k in layout.keys}
            var = c.out_vars[view]
            state = layout.unpack(var.read_value())
            var.assign(layout.pack(stats.merge_pair(state, new)))
            if view == "output":
                activity = layout.activity_row(new)
        c.stat_steps.assign_add(1)
        return activity

    # -- gradients (called by the optimizer wrapper)

    def gradients(self, grads: Sequence[Any], variables: Sequence[Any]) -> None:
        c = self.c
        if not c.want("gradient") or self.grads_done:
            return
        self.grads_done = True  # a train step applying twice: the first is recorded
        pairs = []
        for g, v in zip(grads, variables, strict=True):
            i = c.var_index.get(id(v))
            if g is None or i is None or c.is_off("gradient", c.var_specs[i].name):
                continue
            pairs.append((i, g))
        if not pairs:
            return
        try:
            dense = []
            for i, g in pairs:
                if isinstance(g, tf.IndexedSlices):
                    g = tf.convert_to_tensor(g)
                dense.append((i, tf.cast(self._unscale(tf.cast(g, tf.float32)),
                                         c.grad_acc[i].dtype)))

            def add():
                for i, g in dense:
                    c.grad_acc[i].assign_add(g)

            if c.grad_skipped is None:
                self._when_sampled(add)
                return

            # Loss scaling: a step with overflowed gradients is skipped by the optimizer.
            # Its gradients leave the sum (it would be Inf); their non-finite values are
            # counted (``pipeline/point.fill``), the same rule for every cadence and framework.
            def skip():
                rows = tf.stack([tf.stack([
                    tf.reduce_sum(tf.cast(tf.math.is_nan(g), tf.float64)),
                    tf.reduce_sum(tf.cast(tf.equal(g, np.inf), tf.float64)),
                    tf.reduce_sum(tf.cast(tf.equal(g, -np.inf), tf.float64))]) for _, g in dense])
                index = tf.constant([[i] for i, _ in dense], tf.int32)
                c.grad_skipped.assign_add(
                    tf.scatter_nd(index, rows, tf.shape(c.grad_skipped.read_value())))

            finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for _, g in dense])
            self._when_sampled(lambda: _run_if(finite, add, skip))
        except Exception as e:
            c.fail(Part("gradient"), e)

    def record_metrics(self, totals: Sequence[tf.Tensor], counts: Sequence[tf.Tensor]) -> None:
        """This step's per-metric (weighted) totals and counts, into the step ring buffer."""
        c = self.c
        if not c.metric_names:
            return
        row = (self.step - 1) % c.metric_rows
        t = tf.cast(tf.stack([tf.cast(x, tf.float64) for x in totals]), tf.float64)
        n = tf.cast(tf.stack([tf.cast(x, tf.float64) for x in counts]), tf.float64)
        self.metrics_finite = tf.reduce_all(tf.math.is_finite(t))  # a NaN loss: statistics
        idx = tf.reshape(row, [1, 1])
        c.metric_total.assign(tf.tensor_scatter_nd_update(c.metric_total, idx, t[tf.newaxis]))
        c.metric_count.assign(tf.tensor_scatter_nd_update(c.metric_count, idx, n[tf.newaxis]))



def _run_if(pred: Any, fn: Callable[[], Any],
            otherwise: Callable[[], Any] | None = None) -> None:
    """Run the side effects of ``fn`` when ``pred`` holds, else of ``otherwise`` (eagerly
    or as a ``tf.cond``)."""
    if tf.executing_eagerly():
        if bool(pred):
            fn()
        elif otherwise is not None:
            otherwise()
        return

    def run(f):
        def branch():
            if f is not None:
                f()
            return tf.constant(0)
        return branch

    tf.cond(pred, run(fn), run(otherwise))
