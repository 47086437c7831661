"""Shape-polymorphic ``tf.function`` wrappers of the ``stats`` kernels.

One statistics computation is a graph of about a thousand ops; inlining one per
monitored tensor makes a ResNet's train step and logging function take minutes
to trace. Here every kernel is a nested ``tf.function`` with unknown
dimensions in its input signature, traced once per (kind, dtype) and called
from the outer graphs as a single op, whatever the number of tensors.

Layer outputs are brought to a canonical rank first: ``[batch, channels]`` or
``[batch, positions, channels]`` (all spatial/time axes flattened into one, which
leaves the dead rates unchanged). Variables and gradient sums are not here: their
statistics are taken on the host (``pipeline/params.py``).
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


def _state_signature(sample_size: int | None, stacked: bool = False
                     ) -> dict[str, tf.TensorSpec]:
    """Any state with a ``sample_size``-value sample (channel/spatial widths left open;
    ``None``: any sample size)."""
    lead = [None] if stacked else []
    sig = {}
    for key in stats.STATE_MERGE:
        if key in ("channel_nnz", "spatial_nnz"):
            sig[key] = tf.TensorSpec(lead + [None], tf.float64)
        elif key in ("sample_keys", "sample_values"):
            sig[key] = tf.TensorSpec(lead + [sample_size], tf.float64)
        else:
            sig[key] = tf.TensorSpec(lead, tf.float64)
    return sig


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


def finalize_many_fn(view: str | None, quantiles: tuple[float, ...], sample_size: int):
    """States stacked on a leading axis (counts padded), with samples of at most
    ``sample_size`` values -> one stats vector per row (``view`` None: the slots every view
    shares). A larger ``sample_size`` costs a few more rounds of the percentile search,
    not another trace: callers with several sample sizes pass the largest."""
    shared = _finalize_shared_fn(tuple(quantiles), sample_size)
    if view is None:
        return shared
    return lambda stacked: stats.with_extra_slots(shared(stacked), view, quantiles)


@functools.cache
def _finalize_shared_fn(quantiles: tuple[float, ...], sample_size: int):
    # One graph for every view, any number of tensors and every sample class: tracing it is
    # most of a first point's cost (tf.vectorized_map of a one-state finalize took seconds
    # to convert; a graph per sample class was a dozen traces on MobileNetV2, one per view
    # four).
    @tf.function(input_signature=[_state_signature(None, stacked=True)],
                 autograph=False, experimental_attributes=_NOINLINE)
    def finalize_many(stacked):
        return stats.finalize(stacked, None, quantiles=quantiles, sample_bound=sample_size)

    return finalize_many


def pad_state(state: dict[str, tf.Tensor], channels: int, positions: int
              ) -> dict[str, tf.Tensor]:
    """Channel/position counts zero-padded to common widths, so states of different
    tensors stack."""
    out = dict(state)
    for key, width in (("channel_nnz", channels), ("spatial_nnz", positions)):
        t = state[key]
        out[key] = tf.pad(t, [[0, width - int(t.shape[0])]])
    return out
