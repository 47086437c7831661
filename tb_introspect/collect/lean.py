"""A lean ``stats`` accumulator update for the training step.

``stats.update_state`` is general and exact but costs about twenty passes over
the tensor and ~700 graph ops per call (5 ms fixed cost per tensor on CPU,
measured), paid for every monitored tensor at every accumulated step. This
module computes the same *state* (``stats.STATE_MERGE`` format, so
``stats.merge_stacked`` and ``stats.finalize`` stay the single definition of
the statistics) in about a dozen passes and ~60 ops:

* counts, sum, min/max, per-channel and per-position activity come from a few
  reductions (per-channel min/max give the global extremes and the channel
  flags in the same pass);
* the second moment is ``sum(x*x) - n*mean**2`` in float64 from a float32 dot
  product (relative error ~1e-6 of ``sum(x*x)``, so ``std`` is accurate unless
  ``|mean| >> std``), instead of a float64 copy of the tensor;
* the percentile sample is ``k`` uniform draws of positions (all elements when
  there are at most ``k``), non-zero ones kept, with bottom-k keys distributed
  as the smallest of ``nnz`` uniform keys (``stats``' own scheme), so merging
  over steps and replicas stays unbiased.

Inputs are in the canonical shapes of ``kernels``: ``[batch, channels]`` or
``[batch, positions, channels]``.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

_F64 = tf.float64
_INF = float("inf")
_NAN = float("nan")
_MAX_EXP = 1000.0


def to_float(x: tf.Tensor, name: str = "tensor") -> tf.Tensor:
    """float32 (float64 kept; wide integers go to float64 so they stay exact)."""
    dt = x.dtype
    if not (dt.is_floating or dt.is_integer or dt.is_bool) or dt.is_complex:
        raise TypeError(
            f"cannot compute statistics of {name!r} with dtype {dt.name}:"
            " expected a float, integer or bool tensor"
        )
    if dt in (tf.float32, tf.float64):
        return x
    if dt in (tf.int32, tf.int64, tf.uint32, tf.uint64):
        return tf.cast(x, _F64)
    return tf.cast(x, tf.float32)


def scale_exponent(vmin: tf.Tensor, vmax: tf.Tensor) -> tf.Tensor:
    """``stats``' moment scale: binary exponent of max(|min|, |max|), 0 if not positive finite."""
    m = tf.maximum(tf.abs(vmin), tf.abs(vmax))
    ok = tf.math.is_finite(m) & (m > 0)
    e = tf.floor(tf.math.log(tf.where(ok, m, tf.ones_like(m))) / np.log(2.0))
    return tf.clip_by_value(tf.where(ok, e, tf.zeros_like(e)), -_MAX_EXP, _MAX_EXP)


def _uniform(shape, seed: tf.Tensor, salt: int) -> tf.Tensor:
    return tf.random.stateless_uniform(shape, seed=seed + salt, dtype=_F64)


def parts(x: tf.Tensor, k: int, seed: tf.Tensor) -> dict[str, tf.Tensor]:
    """The state of ``x`` alone (fold it into a running state with ``merge``).

    ``x`` has rank 2 or 3 (canonical shape), ``seed`` is an int64 pair.
    """
    x = to_float(x)
    rank = x.shape.rank
    flat = tf.reshape(x, [-1])
    n = tf.size(flat, out_type=tf.int64)
    count = tf.cast(n, _F64)
    inf = tf.constant(_INF, x.dtype)
    zero = tf.constant(0.0, _F64)
    total = tf.reduce_sum(flat)

    def finite_case():
        return x, count, zero, zero, tf.cast(total, _F64)

    def nonfinite_case():
        ok = tf.math.is_finite(x)
        z = tf.where(ok, x, tf.zeros_like(x))
        nf = tf.reduce_sum(tf.cast(ok, _F64))
        posinf = tf.reduce_sum(tf.cast(tf.equal(x, inf), _F64))
        neginf = tf.reduce_sum(tf.cast(tf.equal(x, -inf), _F64))
        return z, nf, posinf, neginf, tf.cast(tf.reduce_sum(z), _F64)

    # A sum is finite only when every value is (overflow takes the exact slow path).
    z, nf, posinf, neginf, s = tf.cond(
        tf.math.is_finite(total), finite_case, nonfinite_case
    )
    zflat = tf.reshape(z, [-1])
    # Extremes over the batch axis first (a fast leading-axis reduction); the
    # channel flags, position flags and global extremes come from that small
    # [positions, channels] block. Non-finite values are 0 in z: inactive, as in stats.
    bmax = tf.reduce_max(z, axis=0)
    bmin = tf.reduce_min(z, axis=0)
    active = (bmax > 0) | (bmin < 0)
    if rank == 3:
        channel = tf.reduce_any(active, axis=0)
        spatial = tf.cast(tf.reduce_any(active, axis=1), _F64)
    else:
        channel = active
        spatial = tf.zeros([0], _F64)
    has = nf > 0
    finite_all = tf.equal(nf, count)
    vmin = tf.cond(
        finite_all, lambda: tf.cast(tf.reduce_min(bmin), _F64),
        lambda: tf.cast(tf.reduce_min(tf.where(tf.math.is_finite(flat), flat, inf)), _F64),
    )
    vmax = tf.cond(
        finite_all, lambda: tf.cast(tf.reduce_max(bmax), _F64),
        lambda: tf.cast(tf.reduce_max(tf.where(tf.math.is_finite(flat), flat, -inf)), _F64),
    )
    vmin = tf.where(has, vmin, tf.constant(_INF, _F64))
    vmax = tf.where(has, vmax, tf.constant(-_INF, _F64))
    sign = tf.sign(zflat)
    balance = tf.cast(tf.reduce_sum(sign), _F64)  # positives - negatives
    a = tf.abs(zflat)
    nnz = tf.cast(tf.math.count_nonzero(a, dtype=tf.int64), _F64)
    min_abs = tf.cast(tf.reduce_min(tf.where(a > 0, a, inf)), _F64)
    sumsq = tf.cast(tf.reduce_sum(tf.square(zflat)), _F64)
    mean = s / tf.maximum(nf, 1.0)
    m2 = tf.maximum(sumsq - nf * mean * mean, 0.0)
    e = scale_exponent(tf.where(has, vmin, zero), tf.where(has, vmax, zero))
    f = tf.pow(tf.constant(2.0, _F64), -e)
    vals, keys = _sample(zflat, n, nnz, k, seed)
    npos = (nnz + balance) / 2.0
    return {
        "count": count,
        "finite_count": nf,
        "posinf_count": posinf,
        "neginf_count": neginf,
        "pos_count": npos,
        "neg_count": nnz - npos,
        "mean": tf.where(has, mean, zero),
        "m2": m2 * f * f,  # stats keeps m2 in units of 4**e
        "min": vmin,
        "max": vmax,
        "min_abs": min_abs,
        "channel_active": tf.cast(channel, _F64),
        "spatial_active": spatial,
        "sample_keys": keys,
        "sample_values": vals,
    }


