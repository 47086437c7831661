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

from tb_introspect import stats

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
def tensor_stats_fn(view: str, dtype: str, quantiles: tuple[float, ...], sample_size: int,
                    xla: bool):
    """``(x[rows, channels], seed) -> stats vector``."""

    @tf.function(
        input_signature=[tf.TensorSpec([None, None], tf.as_dtype(dtype)), _SEED],
        autograph=False, jit_compile=True if xla else None, experimental_attributes=_attrs(xla),
    )
    def tensor_stats(x, seed):
        return stats.tensor_stats(x, view, quantiles=quantiles, sample_size=sample_size,
                                  seed=seed)

    return tensor_stats


@functools.cache
def update_fn(rank: int, dtype: str, k: int, xla: bool):
    """``(state, x[canonical], seed) -> state``."""

    @tf.function(
        input_signature=[
            _state_signature(k), tf.TensorSpec([None] * rank, tf.as_dtype(dtype)), _SEED,
        ],
        autograph=False, jit_compile=True if xla else None, experimental_attributes=_attrs(xla),
    )
    def update(state, x, seed):
        return stats.update_state(state, x, seed=seed)

    return update


@functools.cache
def finalize_fn(view: str, quantiles: tuple[float, ...], k: int):
    """``state -> stats vector``."""

    @tf.function(input_signature=[_state_signature(k)], autograph=False,
                 experimental_attributes=_NOINLINE)
    def finalize(state):
        return stats.finalize(state, view, quantiles=quantiles)

    return finalize


@functools.cache
def merge_fn(k: int):
    """``states stacked on a leading axis -> merged state``."""

    @tf.function(input_signature=[_state_signature(k, stacked=True)], autograph=False,
                 experimental_attributes=_NOINLINE)
    def merge(stacked):
        return stats.merge_stacked(stacked)

    return merge
