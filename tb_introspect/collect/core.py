"""The collector shared by the Keras callback and the custom-loop ``Introspector``.

Split of the work (why it is split this way):

* **In the training step** (traced into the user's compiled step, XLA-safe, no
  summary ops): gradients are added to per-replica accumulators; layer outputs
  and output gradients (every row of the batch) are turned into ``stats``
  states by ``stats.batch_state`` and folded, all tensors at once, into one
  stacked state per view with ``stats.merge_pair``; a step counter advances.
  With ``every=N`` this happens only on sampled steps (``tf.cond``). With
  ``every="epoch"`` the statistics states take the epoch's *statistics steps*
  (its first step, then one in ``stats_every``, and any step whose outputs or
  metrics hold a NaN); every other step adds only the exact activity counts
  (``stats.activity_state``) of the *rectifier* outputs (``Monitored.exact``):
  a dead unit is one that is zero for every sample of the epoch, and only a
  rectifier's own function makes exact zeros. Every other output's activity
  comes from the statistics steps and is written as sampled (the
  ``activity_steps`` slot). Which steps are statistics steps is decided in the
  graph (``StepMode.AUTO``: the custom loop) or on the host, which then runs
  one of two compiled steps (``StepMode.STATS`` / ``StepMode.LEAN``: the Keras
  callback with its overhead governor, ``collect/governor.py``).
* **At logging time** (the host calls ``log`` when a point is due; one traced
  function): gradient sums are read with a SUM over replicas, variables and
  gradient sums become states with ``stats.many_states`` (segment reductions
  over all tensors at once), output states are gathered from all replicas (one
  ``all_gather``) and merged, everything is finalized with ``stats.finalize``
  (vectorised over tensors), the ``epoch`` / ``update_ratio`` / ``cos_prev``
  columns are filled, the accumulators are reset, and the chief writes all
  summaries as numpy-built protos in one ``write_raw_pb``, each view's VIEW_SUMMARY
  (``summary_pb.ViewSummaries``) with them.

Per-epoch cadence therefore gives the design's aggregation (docs/design.md):
variables at the epoch's end, gradients summed over every step of the epoch, outputs and output
gradients merged over every batch of the epoch, on every replica.

Memory: three copies of the trainable variables (gradient accumulator,
previous gradient for ``cos_prev``, previous weights for ``update_ratio``)
plus ``[tensors, ~2 * step_sample_size + channels + positions]`` float64 per
output view and ``[tensors, 1 + channels + positions]`` for the activity counts.
"""

from __future__ import annotations

import enum
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from tb_introspect import metadata, stats, summary_pb
from tb_introspect.collect import capture, kernels, private
from tb_introspect.collect.options import Options
from tb_introspect.collect.parts import Part

#: Elements per variable the implicit-learning-rate percentiles come from (rank error about
#: 1.1 percentile points, one sigma, in larger variables; exact in smaller ones).
ILR_SAMPLE = 2048

#: Under XLA, the most layer outputs and output gradients (both views together) whose
#: statistics are compiled into the training step. XLA inlines every ``batch_state`` into
#: one module, and compiling it grows faster than linearly (``benchmarks/engine_bench.py``:
#: 16 tensors 11 s and 1.2 GB, 32 tensors 24 s and 1.6 GB on a 2-core CPU); MobileNetV2's
#: ~300 ran out of 24 GB in ``benchmarks/overhead.py``.
#: 48 keeps both benchmark CNNs whole.
XLA_STEP_TENSORS = 48

_ON_READ = tf.VariableSynchronization.ON_READ
_AGG = tf.VariableAggregation


def warn(message: str) -> None:
    """One user-visible warning line (a ``RuntimeWarning``; not logged a second time)."""
    warnings.warn(f"tb_introspect: {message}", RuntimeWarning, stacklevel=3)


class StepMode(enum.Enum):
    """How one traced training step treats layer outputs and output gradients."""

    #: The graph decides: statistics on the window's first step, every ``stats_every``-th
    #: and NaN steps; the rectifiers' activity counts on the others.
    AUTO = "auto"
    #: Every step is a statistics step (the host chose it; ``every=N``'s sampled steps
    #: still decide in the graph).
    STATS = "stats"
    #: No statistics and no output-gradient probes: the rectifiers' activity counts, the
    #: gradient sum and the metrics only (a NaN step still gets the output statistics).
    LEAN = "lean"


