"""The Keras side's logged point: the window's accumulators finalized in one traced function.

At logging time gradient sums are read with a SUM over replicas, variables and gradient
sums become states with ``stats.many_states`` (segment reductions over all tensors at once),
output states are gathered from all replicas (one ``all_gather``) and merged, everything is
finalized with ``stats.finalize`` (vectorised over tensors), the slots only TensorFlow holds
the inputs of are filled (``update_ratio``, ``ilr_q<p>``, ``cos_prev``), and the
accumulators are reset. What happens to the vectors then is the framework-neutral
pipeline's (``pipeline/point.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from tb_introspect import metadata, stats
from tb_introspect.collect import kernels
from tb_introspect.stats.segments import Segments, concat_flat
from tb_introspect.stats_np import ILR_SAMPLE

if TYPE_CHECKING:
    from tb_introspect.collect.collector import Collector

def compute(c: Collector, step: tf.Tensor) -> tuple[list[tf.Tensor], list[tf.Tensor]]:
    """The statistics blocks of ``c.blocks()``, and ``[activity, window, stats_steps,
    skipped]`` (traced once per set of switched-off tensors)."""
    blocks: list[tf.Tensor] = []
    q, k = c.quantiles, c.sample_size
    seed = tf.stack([step, tf.constant(c.seed, tf.int64)])
    updates = []  # assignments that must wait for every statistic
    index = {s.name: i for i, s in enumerate(c.var_specs)}
    plan = dict(c.blocks())
    skipped = tf.zeros([0, 3], tf.float64)
    var_rows = [index[s.name] for s in plan.get("variable", [])]
    grad_rows = [index[s.name] for s in plan.get("gradient", [])]
    ws = [tf.convert_to_tensor(value_of(c.variables[i])) for i in var_rows]
    gs = [c.grad_acc[i].read_value() for i in grad_rows]  # SUM over replicas
    # One call for both views: the same shapes, so the same groups, traced once.
    shared = (kernels.matrix_stats(ws + gs, None, q, k, seed, bound=finalize_bound(c))
              if ws or gs else None)
    # Norms, update ratios and cosines: each list concatenated once, one segment sum each.
    fg = concat_flat(gs) if gs else None
    if ws:
        fw = concat_flat(ws)
        dw = fw - concat_flat([c.w_prev[i].read_value() for i in var_rows])
        seg = Segments([int(w.shape.num_elements()) for w in ws])
        ratio = tf.sqrt(seg.sum(dw * dw)) / tf.sqrt(seg.sum(fw * fw))
        ilr = {}
        if c.grad_acc:
            g = fg if var_rows == grad_rows else concat_flat(
                [c.grad_acc[i].read_value() for i in var_rows])
            ilr = implicit_lr(c, seg.sizes, dw, g, seed + 2)
        blocks.append(stats.with_extra_slots(shared[:len(ws)], "variable", q,
                                             update_ratio=ratio, **ilr))
        updates += [lambda i=i, w=w: c.w_prev[i].assign(w)
                    for i, w in zip(var_rows, ws, strict=True)]
    if gs:
        fp = concat_flat([c.grad_prev[i].read_value() for i in grad_rows])
        seg = Segments([int(g.shape.num_elements()) for g in gs])
        cos = seg.sum(fg * fp) / tf.sqrt(seg.sum(fg * fg) * seg.sum(fp * fp))
        cos = tf.where(c.has_grad_prev.read_value(), cos, np.nan)
        blocks.append(stats.with_extra_slots(shared[len(ws):], "gradient", q, cos_prev=cos))
        for i, g in zip(grad_rows, gs, strict=True):
            updates.append(lambda i=i, g=g: c.grad_prev[i].assign(g))
            updates.append(lambda i=i, g=g: c.grad_acc[i].assign(tf.zeros_like(g)))
        updates.append(lambda: c.has_grad_prev.assign(True))
        if c.grad_skipped is not None:
            skipped = c.grad_skipped.read_value()  # SUM over replicas
            updates.append(lambda: c.grad_skipped.assign(tf.zeros_like(skipped)))
    views = list(c.out_vars)
    tail = [tf.zeros([0, 0], tf.float64), tf.constant(0.0, tf.float64),
            tf.constant(0.0, tf.float64)]
    if views:
        results = c.strategy.run(finalize_outputs, args=(c,))
        results = [c.strategy.experimental_local_results(r)[0] for r in results]
        tail = results[len(views):]
        for view, block in zip(views, results[:len(views)], strict=True):
            keep = [j for j in range(c.layout.n) if c.writes_output(view, j)]
            if keep:
                blocks.append(tf.gather(block, keep))
    tail.append(skipped)
    with tf.control_dependencies([*blocks, *tail]):
        for update in updates:
            update()
    return [tf.identity(b) for b in blocks], [tf.identity(t) for t in tail]


def implicit_lr(c: Collector, sizes: Sequence[int], dw: tf.Tensor, gsum: tf.Tensor,
                seed: tf.Tensor) -> dict[str, tf.Tensor]:
    """The ``ilr_q<p>`` columns: percentiles over each variable's elements of the
    implicit learning rate |w - w_prev| / |G|, with ``G`` the sum of the gradients over
    the window's steps (the accumulated sum over the sampled steps, times N with
    ``every=N`` where one step in N is sampled). Elements with no gradient are left out.
    For plain SGD this is the learning rate itself; Adam's per-element step sizes show as
    a spread. ``dw`` and ``gsum`` are the variables' ``w - w_prev`` and gradient sums, each
    concatenated flat; ``sizes`` their element counts.

    Percentiles of a diagnostic spread over orders of magnitude need no more than
    ``ILR_SAMPLE`` elements per variable (all of them in smaller ones: exact): uniform
    positions of one concatenated ratio buffer, then one sort of a ``[variables,
    ILR_SAMPLE]`` block. The full statistics pass would cost a third of a MobileNetV2
    point.
    """
    steps_per_sample = float(c.every) if isinstance(c.every, int) else 1.0
    sizes = np.array(sizes, np.int64)
    g = tf.abs(tf.cast(gsum, tf.float32)) * steps_per_sample
    rate = tf.abs(tf.cast(dw, tf.float32)) / tf.where(g > 0, g, 1.0)
    rate = tf.where((g > 0) & tf.math.is_finite(rate), rate, np.inf)
    # Each row's positions in the buffer: every element of a small variable (then -1
    # padding), uniform draws in a large one.
    k = ILR_SAMPLE
    start = np.cumsum(sizes) - sizes
    every = np.arange(k)[None, :]
    fixed = np.where(every < sizes[:, None], start[:, None] + every, -1)
    large = sizes > k
    u = tf.random.stateless_uniform([len(sizes), k], seed, dtype=tf.float64)
    drawn = tf.cast(start[:, None] + tf.floor(u * sizes[:, None]), tf.int64)
    pos = tf.where(large[:, None], drawn, fixed)
    picked = tf.where(pos >= 0, tf.gather(rate, tf.maximum(pos, 0)), np.inf)
    ordered = tf.cast(tf.sort(picked, axis=1), tf.float64)
    n = tf.reduce_sum(tf.cast(tf.math.is_finite(ordered), tf.float64), axis=1)
    # numpy's linear interpolation between the order statistics around rank q (n - 1).
    p = tf.constant(c.quantiles, tf.float64) / 100.0
    r = p[None, :] * tf.maximum(n - 1.0, 0.0)[:, None]
    lo = tf.cast(tf.floor(r), tf.int32)
    hi = tf.minimum(lo + 1, tf.maximum(tf.cast(n, tf.int32) - 1, 0)[:, None])
    a, b = (tf.gather(ordered, i, batch_dims=1) for i in (lo, hi))
    value = tf.where(hi > lo, a + (b - a) * (r - tf.cast(lo, tf.float64)), a)
    value = tf.where(n[:, None] > 0, value, np.nan)
    return {metadata.ILR_PREFIX + metadata.quantile_field(q): value[:, i]
            for i, q in enumerate(c.quantiles)}


def finalize_outputs(c: Collector) -> list[tf.Tensor]:
    """Replica context: merge every replica's output states (one all_gather) and finalize
    them; reset the window. Returns each output view's block, then the activity counts
    ``[outputs, 1 + channels + positions]`` (``[0, 0]`` without the output view), the
    window's steps and its statistics steps."""
    ctx = tf.distribute.get_replica_context()
    layout, views = c.layout, list(c.out_vars)
    local = tf.stack([c.out_vars[v].read_value() for v in views])  # [V, N, L]
    replicas = ctx.num_replicas_in_sync if ctx is not None else 1
    activity = c.act_var.read_value() if "output" in views else None
    window = tf.cast(c.window.read_value(), tf.float64)
    stat_steps = tf.cast(c.stat_steps.read_value(), tf.float64)
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
        if view == "output":  # the rectifiers' activity counts every step of the window
            cmax = layout.cmax
            state = dict(state, activity_count=activity[:, 0],
                         channel_nnz=activity[:, 1:1 + cmax],
                         spatial_nnz=activity[:, 1 + cmax:])
        blocks.append(kernels.finalize_many_fn(view, c.quantiles, finalize_bound(c))(state))
    tail = [activity if activity is not None else tf.zeros([0, 0], tf.float64),
            window, stat_steps]
    with tf.control_dependencies(blocks + tail):
        for view in views:
            c.out_vars[view].assign(tf.constant(layout.empty))
        if activity is not None:
            c.act_var.assign(tf.zeros_like(activity))
        c.window.assign(0)
        c.stat_steps.assign(0)
    return [tf.identity(b) for b in blocks + tail]


def finalize_bound(c: Collector) -> int:
    """The sample bound of every finalize of a point: the largest sample, so that one trace
    serves them all."""
    return max(c.sample_size, c.layout.k if c.layout is not None else 0)


def value_of(v: Any) -> Any:
    """The TF value of a Keras 3 variable (or a tf.Variable itself)."""
    if isinstance(v, tf.Variable):
        return v
    return getattr(v, "value", v)

