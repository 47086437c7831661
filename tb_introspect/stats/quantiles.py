"""Value and log-magnitude percentiles of a state, from its sample and its exact counts."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import tensorflow as tf

from tb_introspect.stats.numeric import F64, INF, NAN, log10, where


def _count_last(mask: tf.Tensor) -> tf.Tensor:
    """True elements along the last axis, kept as an axis of 1 (float64)."""
    return tf.cast(tf.reduce_sum(tf.cast(mask, tf.int32), axis=-1, keepdims=True), F64)


def order_statistics(sample: tf.Tensor, value_ranks: tf.Tensor, magnitude_ranks: tf.Tensor
                     ) -> tuple[tf.Tensor, tf.Tensor]:
    """The ``value_ranks``-th smallest values and ``magnitude_ranks``-th smallest magnitudes
    (0-based, int32) of the finite values of ``sample`` (empty slots hold +inf), along the
    last axis; leading axes are independent samples.

    One sort. The magnitudes in ascending order are the merge of two sorted runs of the
    sorted values, the negatives read backwards and the positives, so each wanted
    magnitude is found by a binary search for how many of it come from the negatives.
    Ranks past the end give unspecified values (callers mask them). The sample's static
    size sets the search's number of rounds.
    """
    size = sample.shape[-1]
    if size is None:
        raise ValueError("order_statistics needs a sample of static size")
    ordered = tf.sort(where(tf.math.is_finite(sample), sample, INF), axis=-1)
    last = tf.shape(sample, out_type=tf.int32)[-1] - 1
    m = tf.cast(_count_last(tf.math.is_finite(sample)), tf.int32)
    m_neg = tf.cast(_count_last(sample < 0), tf.int32)
    m_pos = m - m_neg
    batch = sample.shape.rank - 1

    def at(i):
        return tf.gather(ordered, tf.clip_by_value(i, 0, tf.maximum(last, 0)), batch_dims=batch)

    def neg_mag(i):  # the i-th smallest magnitude among the negatives
        return -at(m_neg - 1 - i)

    def pos_mag(i):
        return at(m_neg + i)

    r = magnitude_ranks
    lo = tf.maximum(0, r + 1 - m_pos)
    hi = tf.minimum(r + 1, m_neg)
    # The smallest i (negatives taken) at which the last positive taken is no larger than
    # the next negative magnitude: then the r + 1 smallest are i negatives, r + 1 - i positives.
    for _ in range(int(np.ceil(np.log2(int(size) + 1))) + 1):
        mid = (lo + hi) // 2
        fits = (mid >= hi) | (pos_mag(r - mid) <= neg_mag(mid))
        hi = tf.where(fits, mid, hi)
        lo = tf.where(fits, lo, mid + 1)
    t = r + 1 - lo
    ninf = tf.constant(-INF, ordered.dtype)
    mags = tf.maximum(tf.where(lo > 0, neg_mag(lo - 1), ninf),
                      tf.where(t > 0, pos_mag(t - 1), ninf))
    return at(value_ranks), mags


def sample_quantiles(
    sample: tf.Tensor, parts: Mapping[str, tf.Tensor], q: np.ndarray
) -> tuple[tf.Tensor, tf.Tensor]:
    """Value and log10-magnitude percentiles at the points ``q`` from a state's sample.

    Value percentiles are taken over the finite values with numpy's linear
    interpolation between order statistics; the rank of an order statistic is
    mapped into the sample within its sign stratum, using the exact negative /
    zero / positive counts. This is exact when the sample holds every finite
    non-zero value, and never lets sampling noise move a value across zero.
    """
    p = tf.constant(q / 100.0, F64)

    def column(key):  # a state's scalar as [..., 1]: it broadcasts against the points
        return parts[key][..., tf.newaxis]

    n_neg, n_pos = column("neg_count"), column("pos_count")
    n_fin = column("finite_count")
    n_zero = n_fin - n_neg - n_pos
    valid = tf.math.is_finite(sample)
    m = _count_last(valid)
    m_neg = _count_last(valid & (sample < 0))
    m_pos = m - m_neg
    vmin, vmax = column("min"), column("max")

    def stratum(j, n_pop, m_samp, offset):
        # Population rank j (0-based within the stratum) -> sample position.
        s = where(
            tf.equal(n_pop, m_samp), j, j * (m_samp - 1.0) / tf.maximum(n_pop - 1.0, 1.0)
        )
        return offset + s

    r = p * tf.maximum(n_fin - 1.0, 0.0)
    lo = tf.floor(r)
    hi = tf.minimum(lo + 1.0, tf.maximum(n_fin - 1.0, 0.0))
    i = tf.concat([lo, hi], -1)  # population ranks
    is_neg = i < n_neg
    s = where(
        is_neg, stratum(i, n_neg, m_neg, 0.0), stratum(i - n_neg - n_zero, n_pos, m_pos, m_neg)
    )
    s = tf.clip_by_value(s, 0.0, tf.maximum(m - 1.0, 0.0))
    s_lo, s_hi = tf.floor(s), tf.math.ceil(s)
    # Magnitude ranks: log10|x| percentiles over the finite non-zero values (log10
    # is monotone, so only the order statistics used are logged).
    rm = p * tf.maximum(m - 1.0, 0.0)
    rm_lo, rm_hi = tf.floor(rm), tf.math.ceil(rm)
    nv, nm = 2 * len(q), len(q)
    picked_v, picked_m = order_statistics(
        sample, tf.cast(tf.concat([s_lo, s_hi], -1), tf.int32),
        tf.cast(tf.concat([rm_lo, rm_hi], -1), tf.int32))
    a, b = tf.split(tf.cast(picked_v, F64), [nv, nv], axis=-1)
    la, lb = tf.split(tf.cast(picked_m, F64), [nm, nm], axis=-1)
    v = where(s_hi > s_lo, a + (b - a) * (s - s_lo), a)
    v = where(is_neg, where(m_neg > 0, v, vmin), where(m_pos > 0, v, vmax))
    v = where(is_neg, v, where(i < n_neg + n_zero, 0.0, v))
    a, b = tf.split(v, 2, axis=-1)
    vq = where(hi > lo, a + (b - a) * (r - lo), a)
    # The extremes are known exactly; sampled estimates stay inside them.
    vq = where(tf.equal(p, 0.0), vmin, where(tf.equal(p, 1.0), vmax, vq))
    vq = tf.clip_by_value(vq, tf.minimum(vmin, vmax), tf.maximum(vmin, vmax))
    vq = where(n_fin > 0, vq, NAN)

    la, lb = log10(la), log10(lb)
    lq = where(rm_hi > rm_lo, la + (lb - la) * (rm - rm_lo), la)
    max_abs = tf.maximum(tf.abs(vmin), tf.abs(vmax))
    lq = where(
        tf.equal(p, 0.0),
        log10(column("min_abs")),
        where(tf.equal(p, 1.0), log10(max_abs), lq),
    )
    lq = where(m > 0, lq, NAN)
    return vq, lq
