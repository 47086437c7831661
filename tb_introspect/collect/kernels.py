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


def _state_signature(k: int | None, stacked: bool = False) -> dict[str, tf.TensorSpec]:
    """Any state with a ``k``-value sample (channel/spatial widths left open; ``None``: any
    sample size)."""
    lead = [None] if stacked else []
    sig = {}
    for key in stats.STATE_MERGE:
        if key in ("channel_nnz", "spatial_nnz"):
            sig[key] = tf.TensorSpec(lead + [None], tf.float64)
        elif key in ("sample_keys", "sample_values"):
            sig[key] = tf.TensorSpec(lead + [k], tf.float64)
        else:
            sig[key] = tf.TensorSpec(lead, tf.float64)
    return sig


#: The smallest sample class. A tensor smaller than ``k`` gets a sample of the smallest
#: power of two (from this one) that holds all its values, so its percentiles stay exact while
#: the sample blocks that are drawn, gathered and sorted hold no empty slots to speak of:
#: those slots were most of the cost of a logged point of many small and mid-sized tensors
#: (MobileNetV2: 158 variables, 107 of them at most 1,024 elements). One traced finalize per
#: class: at most log2(k / 64) + 1 of them.
SMALL_TENSOR = 64


def sample_bound(size: int | None, k: int) -> int:
    """The smallest percentile sample that holds a tensor of ``size`` elements (``k`` at most)."""
    if size is None or size >= k:
        return k
    return min(k, max(SMALL_TENSOR, 1 << max(int(size) - 1, 0).bit_length()))


#: The fixed cost of one group of tensors at logging time (one ``stats.many_states`` and
#: one stacked finalize), in sample slots of the same time. ``engine_bench.py``'s group rows
#: measure it: 8,000 slots as one fused call on a 2-core CPU, 25,000 when the two are timed
#: as separate calls; the larger value, which merges more, is the one the Flatten CNN's
#: logged point was measured with (its small variables: 5 groups -> 2, 8.9 -> 6.2 ms).
GROUP_COST_SLOTS = 25_000


def sample_groups(sizes: Sequence[int | None], k: int) -> dict[int, list[int]]:
    """Tensors (by index) grouped by the sample size they share: adjacent sample classes
    (``sample_bound``) merge into the larger one where that costs fewer padded slots than
    the group it saves (``GROUP_COST_SLOTS``), by dynamic programming over the classes."""
    classes: dict[int, list[int]] = {}
    for n, size in enumerate(sizes):
        classes.setdefault(sample_bound(size, k), []).append(n)
    bounds = sorted(classes)
    counts = np.cumsum([0] + [len(classes[b]) for b in bounds])
    # best[j]: the cheapest grouping of the first j classes; a group is classes i..j-1,
    # each of its tensors sampled at bounds[j - 1].
    best, cut = [0.0] + [np.inf] * len(bounds), [0] * (len(bounds) + 1)
    for j in range(1, len(bounds) + 1):
        for i in range(j):
            cost = best[i] + GROUP_COST_SLOTS + bounds[j - 1] * (counts[j] - counts[i])
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups, j = {}, len(bounds)
    while j:
        i = cut[j]
        groups[bounds[j - 1]] = [n for b in bounds[i:j] for n in classes[b]]
        j = i
    return groups


#: Tensors of at least this many elements get a state of their own at logging time
#: (``stats.batch_state``'s per-tensor reductions): on large tensors those are about 3x
#: faster than the segment reductions of ``stats.many_states``.
LARGE_TENSOR = 2**18


def matrix_stats(tensors: Sequence[tf.Tensor], view: str | None, quantiles: tuple[float, ...],
                 k: int, seed: tf.Tensor, bound: int | None = None) -> tf.Tensor:
    """Statistics vectors ``[len(tensors), fields]`` of variables or gradients (``view``
    None: the slots every view shares, so that one call serves both views); ``bound``: the
    finalize's sample bound, ``k`` or more (one traced finalize for every sample size).

    Tensors are batched by sample size (``sample_groups``), each batch in one
    ``stats.many_states`` computation and one stacked finalize; each tensor of at least
    ``LARGE_TENSOR`` elements is one thorough ``stats.batch_state``.
    """
    sizes = [t.shape.num_elements() for t in tensors]
    large = [n for n, size in enumerate(sizes) if size >= LARGE_TENSOR]
    rest = [n for n, size in enumerate(sizes) if size < LARGE_TENSOR]
    groups = sample_groups([sizes[n] for n in rest], k)
    finalize = finalize_many_fn(None, quantiles, max(k, bound or k))
    rows, order = [], []
    for g, (kk, positions) in enumerate(sorted(groups.items())):
        members = [rest[p] for p in positions]
        state = stats.many_states([tensors[n] for n in members], kk, seed + [0, g])
        rows.append(finalize(state))
        order += members
    for g, n in enumerate(large):
        t = stats.to_float(tensors[n])
        matrix = stats.as_canonical(t, stats.canonical_shape(t.shape.as_list(), spatial=False))
        state = activation_parts_fn(2, t.dtype.name, k, False, thorough=True)(matrix, seed + [1, g])
        rows.append(finalize({key: v[tf.newaxis] for key, v in state.items()}))
        order.append(n)
    block = tf.gather(tf.concat(rows, 0), np.argsort(order))
    return block if view is None else stats.with_extra_slots(block, view, quantiles)


@functools.cache
def activation_parts_fn(rank: int, dtype: str, k: int, xla: bool, thorough: bool = False):
    """``(x[canonical], seed) -> state`` of one layer output (``stats.batch_state``), or
    with ``thorough`` of one large variable or gradient sum."""

    @tf.function(
        input_signature=[tf.TensorSpec([None] * rank, tf.as_dtype(dtype)), _SEED],
        autograph=False, jit_compile=True if xla else None, experimental_attributes=_attrs(xla),
    )
    def activation_parts(x, seed):
        return stats.batch_state(x, k, seed, thorough=thorough)

    return activation_parts


def finalize_many_fn(view: str | None, quantiles: tuple[float, ...], k: int):
    """States stacked on a leading axis (counts padded), with samples of at most ``k``
    values -> one stats vector per row (``view`` None: the slots every view shares). A
    larger ``k`` costs a few more rounds of the percentile search, not another trace:
    callers with several sample sizes pass the largest."""
    shared = _finalize_shared_fn(tuple(quantiles), k)
    if view is None:
        return shared
    return lambda stacked: stats.with_extra_slots(shared(stacked), view, quantiles)


@functools.cache
def _finalize_shared_fn(quantiles: tuple[float, ...], k: int):
    # One graph for every view, any number of tensors and every sample class: tracing it is
    # most of a first point's cost (tf.vectorized_map of a one-state finalize took seconds
    # to convert; a graph per sample class was a dozen traces on MobileNetV2, one per view
    # four).
    @tf.function(input_signature=[_state_signature(None, stacked=True)],
                 autograph=False, experimental_attributes=_NOINLINE)
    def finalize_many(stacked):
        return stats.finalize(stacked, None, quantiles=quantiles, sample_bound=k)

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
