"""The Keras side's in-step code: what a training step captures and folds on the device.

Traced into the user's compiled step (XLA-safe, no summary ops, no host calls). Gradients
are added to per-replica accumulators; layer outputs and output gradients (every row of
the batch) become ``stats`` states by ``stats.batch_state`` and are folded, all tensors at
once, into one stacked state per view with ``stats.merge_pair``; a step counter advances.
The accumulators are ``accumulators.py``'s; this module only writes them.
With ``every=N`` this happens only on sampled steps (``tf.cond``). With ``every="epoch"``
the statistics states take the epoch's *statistics steps* (its first step, then one in
``stats_every``, and the non-finite ones of ``pipeline.governor.Phase``); every other
step adds only the exact activity counts (``stats.activity_state``) of the *rectifier*
outputs (``Monitored.exact``): a dead unit is one that is zero for every sample of the
epoch, and only a rectifier's own function makes exact zeros. Which steps are statistics steps is
decided in the graph (``Phase.AUTO``: the custom loop) or on the host, which sets a
device switch that the one compiled step reads (``Phase.SWITCHED``: the Keras callback
with its overhead governor, ``pipeline/governor.py``); there a second switch leaves a lean
step's counts out when the budget cannot pay them on every step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tb_introspect import stats
from tb_introspect.keras import capture, kernels, private, probes
from tb_introspect.keras.accumulators import (
    ACTIVITY_KEYS,
    GradientSums,
    MetricRing,
    OutputStates,
    StepCount,
)
from tb_introspect.pipeline.failures import Part
from tb_introspect.pipeline.governor import Phase
from tb_introspect.pipeline.plan import Plan, is_sampled, sanitize
from tb_introspect.stats.numeric import in_xla_context

#: Under XLA, the most layer outputs and output gradients (both views together) whose
#: statistics are compiled into the training step. XLA inlines every ``batch_state`` into
#: one module, and compiling it grows faster than linearly (``benchmarks/engine_bench.py``:
#: 16 tensors 11 s and 1.2 GB, 32 tensors 24 s and 1.6 GB on a 2-core CPU); MobileNetV2's
#: ~300 ran out of 24 GB in ``benchmarks/overhead.py``.
#: 48 keeps both benchmark CNNs whole.
XLA_STEP_TENSORS = 48


class StepRecorder:
    """Per-trace recording inside one replica's training step.

    Created at the start of the traced step (it reads the step count), fed by the
    layer-call wrappers (``layer_output``) and the optimizer wrapper (``gradients``),
    closed by ``finish`` (advances the count). It writes the accumulators it is handed
    (``accumulators.py``); ``gradient_sums`` is None without the gradient view,
    ``output_states`` without an output view or a monitored output.
    """

    def __init__(self, plan: Plan, count: StepCount, gradient_sums: GradientSums | None,
                 output_states: OutputStates | None, metric_ring: MetricRing, *,
                 loss_scale: tf.Tensor | None = None, anchor: Any = None,
                 phase: Phase = Phase.AUTO, probe_states: probes.ProbeStates | None = None):
        self.plan = plan
        self.count = count
        self.gradient_sums = gradient_sums
        self.output_states = output_states
        self.metric_ring = metric_ring
        self.phase = phase
        # Ops without data inputs run as soon as the function starts, even when
        # fetching the batch then fails (end of a dataset of unknown length):
        # tie the counter to the batch so that a step without data counts nothing.
        anchors = [t for t in tf.nest.flatten(anchor) if isinstance(t, tf.Tensor)][:1]
        self.anchor = anchors
        with tf.control_dependencies(anchors):
            self.step = count.done.read_value() + 1
            self.window_step = count.window.read_value()  # 0-based step in the window
        # every=1 samples every step: a Python True spares the step its conds.
        every = plan.every
        self.sampled = True if every == 1 else is_sampled(self.step, every)
        self.metrics_finite: tf.Tensor | None = None
        self.loss_scale = loss_scale
        context = tf.distribute.get_replica_context()
        replica = context.replica_id_in_sync_group if context is not None else 0
        self.replica = tf.cast(replica, tf.int64)
        self.calls: dict[str, int] = {}
        self.grads_done = False
        self.stash: dict[str, dict[int, tf.Tensor]] = {"output": {}, "output_gradient": {}}
        # The transformer probes, folded with the statistics states (never on lean steps).
        self.probe_step = (probes.ProbeStep(probe_states, plan) if probe_states is not None
                           and phase is not Phase.LEAN else None)

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
        return tf.stack([self.step * 4, self.replica * 100003 + self.plan.options.seed])

    def _unscale(self, t: tf.Tensor) -> tf.Tensor:
        if self.loss_scale is None:
            return t
        return t / tf.cast(self.loss_scale, t.dtype)

    def fail(self, part: Part, error: BaseException) -> None:
        self.plan.failures.fail(part, error)

    # -- layer outputs (called by capture.LayerPatcher wrappers, or the custom loop)

    def output_index(self, name: str) -> int | None:
        """The row of the output called ``name`` (None: not monitored)."""
        if self.output_states is None:
            return None
        return self.output_states.index.get(sanitize(name))

    def layer_output(self, name: str, outputs: Any) -> Any:
        if self.output_states is None:
            return outputs
        count = self.calls.get(name, 0)
        self.calls[name] = count + 1
        base = name if count == 0 else f"{name}@{count}"
        leaves = capture.leaves_with_names(base, outputs)
        new = []
        for leaf_name, leaf in leaves:
            j = self.output_index(leaf_name)
            if j is None or not capture.capturable(leaf):
                new.append(leaf)
                continue
            new.append(private.copy_keras_mask(leaf, self._capture(j, leaf)))
        return capture.replace_leaves(outputs, new)

    def _capture(self, j: int, x: tf.Tensor) -> tf.Tensor:
        output_states, failures = self.output_states, self.plan.failures
        name = self.plan.outputs[j].name
        if self.phase is Phase.LEAN and not self.plan.per_epoch:
            return x  # nothing between sampled steps
        if "output" in output_states.states and not failures.is_off("output", name):
            self.output_value(j, x)
        if (
            "output_gradient" in output_states.states
            and self.phase is not Phase.LEAN
            and capture.is_float(x.dtype)
            and not failures.is_off("output_gradient", name)
        ):
            def on_grad(dy, j=j):
                self.output_gradient(j, dy)
                output_states.gradient_reached.add(j)

            try:
                return capture.probe(x, on_grad)
            except Exception as e:
                failures.fail(Part("output_gradient", name), e)
        return x

    def output_value(self, j: int, x: tf.Tensor) -> None:
        """Stash a layer output for this step's accumulator update."""
        self._stash("output", j, x)

    def output_gradient(self, j: int, dy: tf.Tensor) -> None:
        """Stash an output gradient (of the unscaled loss) for this step's update."""
        self._stash("output_gradient", j, dy)

    def _stash(self, view: str, j: int, x: tf.Tensor) -> None:
        output_states = self.output_states
        name = self.plan.outputs[j].name
        if output_states is None or view not in output_states.states or (
                self.plan.failures.is_off(view, name)):
            return
        try:
            stats.to_float(x, name)  # unsupported dtypes (strings) fail here, alone
            # As it is: what a step reads of it is made where it is read (``_canonical``),
            # so a lean step runs no op for the tensors only statistics steps read.
            self.stash[view][j] = x
        except Exception as e:  # never break training
            self.plan.failures.fail(Part(view, name), e)

    def _canonical(self, view: str, j: int) -> tf.Tensor:
        """The stashed tensor of row ``j`` in its canonical shape (an output gradient of the
        unscaled loss)."""
        x = self.stash[view][j]
        if view == "output_gradient":
            x = self._unscale(x)
        return kernels.as_activation(x, self.output_states.layout.canonical[j])

    def _canonical_all(self, view: str) -> dict[int, tf.Tensor]:
        """Every stashed tensor of ``view`` in its canonical shape (one that fails is off,
        alone)."""
        out = {}
        for j in self.stash[view]:
            try:
                out[j] = self._canonical(view, j)
            except Exception as e:
                self.plan.failures.fail(Part(view, self.plan.outputs[j].name), e)
        return out

    def finish(self) -> None:
        """Fold the stashed tensors into the accumulators (one merge per view); count the step."""
        if any(self.stash.values()):
            try:
                self._fold()
            except Exception as e:  # the fold covers both views
                self.plan.failures.fail([Part(view) for view in self.output_states.states], e)
        with tf.control_dependencies(self.anchor + [self.step, self.window_step]):
            self.count.done.assign_add(1)
            self.count.window.assign_add(1)

    def _fold(self) -> None:
        """Statistics states on statistics steps; the rectifiers' activity counts on the
        others (every step with ``every="epoch"``)."""
        output_states = self.output_states
        if in_xla_context():
            self._limit_for_xla()
        none = self._no_activity()
        if not self.plan.per_epoch:
            rows = self._fold_stats() if self.sampled is True else tf.cond(
                self.sampled, self._fold_stats, lambda: none)
        elif self.phase is Phase.STATS:
            rows = self._fold_stats()
            self.count.activity_steps.assign_add(1)
        else:  # LEAN, AUTO, SWITCHED
            # The host's switch: does this lean step count the rectifiers (the governor's
            # budget, ``pipeline/governor.py``)? The other phases count on every step.
            counting = (self.count.counting.read_value() if self.phase is Phase.SWITCHED
                        else tf.constant(True))
            activity = none
            if output_states.activity is not None:
                activity = (self._activity() if self.phase is not Phase.SWITCHED
                            else tf.cond(counting, self._activity, lambda: none))
            # The non-finite rule (``pipeline.governor.Phase``): a NaN or an infinity
            # makes its column's counts non-finite, and this step a statistics step.
            statistics = tf.logical_not(tf.math.is_finite(tf.reduce_sum(activity)))
            if self.metrics_finite is not None:
                statistics = statistics | tf.logical_not(self.metrics_finite)
            if self.phase is Phase.AUTO:
                statistics = statistics | tf.equal(self.window_step % self.plan.stats_every, 0)
            if self.phase is Phase.SWITCHED:
                statistics = statistics | self.count.statistics.read_value()
            if self.phase is Phase.LEAN and in_xla_context():
                # The rule's one exception: XLA compiles both branches of a cond, so a
                # statistics branch would make the lean step's compile as large as the
                # full one's. Non-finite columns count nothing.
                rows = tf.where(tf.math.is_finite(activity), activity, 0.0)
            else:
                rows = tf.cond(statistics, self._fold_stats, lambda: activity)
            self.count.activity_steps.assign_add(tf.cast(statistics | counting, tf.int64))
        if output_states.activity is not None:
            output_states.activity.assign_add(rows)

    def _limit_for_xla(self) -> None:
        """Keep at most ``XLA_STEP_TENSORS`` stashed tensors, evenly spread over the model
        order of each view; switch the others off, with one warning (the alternative is a
        compile that can take the machine's memory and the user's training with it)."""
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
                    self.plan.failures.switch_off(Part(view, self.plan.outputs[j].name))
                    dropped += 1
        self.plan.failures.warn_once(
            "xla limit", f"jit_compile=True: statistics of {total - dropped} of"
            f" {total} layer outputs and output gradients are compiled into the"
            " training step (XLA's compile time and memory grow with each); the others"
            " are off. Train with jit_compile=False to monitor every layer.")

    def _no_activity(self) -> tf.Tensor:
        """The activity rows of a step that adds none (zero width without the output view)."""
        output_states = self.output_states
        layout = output_states.layout
        width = layout.activity_width if output_states.activity is not None else 0
        return tf.zeros([layout.rows, width], tf.float64)

    def _activity(self) -> tf.Tensor:
        """[N, activity_width] exact activity counts of this step's stashed rectifier
        outputs (zero rows for the others: their activity comes from the statistics
        steps)."""
        layout = self.output_states.layout
        rows = []
        for j, spec in enumerate(self.plan.outputs):
            part = None
            if spec.exact and j in self.stash["output"]:
                try:
                    t = self._canonical("output", j)
                    # Inline, not a nested function: a few ops, where each call of a
                    # nested function costs about 45 us (MobileNetV2 counts 35 outputs).
                    part = layout.pad(stats.activity_state(t), j)
                except Exception as e:  # this tensor only
                    self.plan.failures.fail(Part("output", spec.name), e)
                    part = None
            if part is None:
                part = {k: tf.constant(layout.empty_row[k]) for k in ACTIVITY_KEYS}
            rows.append(part)
        return layout.activity_row({k: tf.stack([r[k] for r in rows]) for k in ACTIVITY_KEYS})

    def _fold_stats(self) -> tf.Tensor:
        """Fold this step into the statistics states; its output activity rows."""
        output_states = self.output_states
        layout = output_states.layout
        xla = in_xla_context()
        activity = self._no_activity()
        base = self._seed_base()
        segments, canonical = None, {}
        for view, stash in self.stash.items():
            if not stash:
                continue
            stash = self._canonical_all(view)
            if view == "output":
                canonical = stash
            if xla:  # one kernel per tensor: XLA compiles no loop over dynamic shapes
                new = self._states_each(view, stash, base)
            else:
                groups = kernels.group_by_dtype(stash)
                if view == "output":
                    segments = groups
                new = self._states_grouped(view, groups, base)
            output_states.fold(view, new)
            if view == "output":
                activity = layout.activity_row(new)
        if self.probe_step is not None:
            self.probe_step.fold(canonical, base, xla,
                                 segments=None if xla else segments or [])
        self.count.stats_steps.assign_add(1)
        return activity

    def _states_grouped(self, view: str, groups: list[kernels.Segments], base: tf.Tensor
                        ) -> dict[str, tf.Tensor]:
        """Every row's state of ``view`` this step: one batched kernel call per group of
        stashed tensors (``kernels.Segments``), the empty state for the other rows."""
        layout = self.output_states.layout
        salt = 2 if view == "output" else 3
        parts, order = [], []
        for group in groups:
            try:
                fn = kernels.activation_states_fn(group.dtype, layout.sample_size,
                                                  layout.max_channels, layout.max_positions)
                parts.append(kernels.call(fn, group.values, group.sizes, group.units,
                                          group.seed(base, salt)))
                order += group.rows
            except Exception as e:  # this group's tensors only
                for j in group.rows:
                    self.plan.failures.fail(Part(view, self.plan.outputs[j].name), e)
        at = {j: n for n, j in enumerate(order)}
        index = tf.constant([at.get(j, len(order)) for j in range(layout.rows)], tf.int32)
        return {k: tf.gather(tf.concat([p[k] for p in parts]
                                       + [tf.constant(layout.empty_row[k][np.newaxis])], 0),
                             index) for k in layout.keys}

    def _states_each(self, view: str, stash: dict[int, tf.Tensor], base: tf.Tensor
                     ) -> dict[str, tf.Tensor]:
        """Every row's state of ``view`` this step, one kernel call per stashed tensor."""
        layout = self.output_states.layout
        empty = {k: tf.constant(v) for k, v in layout.empty_row.items()}
        rows = []
        for j in range(layout.rows):
            t = stash.get(j)
            if t is None:
                rows.append(empty)
                continue
            try:
                fn = kernels.activation_parts_fn(t.shape.rank, t.dtype.name,
                                                 layout.sample_size, True)
                part = fn(t, base + tf.constant([2 if view == "output" else 3, j], tf.int64))
                rows.append(layout.pad(part, j))
            except Exception as e:  # this tensor only
                self.plan.failures.fail(Part(view, self.plan.outputs[j].name), e)
                rows.append(empty)
        return {k: tf.stack([r[k] for r in rows]) for k in layout.keys}

    # -- gradients (called by the optimizer wrapper, or the custom loop)

    def gradients(self, grads: Sequence[Any], variables: Sequence[Any]) -> None:
        sums = self.gradient_sums
        if sums is None or self.grads_done:
            return
        self.grads_done = True  # a train step applying twice: the first is recorded
        pairs = []
        for g, v in zip(grads, variables, strict=True):
            i = sums.index.get(id(v))
            if g is None or i is None or self.plan.failures.is_off(
                    "gradient", self.plan.variables[i].name):
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
                                         sums.sums[i].dtype)))
            if sums.skipped is None:
                self._when_sampled(lambda: sums.add(dense))
                return
            # Loss scaling (``GradientSums``): a step the optimizer skips leaves the sum as
            # it leaves the weights, the same rule for every cadence and framework.
            finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for _, g in dense])
            self._when_sampled(lambda: _run_if(finite, lambda: sums.add(dense),
                                               lambda: sums.count_skipped(dense)))
        except Exception as e:
            self.plan.failures.fail(Part("gradient"), e)

    def record_metrics(self, totals: Sequence[tf.Tensor], counts: Sequence[tf.Tensor]) -> None:
        """This step's per-metric (weighted) totals and counts, into the step ring buffer."""
        if not self.metric_ring.names:
            return
        total = tf.cast(tf.stack([tf.cast(x, tf.float64) for x in totals]), tf.float64)
        count = tf.cast(tf.stack([tf.cast(x, tf.float64) for x in counts]), tf.float64)
        # The non-finite rule (``pipeline.governor.Phase``) for the loss and metrics.
        self.metrics_finite = tf.reduce_all(tf.math.is_finite(total))
        self.metric_ring.record(self.step, total, count)


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
