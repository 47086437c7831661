"""The percentile sample: one sampler for every state, of one tensor or of many at once.

A sample is ``k`` slots per tensor holding finite non-zero values (+inf in the empty
slots) and their bottom-k keys. Every element of a tensor with at most ``k`` elements is
kept in order. Otherwise ``k`` positions are drawn uniformly and their non-zero values are
kept; a tensor whose draws found fewer than ``min_hits`` (and not all) of its non-zero
values, or that has at most ``min_hits`` of them, is drawn again among its non-zero values
themselves (a compaction pass; with at most ``k`` of them, each is kept once). Either way
the kept values are a uniform sample of the tensor's finite non-zero values.

A draw keeping ``m`` of ``nnz`` non-zero values gets the ``m`` smallest of ``nnz``
uniform keys (``S_j / (S_m + G)``: exponential partial sums, ``G ~ Gamma(nnz - m + 1)`` by
Wilson-Hilferty), so a bottom-k merge of states keeps every tensor, step or replica in
proportion to its non-zero count.
"""

from __future__ import annotations

import tensorflow as tf

from tb_introspect.stats.numeric import F64, INF, in_xla_context, normal, uniform, where

#: The training step's ``min_hits``: a batch is drawn among its non-zero values only when
#: its position draws found fewer than this many (nearly-all-zero tensors).
FEW_HITS = 32.0


def draw(z: tf.Tensor, sizes: tf.Tensor, nnz: tf.Tensor, k: int, seed: tf.Tensor,
         min_hits: float) -> tuple[tf.Tensor, tf.Tensor]:
    """``[S, k]`` sample values (float64) and keys of ``S`` tensors concatenated in ``z``.

    ``z`` holds the tensors' values flattened one after another, with non-finite values
    set to 0; ``sizes`` (int64 ``[S]``) are their element counts and ``nnz`` (float64
    ``[S]``) their non-zero counts. ``seed`` is an int64 pair.
    """
    s = sizes.shape[0] if sizes.shape[0] is not None else tf.size(sizes)
    total = tf.size(z, out_type=tf.int64)
    start = tf.cumsum(sizes, exclusive=True)[:, tf.newaxis]
    n = sizes[:, tf.newaxis]
    j = tf.range(k, dtype=tf.int64)[tf.newaxis]
    exact = n <= k
    u = uniform([s, k], seed, 1)
    drawn = tf.minimum(tf.cast(tf.floor(u * tf.cast(n, F64)), tf.int64), tf.maximum(n - 1, 0))
    pos = where(exact, j, drawn)
    in_range = pos < n
    if in_xla_context():  # XLA fuses the padding into the gather
        padded = tf.concat([z, tf.zeros([1], z.dtype)], 0)
        v = tf.gather(padded, where(in_range, start + pos, total))
    else:  # from ``z`` itself: a padded copy of it was a pass over every value
        at = tf.minimum(where(in_range, start + pos, 0), tf.maximum(total - 1, 0))
        v = tf.cond(total > 0, lambda: tf.gather(z, at), lambda: tf.zeros_like(at, z.dtype))
        v = where(in_range, v, tf.zeros_like(v))
    valid = in_range & tf.not_equal(v, 0)
    hits = tf.reduce_sum(tf.cast(valid, F64), axis=1)
    # A tensor with at most min_hits non-zero values is drawn among them even when the
    # positions found as many: draws with replacement can repeat one and miss another.
    need = ~exact[:, 0] & (((hits < nnz) & (hits < min_hits)) | ((nnz > 0) & (nnz <= min_hits)))

    def among_nonzero():
        active = tf.not_equal(z, 0)
        nnz_i = tf.cast(nnz, tf.int64)[:, tf.newaxis]
        if in_xla_context():  # no dynamic shapes: compact by a scatter to the running count
            idx = where(active, tf.cumsum(tf.cast(active, tf.int64)) - 1, total)
            compact = tf.scatter_nd(idx[:, tf.newaxis], z, tf.reshape(total + 1, [1]))
            spare = total
        else:
            compact = tf.concat([tf.boolean_mask(z, active), tf.zeros([1], z.dtype)], 0)
            spare = tf.size(compact, out_type=tf.int64) - 1
        ranks = where(nnz_i <= k, j,
                      tf.minimum(tf.cast(tf.floor(u * tf.cast(nnz_i, F64)), tf.int64), nnz_i - 1))
        ok = ranks < nnz_i
        first = tf.cumsum(nnz_i, axis=0, exclusive=True)
        picked = tf.gather(compact, where(ok, first + ranks, spare))
        rows = need[:, tf.newaxis]
        return (where(rows, picked, v), where(rows, ok, valid),
                where(need, nnz_i[:, 0] <= k, exact[:, 0]))

    # every_kept: each non-zero value is in the sample once (i.i.d. keys then).
    v, valid, every_kept = tf.cond(tf.reduce_any(need), among_nonzero,
                                   lambda: (v, valid, exact[:, 0]))
    vals = where(valid, tf.cast(v, F64), INF)
    m = tf.reduce_sum(tf.cast(valid, F64), axis=1)
    u2 = uniform([s, k], seed, 2)
    cum = tf.cumsum(-tf.math.log1p(-u2), axis=1)
    shape = tf.maximum(nnz - m + 1.0, 1.0)
    zn = normal([s], seed, 3)
    gamma = shape * tf.pow(
        tf.maximum(1.0 - 1.0 / (9.0 * shape) + zn / (3.0 * tf.sqrt(shape)), 0.0), 3.0
    )
    last = tf.gather(cum, tf.maximum(tf.cast(m, tf.int64) - 1, 0), batch_dims=1)
    ordered = cum / (last + gamma)[:, tf.newaxis]
    rank = tf.cumsum(tf.cast(valid, tf.int64), axis=1) - 1
    drawn_keys = tf.gather(ordered, tf.maximum(rank, 0), batch_dims=1)
    # Every value kept: i.i.d. uniform keys (u2, which the partial sums are not used for then).
    keys = where(every_kept[:, tf.newaxis], u2, drawn_keys)
    return vals, where(valid, keys, INF)

