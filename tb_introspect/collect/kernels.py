"""Shape-polymorphic ``tf.function`` wrappers of the ``stats`` kernels.

One statistics computation is a graph of about a thousand ops; inlining one per
monitored tensor makes a ResNet's train step and logging function take minutes
to trace. Here every kernel is a nested ``tf.function`` with unknown
dimensions in its input signature, traced once per (kind, dtype) and called
from the outer graphs as a single op, whatever the number of tensors.

Tensors are brought to a canonical rank first: variables/gradients to
``[rows, channels]`` (the last axis stays the channel axis, so the dead rate
keeps its meaning; a weight has no spatial axes, so its spatial dead rate is
NaN), layer outputs to ``[batch, channels]`` or ``[batch, positions,
channels]`` (all spatial/time axes flattened into one, which leaves the dead
rates unchanged).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from tb_introspect import metadata, stats
from tb_introspect.collect import lean

_SEED = tf.TensorSpec([2], tf.int64)
# Outside XLA, nested function calls are inlined into the caller before graph
# optimisation, which makes that cost grow with the number of call sites again
# (14 s instead of 2.4 s for 20 tensors, measured); "_noinline" keeps one copy.
_NOINLINE = {"_noinline": True}


def _attrs(xla: bool) -> dict | None:
    return None if xla else _NOINLINE


def in_xla_context() -> bool:
    """Whether ops built now are compiled by XLA (the caller's ``jit_compile=True``)."""
    try:
        from tensorflow.python.framework import ops
        from tensorflow.python.ops import control_flow_util
    except ImportError:  # private modules moved: assume XLA, the variant that works everywhere
        return True
    return bool(control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph()))


def as_matrix(x: tf.Tensor) -> tf.Tensor:
    """A variable or gradient as ``[rows, channels]``."""
    rank = x.shape.rank
    if rank == 0:
        return tf.reshape(x, [1, 1])
    if rank == 1:
        return x[tf.newaxis]
    c = x.shape[-1]
    return tf.reshape(x, [-1, c if c is not None else tf.shape(x)[-1]])


def activation_shape(shape: Sequence[int | None]) -> tuple[int | None, ...]:
    """Canonical shape (batch unknown) of a layer output of static ``shape``."""
    shape = list(shape)
    rank = len(shape)
    if rank <= 1:
        return (None, 1)
    c = shape[-1]
    if c is None:
        return (None, 1)
    spatial = shape[1:-1]
    if rank >= 3 and all(d is not None for d in spatial):
        return (None, int(np.prod(spatial, dtype=np.int64)), c)
    return (None, c)


def as_activation(x: tf.Tensor, canonical: Sequence[int | None]) -> tf.Tensor:
    """A layer output reshaped to its canonical shape (see ``activation_shape``)."""
    if len(canonical) == 3:
        return tf.reshape(x, [tf.shape(x)[0], canonical[1], canonical[2]])
    if canonical[1] == 1:
        return tf.reshape(x, [-1, 1])
    return tf.reshape(x, [-1, canonical[1]])


def _state_signature(k: int, stacked: bool = False) -> dict[str, tf.TensorSpec]:
    """Any state with a ``k``-value sample (channel/spatial flag counts left open)."""
    lead = [None] if stacked else []
    sig = {}
    for key in stats.STATE_MERGE:
        if key in ("channel_active", "spatial_active"):
            sig[key] = tf.TensorSpec(lead + [None], tf.float64)
        elif key in ("sample_keys", "sample_values"):
            sig[key] = tf.TensorSpec(lead + [k], tf.float64)
        else:
            sig[key] = tf.TensorSpec(lead, tf.float64)
    return sig


@functools.cache
def parts_fn(dtype: str, k: int):
    """``(x[rows, channels], seed) -> state`` of one tensor (``lean.parts``)."""

    @tf.function(
        input_signature=[tf.TensorSpec([None, None], tf.as_dtype(dtype)), _SEED],
        autograph=False, experimental_attributes=_NOINLINE,
    )
    def tensor_parts(x, seed):
        return lean.parts(x, k, seed)

    return tensor_parts


