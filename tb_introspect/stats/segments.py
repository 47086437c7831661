"""Reductions over a concatenation of many tensors: one op per field for all of them."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf

from tb_introspect.stats.numeric import F64, INF


def concat_flat(tensors: Sequence[tf.Tensor], dtype: tf.DType | None = F64) -> tf.Tensor:
    """The tensors flattened one after another, as ``dtype`` (``None``: their common dtype)."""
    # One shape tensor for all: a literal [-1] per reshape is a constant op per tensor, most
    # of the trace of a logged point of a few hundred tensors.
    shape = tf.constant([-1])
    flat = [tf.reshape(t, shape) for t in tensors]
    if len({t.dtype for t in flat}) == 1:  # one cast of the concatenation: fewer, wider ops
        joined = tf.concat(flat, 0)
        return joined if dtype is None else tf.cast(joined, dtype)
    return tf.concat([tf.cast(t, dtype or F64) for t in flat], 0)


class Segments:
    """Reductions over, and broadcasts onto, a concatenation of tensors of ``sizes`` elements.

    The segments are contiguous, so the sorted segment kernels apply; they are 2-3x
    faster on CPU than the unsorted ones, and than a gather of one value per element.
    """

    def __init__(self, sizes: Sequence[int]):
        self.sizes = [int(s) for s in sizes]
        self.ids = tf.constant(np.repeat(np.arange(len(self.sizes)), self.sizes), tf.int32)
        self.empty = np.array([s == 0 for s in self.sizes], bool)

    def _reduce(self, op: Callable, v: tf.Tensor, identity: float) -> tf.Tensor:
        r = op(v, self.ids)  # as long as the last non-empty segment; empty ones hold 0
        r = tf.pad(r, [[0, len(self.sizes) - tf.shape(r)[0]]])
        return tf.where(self.empty, tf.cast(identity, r.dtype), r) if self.empty.any() else r

    def sum(self, v: tf.Tensor) -> tf.Tensor:
        return self._reduce(tf.math.segment_sum, v, 0.0)

    def min(self, v: tf.Tensor) -> tf.Tensor:
        return self._reduce(tf.math.segment_min, v, INF)

    def max(self, v: tf.Tensor) -> tf.Tensor:
        return self._reduce(tf.math.segment_max, v, -INF)

    def spread(self, per_segment: tf.Tensor) -> tf.Tensor:
        """Each segment's value repeated over its elements."""
        parts = tf.unstack(per_segment, num=len(self.sizes))
        # One shape constant per distinct size (a model's tensors repeat a few sizes): fill
        # and concat run 2-3x faster than a gather of one value per element, but each
        # constant is an op to trace.
        dims = {s: tf.constant([s]) for s in set(self.sizes)}
        return tf.concat([tf.fill(dims[s], p) for s, p in zip(self.sizes, parts, strict=True)],
                         0)