@dataclass
class Monitored:
    """One monitored tensor of one view: what the summary metadata needs."""

    view: str
    name: str
    layer: str
    depth: int
    shape: tuple[int | None, ...]
    dtype: str
    has_grad: bool = True  # outputs only: does a gradient reach it?
    # Outputs only: a rectifier's output, whose activity is counted on every step (exact);
    # any other output's activity comes from the statistics steps (sampled).
    exact: bool = False

    @property
    def tag(self) -> str:
        return metadata.stats_tag(self.view, self.name)


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


def sanitize(name: str) -> str:
    """A tag-safe tensor name (TensorBoard tags allow most characters; drop control/space)."""
    name = re.sub(r"[\s]+", "_", str(name))
    return name.strip("/") or "tensor"


class Collector:
    """Monitored tensors, their in-step accumulators and the logging function.

    Life cycle: ``set_variables`` / ``set_outputs`` / ``set_metrics`` (host, eager),
    ``build`` (creates the tf.Variables under ``strategy``'s scope), then per
    training step a ``StepRecorder`` in the traced step, and ``log`` /
    ``read_metrics`` from the host.
    """

    def __init__(self, options: Options, strategy: tf.distribute.Strategy | None = None,
                 writer: Any = None):
        self.options = options
        self.views = options.views
        self.every = options.every
        self.quantiles = options.quantiles
        self.sample_size = options.sample_size
        self.step_sample_size = options.step_sample_size
        # Every step's statistics when a window is a single sampled step anyway.
        self.stats_every = options.stats_every if options.every == "epoch" else 1
        self.seed = options.seed
        self.strategy = strategy or tf.distribute.get_strategy()
        self.writer = writer
        # The VIEW_SUMMARY rows of each view (fixed at its first point) and which views'
        # metadata the current writer has written (``set_writer`` starts that again).
        self.summaries = summary_pb.ViewSummaries()
        self.variables: list[Any] = []
        self.var_specs: list[Monitored] = []
        self.var_index: dict[int, int] = {}
        self.out_specs: list[Monitored] = []
        self.out_index: dict[str, int] = {}
        self.metric_names: list[str] = []
        self.metric_rows = 1
        self.built = False
        # Names of tensors whose instrumentation failed while tracing: they are
        # skipped from then on (the log function is re-traced without them).
        self.off: set[Part] = set()
        self._warned: set[str] = set()
        self._log_fns: dict[frozenset, Callable] = {}
        self._read_metrics_fn: Callable | None = None
        self.output_grad_seen: set[int] = set()
        self.output_seen: set[int] = set()
        # Per output: [count, channel non-zero counts, position non-zero counts] summed over
        # the epoch's logged windows, on the host (see ``write_activity``).
        self.epoch_activity: np.ndarray | None = None

    # ------------------------------------------------------------------ registration

    def want(self, view: str) -> bool:
        return view in self.views

    def set_writer(self, writer: Any) -> None:
        """Write to ``writer`` from now on (traced logging functions captured the old one)."""
        self.writer = writer
        self._log_fns = {}
        self.summaries.restart()

    def switch_off(self, part: Part) -> None:
        """Stop monitoring ``part`` quietly."""
        self.off.add(part)

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
        self.var_specs = []
        for v, name, layer, depth in zip(self.variables, names, layers, depths, strict=True):
            self.var_specs.append(
                Monitored(
                    view="variable",
                    name=sanitize(name),
                    layer=layer,
                    depth=int(depth),
                    shape=tuple(v.shape),
                    dtype=tf.as_dtype(v.dtype).name,
                )
            )

    def set_outputs(self, specs: Sequence[Monitored]) -> None:
        """Layer outputs (for the output and output-gradient views), in forward order."""
        self.out_specs = list(specs)
        self.out_index = {s.name: j for j, s in enumerate(self.out_specs)}

    @property
    def exact_rows(self) -> np.ndarray:
        """Per output: is its activity counted on every step (a rectifier)?"""
        return np.array([s.exact for s in self.out_specs], bool).reshape(-1)

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
            self.grad_acc, self.grad_prev, self.w_prev = [], [], []
            if self.want("gradient"):
                for v in self.variables:
                    self.grad_acc.append(tf.Variable(
                        tf.zeros(v.shape, v.dtype), trainable=False, name="grad_acc",
                        synchronization=_ON_READ, aggregation=_AGG.SUM,
                    ))
                    self.grad_prev.append(tf.Variable(
                        tf.zeros(v.shape, v.dtype), trainable=False, name="grad_prev"
                    ))
                self.has_grad_prev = tf.Variable(False, trainable=False, name="has_grad_prev")
            if self.want("variable"):
                for v in self.variables:
                    # The starting point, so the first logged update_ratio is the
                    # change since training began.
                    self.w_prev.append(tf.Variable(
                        tf.convert_to_tensor(_value(v)), trainable=False, name="w_prev"
                    ))
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
        self.built = True

    @property
    def cadence(self) -> str:
        return "epoch" if self.every == "epoch" else "step"

    # ------------------------------------------------------------------ in-step

    def sampled(self, step: tf.Tensor) -> bool | tf.Tensor:
        """Whether this (1-based) step contributes: always per epoch / every step."""
        if self.every == "epoch" or self.every == 1:
            return True
        return tf.equal(step % int(self.every), 0)

    def fail(self, parts: Part | Sequence[Part], error: BaseException) -> None:
        """Report one instrumentation failure once; the parts are off from then on."""
        parts = [parts] if isinstance(parts, Part) else list(parts)
        self.off.update(parts)
        what = ", ".join(str(p) for p in parts)
        self.warn_once(what, f"{what}: instrumentation failed ({type(error).__name__}: {error});"
                       " it is off for the rest of training, training goes on")

    def warn_once(self, key: str, message: str) -> None:
        """``warn(message)`` the first time ``key`` is seen (traces repeat)."""
        if key not in self._warned:
            self._warned.add(key)
            warn(message)

    # ------------------------------------------------------------------ host side

    def current_step(self) -> int:
        with self.strategy.scope():
            return int(self.counter.read_value().numpy())

    def read_metrics(self) -> tuple[int, np.ndarray, np.ndarray]:
        """(steps done, per-row metric totals, per-row counts), summed over replicas."""
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
        return int(step.numpy()), total.numpy(), count.numpy()

    def log(self, step: int, epoch: int) -> None:
        """Compute, write (chief) and reset: one logged point at TensorBoard ``step``."""
        # Traced once per set of switched-off tensors: every view is a few dozen
        # vectorised ops over all its tensors, so the trace is short.
        key = frozenset(self.off)
        fn = self._log_fns.get(key)
        if fn is None:
            fn = tf.function(self._compute, autograph=False)
            self._log_fns = {key: fn}
        plan = self._plan()
        with self.strategy.scope():
            blocks, activity = fn(tf.constant(step, tf.int64),
                                  tf.constant(float(epoch), tf.float64))
        if activity.shape[0]:
            act = activity.numpy()
            self.epoch_activity = act if self.epoch_activity is None else self.epoch_activity + act
        if self.writer is None:
            return
        protos = []
        for (view, specs), block in zip(plan, blocks, strict=True):
            vectors = block.numpy()
            for s, vec in zip(specs, vectors, strict=True):
                protos.append(summary_pb.tensor_stats_pb(
                    vec, view=view, name=s.name, layer=s.layer, depth=s.depth, shape=s.shape,
                    dtype=s.dtype, cadence=self.cadence, quantiles=self.quantiles,
                ).SerializeToString())
            summary = self.summaries.summary(
                view, [metadata.stats_tag(view, s.name) for s in specs], vectors,
                quantiles=self.quantiles, cadence=self.cadence)
            if summary is not None:
                protos.append(summary.SerializeToString())
        if protos:
            with self.writer.as_default():
                tf.summary.experimental.write_raw_pb(tf.constant(protos), step=step)

    def _plan(self) -> list[tuple[str, list[Monitored]]]:
        """What ``_compute`` returns, in order: (view, monitored tensors of its block)."""
        plan = []
        for view in ("variable", "gradient"):
            if self.want(view):
                plan.append((view, [s for s in self.var_specs if not _off(self, view, s.name)]))
        for view in self.out_vars:
            plan.append((view, [self.out_specs[j] for j in range(self.layout.n)
                                if self._writes_output(view, j)]))
        return [(view, specs) for view, specs in plan if specs]

    def write_activity(self, step: int, epoch: int) -> None:
        """Write (chief) and reset the epoch's per-channel and per-position activation rates
        of every layer output (``metadata.ACTIVITY_MAP``)."""
        act, self.epoch_activity = self.epoch_activity, None
        if act is None or self.writer is None:
            return
        protos = []
        for j, spec in enumerate(self.out_specs):
            channels, positions = self.layout.widths[j]
            count = act[j, 0]
            if count <= 0 or not self._writes_output("output", j) or (
                    channels <= 1 and positions == 0):
                continue
            units = max(positions, 1) * channels
            cnz = act[j, 1:1 + channels]
            snz = act[j, 1 + self.layout.cmax:1 + self.layout.cmax + positions]
            protos.append(summary_pb.activity_pb(
                cnz * channels / count, snz * max(positions, 1) / count, name=spec.name,
                samples=count / units, epoch=epoch, layer=spec.layer, depth=spec.depth,
                shape=spec.shape,
            ).SerializeToString())
        if protos:
            with self.writer.as_default():
                tf.summary.experimental.write_raw_pb(tf.constant(protos), step=step)

    # The computation of one logged point (traced once per set of switched-off tensors):
    # the statistics blocks of ``_plan`` and the output view's activity counts (see
    # ``epoch_activity``; ``[0, 0]`` without that view).
    def _compute(self, step: tf.Tensor, epoch: tf.Tensor) -> tuple[list[tf.Tensor], tf.Tensor]:
        blocks: list[tf.Tensor] = []
        q, k = self.quantiles, self.sample_size
        seed = tf.stack([step, tf.constant(self.seed, tf.int64)])
        updates = []  # assignments that must wait for every statistic
        index = {s.name: i for i, s in enumerate(self.var_specs)}
        plan = dict(self._plan())
        if "variable" in plan:
            rows = [index[s.name] for s in plan["variable"]]
            ws = [tf.convert_to_tensor(_value(self.variables[i])) for i in rows]
            prevs = [self.w_prev[i].read_value() for i in rows]
            block = kernels.matrix_stats(ws, "variable", q, k, seed)
            diff = stats.segment_dots([w - p for w, p in zip(ws, prevs, strict=True)])
            ratio = tf.sqrt(diff) / tf.sqrt(stats.segment_dots(ws))
            ilr = {}
            if self.grad_acc:
                ilr = self._implicit_lr(ws, prevs, [self.grad_acc[i].read_value() for i in rows],
                                        seed + 2)
            blocks.append(_fill(block, "variable", q, epoch, update_ratio=ratio, **ilr))
            updates += [lambda i=i, w=w: self.w_prev[i].assign(w)
                        for i, w in zip(rows, ws, strict=True)]
        if "gradient" in plan:
            rows = [index[s.name] for s in plan["gradient"]]
            gs = [self.grad_acc[i].read_value() for i in rows]  # SUM over replicas
            prevs = [self.grad_prev[i].read_value() for i in rows]
            block = kernels.matrix_stats(gs, "gradient", q, k, seed + 1)
            dots = stats.segment_dots
            cos = dots(gs, prevs) / tf.sqrt(dots(gs) * dots(prevs))
            cos = tf.where(self.has_grad_prev.read_value(), cos, np.nan)
            blocks.append(_fill(block, "gradient", q, epoch, cos_prev=cos))
            for i, g in zip(rows, gs, strict=True):
                updates.append(lambda i=i, g=g: self.grad_prev[i].assign(g))
                updates.append(lambda i=i, g=g: self.grad_acc[i].assign(tf.zeros_like(g)))
            updates.append(lambda: self.has_grad_prev.assign(True))
        views = list(self.out_vars)
        activity = tf.zeros([0, 0], tf.float64)
        if views:
            results = self.strategy.run(self._finalize_outputs, args=(epoch,))
            results = [self.strategy.experimental_local_results(r)[0] for r in results]
            if "output" in views:
                activity = results.pop()
            for view, block in zip(views, results, strict=True):
                keep = [j for j in range(self.layout.n) if self._writes_output(view, j)]
                if keep:
                    blocks.append(tf.gather(block, keep))
        with tf.control_dependencies([*blocks, activity]):
            for update in updates:
                update()
        return [tf.identity(b) for b in blocks], tf.identity(activity)

    def _implicit_lr(self, ws: list[tf.Tensor], prevs: list[tf.Tensor], gsums: list[tf.Tensor],
                     seed: tf.Tensor) -> dict[str, tf.Tensor]:
        """The ``ilr_q<p>`` columns: percentiles over each variable's elements of the
        implicit learning rate |w - w_prev| / |G|, with ``G`` the sum of the gradients over
        the window's steps (the accumulated sum over the sampled steps, times N with
        ``every=N`` where one step in N is sampled). Elements with no gradient are left out.
        For plain SGD this is the learning rate itself; Adam's per-element step sizes show as
        a spread.

        Percentiles of a diagnostic spread over orders of magnitude need no more than
        ``ILR_SAMPLE`` elements per variable (all of them in smaller ones: exact): uniform
        positions of one concatenated ratio buffer, then one sort of a ``[variables,
        ILR_SAMPLE]`` block. The full statistics pass would cost a third of a MobileNetV2
        point.
        """
        steps_per_sample = float(self.every) if isinstance(self.every, int) else 1.0
        sizes = np.array([int(w.shape.num_elements()) for w in ws], np.int64)
        dw = tf.concat([tf.reshape(tf.cast(w, tf.float32) - tf.cast(p, tf.float32), [-1])
                        for w, p in zip(ws, prevs, strict=True)], 0)
        g = tf.concat([tf.reshape(tf.cast(g, tf.float32), [-1]) for g in gsums], 0)
        g = tf.abs(g) * steps_per_sample
        rate = tf.abs(dw) / tf.where(g > 0, g, 1.0)
        rate = tf.where((g > 0) & tf.math.is_finite(rate), rate, np.inf)
        # Each row's positions in the buffer: every element of a small variable (then -1
        # padding), uniform draws in a large one.
        k = ILR_SAMPLE
        start = np.cumsum(sizes) - sizes
        every = np.arange(k)[None, :]
        fixed = np.where(every < sizes[:, None], start[:, None] + every, -1)
        large = sizes > k
        u = tf.random.stateless_uniform([len(ws), k], seed, dtype=tf.float64)
        drawn = tf.cast(start[:, None] + tf.floor(u * sizes[:, None]), tf.int64)
        pos = tf.where(large[:, None], drawn, fixed)
        picked = tf.where(pos >= 0, tf.gather(rate, tf.maximum(pos, 0)), np.inf)
        ordered = tf.cast(tf.sort(picked, axis=1), tf.float64)
        n = tf.reduce_sum(tf.cast(tf.math.is_finite(ordered), tf.float64), axis=1)
        # numpy's linear interpolation between the order statistics around rank q (n - 1).
        p = tf.constant(self.quantiles, tf.float64) / 100.0
        r = p[None, :] * tf.maximum(n - 1.0, 0.0)[:, None]
        lo = tf.cast(tf.floor(r), tf.int32)
        hi = tf.minimum(lo + 1, tf.maximum(tf.cast(n, tf.int32) - 1, 0)[:, None])
        a, b = (tf.gather(ordered, i, batch_dims=1) for i in (lo, hi))
        value = tf.where(hi > lo, a + (b - a) * (r - tf.cast(lo, tf.float64)), a)
        value = tf.where(n[:, None] > 0, value, np.nan)
        return {metadata.ILR_PREFIX + metadata.quantile_field(q): value[:, i]
                for i, q in enumerate(self.quantiles)}

    def _writes_output(self, view: str, j: int) -> bool:
        s = self.out_specs[j]
        if _off(self, view, s.name):
            return False
        if view == "output_gradient" and not s.has_grad:
            return False
        return True

    def _finalize_outputs(self, epoch: tf.Tensor) -> list[tf.Tensor]:
        """Replica context: merge every replica's states (one all_gather), finalize, reset."""
        ctx = tf.distribute.get_replica_context()
        layout, views = self.layout, list(self.out_vars)
        local = tf.stack([self.out_vars[v].read_value() for v in views])  # [V, N, L]
        replicas = ctx.num_replicas_in_sync if ctx is not None else 1
        activity = self.act_var.read_value() if "output" in views else None
        window = tf.cast(self.window.read_value(), tf.float64)
        stat_steps = tf.cast(self.stat_steps.read_value(), tf.float64)
        n = layout.n
        steps = {"stats_steps": tf.fill([n], stat_steps), "steps": tf.fill([n], window)}
        if replicas > 1:
            gathered = ctx.all_gather(local[tf.newaxis], axis=0)  # [R, V, N, L]
            gathered = tf.reshape(gathered, [replicas, len(views), layout.n, sum(layout.sizes)])
            if activity is not None:
                activity = tf.reduce_sum(ctx.all_gather(activity[tf.newaxis], axis=0), 0)
        blocks = []
        for vi, view in enumerate(views):
            if replicas > 1:
                state = stats.merge_stacked(layout.unpack(gathered[:, vi]))
            else:
                state = layout.unpack(local[vi])
            columns = dict(steps)
            if view == "output":  # the rectifiers' activity counts every step of the window
                cmax = layout.cmax
                state = dict(state, activity_count=activity[:, 0],
                             channel_nnz=activity[:, 1:1 + cmax],
                             spatial_nnz=activity[:, 1 + cmax:])
                exact = tf.constant(self.exact_rows & (self.every == "epoch"))
                columns.update(activity_steps=tf.where(exact, window, stat_steps))
            block = kernels.finalize_many_fn(view, self.quantiles, layout.k)(state)
            blocks.append(_fill(block, view, self.quantiles, epoch, **columns))
        if activity is not None:
            blocks.append(activity)
        with tf.control_dependencies(blocks):
            for view in views:
                self.out_vars[view].assign(tf.constant(layout.empty))
            if activity is not None:
                self.act_var.assign(tf.zeros_like(activity))
            self.window.assign(0)
            self.stat_steps.assign(0)
        return [tf.identity(b) for b in blocks]


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

    def _seed(self, j: int, salt: int) -> tf.Tensor:
        return tf.stack([self.step * 4 + salt, self.replica * 100003 + j + self.c.seed])

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
        if "output" in c.out_vars and not _off(c, "output", spec.name):
            self.output_value(j, x)
            c.output_seen.add(j)
        if (
            "output_gradient" in c.out_vars
            and self.mode is not StepMode.LEAN
            and spec.has_grad
            and capture.is_float(x.dtype)
            and not _off(c, "output_gradient", spec.name)
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
        if view not in c.out_vars or _off(c, view, name):
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
        if private.in_xla_context():
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
            if self.mode is StepMode.LEAN and private.in_xla_context():
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
        xla = private.in_xla_context()
        empty = {k: tf.constant(v) for k, v in layout.empty_row.items()}
        activity = self._no_activity()
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
                    part = fn(t, self._seed(j, 2 if view == "output" else 3))
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
            if g is None or i is None or _off(c, "gradient", c.var_specs[i].name):
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

            if self.loss_scale is not None and c.every == "epoch":
                # A loss-scaled step with overflowed gradients is skipped by the
                # optimizer; leave it out of the epoch sum too (it would be inf).
                finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for _, g in dense])
                self._when_sampled(lambda: _run_if(finite, add))
            else:
                self._when_sampled(add)
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