def matrix_state(x: tf.Tensor, k: int, seed: tf.Tensor) -> dict[str, tf.Tensor]:
    """State of a variable or gradient (as ``[rows, channels]``), static flag shapes."""
    m = as_matrix(x)
    state = parts_fn(m.dtype.name, k)(m, seed)
    state["channel_active"].set_shape([m.shape[-1]])
    state["spatial_active"].set_shape([0])
    return state


@functools.cache
def update_fn(rank: int, dtype: str, k: int, xla: bool):
    """``(state, x[canonical], seed) -> state`` with x folded in."""

    @tf.function(
        input_signature=[
            _state_signature(k), tf.TensorSpec([None] * rank, tf.as_dtype(dtype)), _SEED,
        ],
        autograph=False, jit_compile=True if xla else None, experimental_attributes=_attrs(xla),
    )
    def update(state, x, seed):
        new = lean.parts(x, k, seed)
        return stats.merge_stacked({key: tf.stack([state[key], new[key]]) for key in state})

    return update


@functools.cache
def finalize_many_fn(view: str, quantiles: tuple[float, ...], k: int):
    """States stacked on a leading axis (flags padded) -> one stats vector per row."""

    @tf.function(input_signature=[_state_signature(k, stacked=True)],
                 autograph=False, experimental_attributes=_NOINLINE)
    def finalize_many(stacked):
        # One vectorised finalize instead of one per tensor (4x faster for 50 tensors).
        return tf.vectorized_map(
            lambda s: stats.finalize(s, view, quantiles=quantiles), stacked
        )

    return finalize_many


def finalize_many(states: Sequence[dict[str, tf.Tensor]], view: str,
                  quantiles: tuple[float, ...], k: int) -> tf.Tensor:
    """Statistics vectors ``[len(states), fields]`` of many states (any flag sizes)."""
    widths = {key: max(int(s[key].shape[0]) for s in states)
              for key in ("channel_active", "spatial_active")}
    stacked = {}
    for key in stats.STATE_MERGE:
        items = [s[key] for s in states]
        if key in widths:
            # Padding with "active" flags; the dead-rate slots are recomputed below
            # from the real flags.
            items = [tf.pad(t, [[0, widths[key] - int(t.shape[0])]], constant_values=1.0)
                     for t in items]
        stacked[key] = tf.stack(items)
    vectors = finalize_many_fn(view, quantiles, k)(stacked)
    fields = list(metadata.tensor_stats_fields(view, quantiles))
    dead = tf.stack([_dead_rate(s["channel_active"], s["count"]) for s in states])
    sdead = tf.stack([_dead_rate(s["spatial_active"], s["count"]) for s in states])
    cols = tf.unstack(vectors, axis=1)
    cols[fields.index("dead_rate")] = dead
    cols[fields.index("spatial_dead_rate")] = sdead
    return tf.stack(cols, axis=1)


def _dead_rate(flags: tf.Tensor, count: tf.Tensor) -> tf.Tensor:
    """1 - mean(flags); NaN when the tensor is empty or has no flags (as ``stats``)."""
    size = tf.cast(tf.size(flags), tf.float64)
    ok = (count > 0) & (size > 0)
    rate = (size - tf.reduce_sum(flags)) / tf.maximum(size, 1.0)
    return tf.where(ok, rate, tf.constant(float("nan"), tf.float64))


@functools.cache
def merge_fn(k: int):
    """``states stacked on a leading axis -> merged state``."""

    @tf.function(input_signature=[_state_signature(k, stacked=True)], autograph=False,
                 experimental_attributes=_NOINLINE)
    def merge(stacked):
        return stats.merge_stacked(stacked)

    return merge