def merge(a: dict[str, tf.Tensor], b: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """Merge two batches of states (leading axis = tensors), as ``stats.merge_stacked``.

    Vectorised over the leading axis (one op per field for all tensors). Flags
    must be padded to a common width (with 0). Moments are combined in absolute
    units, which is exact for float32 data; the result is rescaled to stats'
    convention.
    """
    out = {
        key: a[key] + b[key]
        for key in ("count", "finite_count", "posinf_count", "neginf_count", "pos_count",
                    "neg_count")
    }
    for key, fn in (("min", tf.minimum), ("max", tf.maximum), ("min_abs", tf.minimum),
                    ("channel_active", tf.maximum), ("spatial_active", tf.maximum)):
        out[key] = fn(a[key], b[key])
    two = tf.constant(2.0, _F64)

    def absolute_m2(st):
        has = st["finite_count"] > 0
        e = scale_exponent(tf.where(has, st["min"], 0.0), tf.where(has, st["max"], 0.0))
        f = tf.pow(two, e)
        return st["m2"] * f * f

    na, nb = a["finite_count"], b["finite_count"]
    n = na + nb
    mean = (na * a["mean"] + nb * b["mean"]) / tf.maximum(n, 1.0)
    d = a["mean"] - b["mean"]
    m2 = absolute_m2(a) + absolute_m2(b) + d * d * na * nb / tf.maximum(n, 1.0)
    has = n > 0
    e = scale_exponent(tf.where(has, out["min"], 0.0), tf.where(has, out["max"], 0.0))
    f = tf.pow(two, -e)
    out["mean"] = tf.where(has, mean, 0.0)
    out["m2"] = tf.where(has, m2 * f * f, 0.0)
    keys = tf.concat([a["sample_keys"], b["sample_keys"]], axis=-1)
    vals = tf.concat([a["sample_values"], b["sample_values"]], axis=-1)
    k = a["sample_keys"].shape[-1]
    neg, idx = tf.math.top_k(-keys, k=k, sorted=True)
    out["sample_keys"] = -neg
    out["sample_values"] = tf.gather(vals, idx, batch_dims=1)
    return out


def _sample(zflat: tf.Tensor, n: tf.Tensor, nnz: tf.Tensor, k: int, seed: tf.Tensor):
    """``k`` slots of non-zero finite values (+inf padded) with bottom-k keys."""
    exact = n <= k
    u = _uniform([k], seed, 1)
    drawn = tf.minimum(tf.cast(tf.floor(u * tf.cast(n, _F64)), tf.int64),
                       tf.maximum(n - 1, 0))
    pos = tf.where(exact, tf.range(k, dtype=tf.int64), drawn)
    in_range = pos < n
    # One padding element keeps the gather in range for empty tensors.
    padded = tf.concat([zflat, tf.zeros([1], zflat.dtype)], 0)
    v = tf.gather(padded, tf.where(in_range, pos, n))
    valid = in_range & tf.not_equal(v, 0)
    vals = tf.where(valid, tf.cast(v, _F64), tf.constant(_INF, _F64))
    m = tf.reduce_sum(tf.cast(valid, _F64))
    # Keys: every value kept -> i.i.d. uniform; a draw of m of nnz values -> the m
    # smallest of nnz uniform keys: S_j / (S_m + G), S exponential partial sums,
    # G ~ Gamma(nnz - m + 1) (Wilson-Hilferty), as stats does.
    spacings = -tf.math.log1p(-_uniform([k], seed, 2))
    cum = tf.cumsum(spacings)
    shape = tf.maximum(nnz - m + 1.0, 1.0)
    zn = tf.random.stateless_normal([], seed=seed + 3, dtype=_F64)
    gamma = shape * tf.pow(
        tf.maximum(1.0 - 1.0 / (9.0 * shape) + zn / (3.0 * tf.sqrt(shape)), 0.0), 3.0
    )
    last = tf.gather(cum, tf.maximum(tf.cast(m, tf.int64) - 1, 0))
    ordered = cum / (last + gamma)
    rank = tf.cumsum(tf.cast(valid, tf.int64)) - 1
    drawn_keys = tf.gather(ordered, tf.maximum(rank, 0))
    keys = tf.where(exact, _uniform([k], seed, 4), drawn_keys)
    return vals, tf.where(valid, keys, tf.constant(_INF, _F64))