def _run_if(pred: Any, fn: Callable[[], Any]) -> None:
    """Run the side effects of ``fn`` when ``pred`` holds (eagerly or as a ``tf.cond``)."""
    if tf.executing_eagerly():
        if bool(pred):
            fn()
        return

    def run():
        fn()
        return tf.constant(0)

    tf.cond(pred, run, lambda: tf.constant(0))


def _off(c: Collector, view: str, name: str) -> bool:
    return Part(view, name) in c.off or Part(view) in c.off


def _value(v: Any) -> Any:
    """The TF value of a Keras 3 variable (or a tf.Variable itself)."""
    if isinstance(v, tf.Variable):
        return v
    return getattr(v, "value", v)


def _fill(block: tf.Tensor, view: str, quantiles: Sequence[float], epoch: tf.Tensor,
          **columns: tf.Tensor) -> tf.Tensor:
    """``block`` [N, fields] with the epoch column and the named per-row slots set."""
    fields = metadata.tensor_stats_fields(view, quantiles)
    cols = tf.unstack(block, num=len(fields), axis=1)
    cols[0] = tf.fill(tf.shape(cols[0]), tf.cast(epoch, tf.float64))
    for key, value in columns.items():
        cols[fields.index(key)] = tf.cast(value, tf.float64)
    return tf.stack(cols, axis=1)
