"""The Keras side's logged point: one traced function reads the window's accumulators and
finalizes the layer outputs' states; the weights and gradient sums go to the host as they are.

At logging time gradient sums are read with a SUM over replicas and the variables as they
are (one host copy each: their statistics are the framework-neutral ``pipeline.params``'s,
in numpy, as PyTorch's are); output states are gathered from all replicas (one
``all_gather``), merged and finalized with ``stats.finalize`` (vectorised over tensors); the
accumulators are reset. What happens to the vectors then is the framework-neutral
pipeline's (``pipeline/point.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import tensorflow as tf

from tb_introspect import stats
from tb_introspect.collect import kernels

if TYPE_CHECKING:
    from tb_introspect.collect.collector import Collector


def compute(c: Collector) -> tuple[list[tf.Tensor], list[tf.Tensor], list[tf.Tensor],
                                   list[tf.Tensor]]:
    """The output views' blocks (``c.output_blocks()``), ``[activity, window,
    stats_steps, skipped]``, the weights (``[]`` without the variable view) and the
    gradient sums (``[]`` without the gradient view) of every variable (traced once per
    set of switched-off tensors)."""
    updates = []  # assignments that must wait for every read
    skipped = tf.zeros([0, 3], tf.float64)
    ws = [tf.convert_to_tensor(value_of(v)) for v in c.variables] if c.want("variable") else []
    gs = [acc.read_value() for acc in c.grad_acc]  # SUM over replicas
    for acc, g in zip(c.grad_acc, gs, strict=True):
        updates.append(lambda acc=acc, g=g: acc.assign(tf.zeros_like(g)))
    if c.grad_skipped is not None:
        skipped = c.grad_skipped.read_value()  # SUM over replicas
        updates.append(lambda: c.grad_skipped.assign(tf.zeros_like(skipped)))
    views = list(c.out_vars)
    blocks = []
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
    with tf.control_dependencies([*blocks, *tail, *ws, *gs]):
        for update in updates:
            update()
    return [tf.identity(b) for b in blocks], [tf.identity(t) for t in tail], ws, gs


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
        blocks.append(kernels.finalize_many_fn(view, c.quantiles, layout.k)(state))
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


def value_of(v: Any) -> Any:
    """The TF value of a Keras 3 variable (or a tf.Variable itself)."""
    if isinstance(v, tf.Variable):
        return v
    return getattr(v, "value", v)

