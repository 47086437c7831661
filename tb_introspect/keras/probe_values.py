"""The numbers the Keras probes take, in the graph (``probes.ProbeStep`` hands them the
tensors): a layer output's lower median of its finite |a| and its kurtosis
(``output_probes_fn``, and ``output_probes_many_fn`` for a group of tensors), an attention
call's largest |pre-softmax logit| (``attention_logit_max``) and the head's logit scale
(``head_logits``), by the contract of ``pipeline/probe_window.py``."""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from tb_introspect.keras import kernels
from tb_introspect.pipeline import probe_window
from tb_introspect.stats.numeric import sum_of_squares, to_float, uniform

MEDIAN_SAMPLE = probe_window.SAMPLE_SIZE
#: Query rows (positions) of a batch whose attention logits are recomputed: every row of a
#: sequence up to this length, else this many evenly spread (``probe_window.query_rows``).
QUERY_ROWS = probe_window.QUERY_ROWS


def abs_median(x: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """``probe_window.abs_median`` of |x| (float64), the lower median of the finite values:
    exact up to ``MEDIAN_SAMPLE`` values, else of that many drawn with replacement
    (``seed``: an int64 pair); NaN where none is finite."""
    return lower_median(abs_sample(x, seed))


def abs_sample(x: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """``[MEDIAN_SAMPLE]`` |values| of ``x`` that ``abs_median`` takes the median of: all
    of a small batch, else a draw; +inf in the other slots and for non-finite values."""
    flat = tf.reshape(x, [-1])
    return abs_samples(flat, tf.reshape(tf.size(flat, out_type=tf.int64), [1]), seed)[0]


def abs_samples(values: tf.Tensor, sizes: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """``abs_sample`` of each tensor of a ``kernels.Segments`` (``[N, MEDIAN_SAMPLE]``), all
    drawn at once from one ``seed``: one draw and one gather for the group, not one of each
    per tensor. One fixed-size sample whatever the batch (a branch per size made XLA sort
    every value): all the values of a small tensor, padded, else a draw. The values are
    read only by the gather."""
    k = MEDIAN_SAMPLE
    total = tf.size(values, out_type=tf.int64)
    n = sizes[:, tf.newaxis]
    slots = tf.range(k, dtype=tf.int64)[tf.newaxis]
    drawn = tf.cast(uniform(tf.stack([tf.size(sizes), k]), seed, 0) * tf.cast(n, tf.float64),
                    tf.int64)
    index = tf.minimum(tf.where(n <= k, slots, drawn), tf.maximum(n - 1, 0))
    at = tf.minimum(tf.cumsum(sizes, exclusive=True)[:, tf.newaxis] + index,
                    tf.maximum(total - 1, 0))
    sample = tf.cond(total > 0, lambda: tf.gather(values, at),
                     lambda: tf.zeros(tf.shape(at), values.dtype))
    sample = tf.abs(to_float(sample))
    kept = (slots < tf.minimum(n, k)) & tf.math.is_finite(sample)
    return tf.where(kept, sample, tf.constant(np.inf, sample.dtype))


def lower_median(sample: tf.Tensor) -> tf.Tensor:
    """The lower median of the finite values of an ``abs_sample``, float64; NaN where it
    has none."""
    ordered = tf.sort(sample)  # +inf (not kept) last
    m = tf.reduce_sum(tf.cast(tf.math.is_finite(sample), tf.int64))
    lower = tf.gather(ordered, tf.maximum(m - 1, 0) // 2)
    return tf.where(m > 0, tf.cast(lower, tf.float64), np.nan)


def lower_medians(samples: tf.Tensor) -> tf.Tensor:
    """``lower_median`` of each row of ``[N, MEDIAN_SAMPLE]`` samples. A full row's lower
    median is the largest of its ``MEDIAN_SAMPLE / 2`` smallest values (one unsorted
    selection for every row, about half the time of a sort); only the rows with fewer
    finite values are sorted."""
    half = MEDIAN_SAMPLE // 2
    m = tf.reduce_sum(tf.cast(tf.math.is_finite(samples), tf.int64), axis=1)
    smallest = -tf.math.top_k(-samples, k=half, sorted=False).values
    out = tf.cast(tf.reduce_max(smallest, axis=1), tf.float64)
    few = tf.where(m < MEDIAN_SAMPLE)[:, 0]
    ordered = tf.sort(tf.gather(samples, few), axis=1)
    at = tf.maximum(tf.gather(m, few) - 1, 0) // 2
    lower = tf.cast(tf.gather(ordered, at, axis=1, batch_dims=1), tf.float64)
    out = tf.tensor_scatter_nd_update(out, few[:, tf.newaxis], lower)
    return tf.where(m > 0, out, np.nan)


def kurtosis(x: tf.Tensor) -> tf.Tensor:
    """m4 / m2**2 of every value of ``x`` (central moments; 3 for a Gaussian), float64; NaN
    for a constant tensor or one with non-finite values.

    Both moments come from the squared deviations (one fused kernel): their sum and their
    norm, four reads and one copy. Where d**4 could leave float32's range (m2 outside
    [1e-12, 1e12] or m4 not finite), the deviations are standardised first."""
    flat = tf.reshape(to_float(x), [-1])
    n = tf.cast(tf.size(flat), tf.float64)
    mean = tf.reduce_mean(flat)
    sq = tf.math.squared_difference(flat, mean)
    m2 = tf.cast(tf.reduce_sum(sq), tf.float64) / n
    m4 = sum_of_squares(sq) / n

    def standardised():
        z = (flat - mean) * tf.math.rsqrt(tf.cast(m2, flat.dtype))
        return tf.cast(tf.reduce_mean(tf.square(tf.square(z))), tf.float64)

    fast = tf.math.is_finite(m4) & (m2 > 1e-12) & (m2 < 1e12)
    return tf.cond(fast, lambda: m4 / (m2 * m2), standardised)


def head_logits(logits: tf.Tensor) -> tf.Tensor:
    """[largest logit, mean over rows of logsumexp over the last axis] (float64)."""
    z = to_float(logits)
    z = tf.reshape(z, [-1, tf.shape(z)[-1]])
    return tf.cast(tf.stack([tf.reduce_max(z), tf.reduce_mean(tf.reduce_logsumexp(z, -1))]),
                   tf.float64)


def attention_logit_max(query: tf.Tensor, key: tf.Tensor, mask: tf.Tensor | None,
                        causal: bool, scale: float) -> tf.Tensor:
    """``probe_window.attention_logit_max``: the largest |q . k * scale| of ``query``
    ``[B, T, N, H]`` against ``key`` ``[B, S, N, H]``, over the heads, every key, the query
    rows ``probe_window.query_rows`` picks (all of a sequence up to ``QUERY_ROWS``, else
    that many evenly spread) and the first ``probe_window.batch_elements`` batch elements,
    the positions ``mask`` (broadcastable to ``[B, T, S]``, true: attend) and the causal
    mask leave out excluded (float64)."""
    q = to_float(query) * scale
    k = to_float(key)
    t_static = q.shape[1]
    if t_static is not None:
        rows = tf.constant(probe_window.query_rows(t_static), tf.int64)
    else:  # a traced length: the same integer rule
        t = tf.shape(q, out_type=tf.int64)[1]
        n = tf.minimum(t, QUERY_ROWS)
        rows = tf.range(n) * (t - 1) // tf.maximum(n - 1, 1)
    heads, keys = q.shape[2], k.shape[1]
    if heads is not None and keys is not None and t_static is not None:
        b = probe_window.batch_elements(heads * min(t_static, QUERY_ROWS) * keys)
    else:
        shape_q, shape_k = tf.shape(q, out_type=tf.int64), tf.shape(k, out_type=tf.int64)
        per = shape_q[2] * tf.size(rows, out_type=tf.int64) * shape_k[1]
        b = tf.maximum(tf.constant(1, tf.int64),
                       probe_window.LOGIT_BUDGET // tf.maximum(per, 1))
    q, k = q[:b], k[:b]
    q = tf.gather(q, rows, axis=1)
    scores = tf.abs(tf.einsum("brnh,bsnh->bnrs", q, k))  # [B, N, rows, S]
    keep = None
    if mask is not None:
        m = tf.cast(mask, tf.bool)
        while m.shape.rank < 3:
            m = m[tf.newaxis]
        m = m[:b]  # the kept batch elements (a mask of one broadcasts)
        if m.shape[1] != 1:  # a mask per query row: the sampled rows'
            m = tf.gather(m, rows, axis=1)
        keep = m[:, tf.newaxis]  # broadcasts against [B, N, rows, S]
    if causal:
        s = tf.shape(scores, out_type=tf.int64)[3]
        below = rows[:, tf.newaxis] >= tf.range(s)[tf.newaxis, :]  # Keras's causal mask
        keep = below if keep is None else tf.logical_and(keep, below)
    if keep is not None:
        scores = tf.where(keep, scores, tf.zeros_like(scores))
    return tf.cast(tf.reduce_max(scores), tf.float64)


@functools.cache
def output_probes_fn(rank: int, dtype: str, xla: bool) -> Callable:
    """``(x, seed) -> [abs_median, kurtosis]`` of one layer output, one nested function per
    rank and dtype (``kernels.py``: a graph per tensor would make a large model's trace
    long)."""

    @tf.function(
        input_signature=[tf.TensorSpec([None] * rank, tf.as_dtype(dtype)),
                         tf.TensorSpec([2], tf.int64)],
        autograph=False, jit_compile=True if xla else None,
        experimental_attributes=None if xla else {"_noinline": True},
    )
    def output_probes(x, seed):
        return tf.stack([abs_median(x, seed), kurtosis(x)])

    return output_probes


@functools.cache
def output_probes_many_fn(dtype: str) -> Callable:
    """``(values, sizes, seed) -> [N, 2]``: ``output_probes_fn``'s numbers of each tensor of
    a ``kernels.Segments`` (flattened: the same values in the same order): the kurtoses in
    one loop in one nested function (one call site per group: ``kernels.Segments``), the
    medians of samples drawn together from one ``seed`` (``abs_samples``)."""

    @tf.function(
        input_signature=[tf.TensorSpec([None], tf.as_dtype(dtype)),
                         tf.TensorSpec([None], tf.int64), tf.TensorSpec([2], tf.int64)],
        autograph=False, experimental_attributes={"_noinline": True},
    )
    def output_probes(values, sizes, seed):
        kurt = tf.map_fn(lambda i: kurtosis(kernels.segment(values, sizes, i)),
                         tf.range(tf.size(sizes, out_type=tf.int64)),
                         fn_output_signature=tf.TensorSpec([], tf.float64))
        # One selection for every tensor's sample: a sort each was a sixth of a CNN's
        # statistics step.
        return tf.stack([lower_medians(abs_samples(values, sizes, seed)), kurt], axis=1)

    return output_probes
