"""Shape-polymorphic ``tf.function`` wrappers of the ``stats`` kernels.

One statistics computation is a graph of about a thousand ops; inlining one per
monitored tensor makes a ResNet's train step take minutes to trace. Here every
kernel is a nested ``tf.function`` with unknown dimensions in its input signature,
traced once per (kind, dtype) and called from the outer graphs as a single op,
whatever the number of tensors. Nothing of a logged point is here: its statistics
are taken on the host (``point_graph.py``).

Layer outputs are brought to a canonical rank first: ``[batch, channels]`` or
``[batch, positions, channels]`` (all spatial/time axes flattened into one, which
leaves the dead rates unchanged).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import tensorflow as tf

from tb_introspect import stats

_SEED = tf.TensorSpec([2], tf.int64)
# Outside XLA, nested function calls are inlined into the caller before graph
# optimisation, which makes that cost grow with the number of call sites again
# (14 s instead of 2.4 s for 20 tensors, measured); "_noinline" keeps one copy.
_NOINLINE = {"_noinline": True}


def _attrs(xla: bool) -> dict | None:
    return None if xla else _NOINLINE


def activation_shape(shape: Sequence[int | None]) -> tuple[int | None, ...]:
    """Canonical shape (``stats.canonical_shape``, batch unknown) of a layer output of
    static ``shape``. A layer output's axis 0 is its batch, so one of rank <= 1, or of
    unknown channel count, is values of one unit."""
    shape = list(shape)
    if len(shape) <= 1 or shape[-1] is None:
        return (None, 1)
    return stats.canonical_shape(shape)


def as_activation(x: tf.Tensor, canonical: Sequence[int | None]) -> tf.Tensor:
    """A layer output reshaped to its canonical shape (see ``activation_shape``)."""
    if x.shape.rank <= 1:
        return tf.reshape(x, [-1, 1])
    return stats.as_canonical(x, canonical)


@functools.cache
def activation_parts_fn(rank: int, dtype: str, sample_size: int, xla: bool):
    """``(x[canonical], seed) -> state`` of one layer output (``stats.batch_state``)."""

    @tf.function(
        input_signature=[tf.TensorSpec([None] * rank, tf.as_dtype(dtype)), _SEED],
        autograph=False, jit_compile=True if xla else None, experimental_attributes=_attrs(xla),
    )
    def activation_parts(x, seed):
        return stats.batch_state(x, sample_size, seed)

    return activation_parts


def pad_state(state: dict[str, tf.Tensor], channels: int, positions: int
              ) -> dict[str, tf.Tensor]:
    """Channel/position counts zero-padded to common widths, so states of different
    tensors stack."""
    out = dict(state)
    for key, width in (("channel_nnz", channels), ("spatial_nnz", positions)):
        t = state[key]
        out[key] = tf.pad(t, [[0, width - int(t.shape[0])]])
    return out
