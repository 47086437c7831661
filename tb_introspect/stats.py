"""In-graph statistics of one tensor, and a mergeable accumulator of them (TensorFlow).

Everything here runs eagerly, under ``tf.function`` and with ``jit_compile=True``.
Definitions, edge cases and the accuracy statement are in ``docs/statistics.md``;
``tb_introspect.stats_np`` is the numpy twin with the same definitions.

Percentiles come from a bounded sample of the finite non-zero values, combined
with the exact counts of negative, zero and positive values: exact whenever the
tensor has at most ``sample_size`` finite non-zero values, otherwise a uniform
random sample whose rank error is about ``0.5 / sqrt(sample_size)`` (one sigma).
Everything else (counts, moments, min, max, dead rates) is exact.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
import tensorflow as tf

from tb_introspect import metadata
from tb_introspect.collect.private import in_xla_context

#: Default bound on the number of sampled values percentiles are taken from.
DEFAULT_SAMPLE_SIZE = 2**18

_F64 = tf.float64
_NAN = float("nan")
_INF = float("inf")
# Moments are taken of x * 2**-e with e the binary exponent of max|x|, clipped so
# that the scale factor itself is a normal float64; this keeps squares of values
# near the float64 limits from overflowing.
_MAX_EXP = 1000.0

#: How each key of an accumulator state merges (see ``merge_states``):
#: ``sum`` adds (``channel_nnz`` / ``spatial_nnz`` are the non-zero counts of each
#: channel and of each spatial position, so the per-channel and per-position
#: activation rates and both dead rates follow), ``min``/``max`` take the extreme,
#: ``moments`` is (mean, m2) merged with Chan's formula using
#: ``finite_count`` (m2 is stored scaled by 4**-e, e from max(|min|, |max|)),
#: ``bottom_k`` is the random-key sample (keys and values merge together).
STATE_MERGE: dict[str, str] = {
    "count": "sum",
    "finite_count": "sum",
    "posinf_count": "sum",
    "neginf_count": "sum",
    "pos_count": "sum",
    "neg_count": "sum",
    "mean": "moments",
    "m2": "moments",
    "min": "min",
    "max": "max",
    "min_abs": "min",
    "channel_nnz": "sum",
    "spatial_nnz": "sum",
    "sample_keys": "bottom_k",
    "sample_values": "bottom_k",
}


# The code has no Python control flow on tensors; skipping AutoGraph's source
# conversion makes tracing inside tf.function several times faster.
_no_autograph = tf.autograph.experimental.do_not_convert

# --------------------------------------------------------------------------- input


def _describe(x, name: str | None) -> str:
    if name:
        return name
    try:
        return x.name
    except (AttributeError, ValueError):  # eager tensors have no name
        return f"<tensor of shape {getattr(x, 'shape', '?')}>"


def to_float(x, name: str | None = None) -> tf.Tensor:
    """``x`` as float32 (float16/bfloat16/float32/small ints/bool) or float64."""
    try:
        t = tf.convert_to_tensor(x)
    except (TypeError, ValueError) as e:
        raise TypeError(f"cannot compute statistics of {_describe(x, name)!r}: {e}") from e
    dt = t.dtype
    if not (dt.is_floating or dt.is_integer or dt.is_bool) or dt.is_complex or dt.is_quantized:
        raise TypeError(
            f"cannot compute statistics of tensor {_describe(x, name)!r} with dtype"
            f" {dt.name}: expected a float, integer or bool tensor"
        )
    if dt == tf.float32:
        return t
    if dt in (tf.float64, tf.int32, tf.int64, tf.uint32, tf.uint64):
        return tf.cast(t, _F64)  # float32 would round integers above 2**24
    return tf.cast(t, tf.float32)


def _check_quantiles(quantiles: Sequence[float]) -> np.ndarray:
    q = np.asarray(quantiles, dtype=np.float64).reshape(-1)
    if q.size == 0 or not np.all((q >= 0) & (q <= 100)):
        raise ValueError(f"quantiles must be percentile points in [0, 100], got {quantiles!r}")
    return q


def _check_sample_size(sample_size: int) -> int:
    k = int(sample_size)
    if k < 1:
        raise ValueError(f"sample_size must be a positive integer, got {sample_size!r}")
    return k


def _seed_pair(seed) -> tf.Tensor:
    s = tf.cast(tf.convert_to_tensor(seed), tf.int64)
    if s.shape.rank == 0:
        s = tf.stack([s, tf.constant(0x5EED, tf.int64)])
    return s


def _uniform(shape, seed, salt: int) -> tf.Tensor:
    """Uniform [0, 1) float64 from a stateless seed (shape-[2] int64) plus ``salt``."""
    return tf.random.stateless_uniform(shape, seed=seed + [salt, 0], dtype=_F64)


def _normal(shape, seed, salt: int) -> tf.Tensor:
    return tf.random.stateless_normal(shape, seed=seed + [salt, 0], dtype=_F64)


def _content_seed(*values: tf.Tensor) -> tf.Tensor:
    """A stateless seed made from the bits of float64 scalars (e.g. the tensor's moments).

    Without a user seed the sample is then a deterministic function of the data:
    equal tensors give equal statistics, and nothing depends on op-level RNG
    state (XLA ignores the seeds of stateful random ops).
    """
    bits = [tf.bitcast(tf.cast(v, _F64), tf.int64) for v in values]
    mixed = bits[0]
    for b in bits[1:]:
        mixed = tf.bitwise.bitwise_xor(mixed * 1000003, b)
    return tf.stack([mixed, bits[-1]])


def _where(cond, a, b) -> tf.Tensor:
    """``tf.where`` that gives Python numbers the dtype of the tensor argument (float64 if none)."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        a = tf.constant(a, _F64)
    if isinstance(a, (int, float)):
        a = tf.constant(a, tf.convert_to_tensor(b).dtype)
    elif isinstance(b, (int, float)):
        b = tf.constant(b, tf.convert_to_tensor(a).dtype)
    return tf.where(cond, a, b)


def _count(mask) -> tf.Tensor:
    """Number of True elements, as float64 (int32 sums are the cheapest exact count)."""
    size = mask.shape.num_elements()
    if size is not None and size < 2**31:
        return tf.cast(tf.reduce_sum(tf.cast(mask, tf.int32)), _F64)
    return tf.cast(tf.math.count_nonzero(mask, dtype=tf.int64), _F64)


def _pow2(e) -> tf.Tensor:
    return tf.pow(tf.constant(2.0, _F64), e)


def _scale_exponent(vmin, vmax) -> tf.Tensor:
    """Binary exponent of max(|vmin|, |vmax|), 0 when that is not a positive finite number."""
    m = tf.maximum(tf.abs(vmin), tf.abs(vmax))
    ok = tf.math.is_finite(m) & (m > 0)
    e = tf.floor(tf.math.log(_where(ok, m, 1.0)) / np.log(2.0))
    return tf.clip_by_value(_where(ok, e, 0.0), -_MAX_EXP, _MAX_EXP)


# --------------------------------------------------------------------------- one batch


def _batch_parts(
    x: tf.Tensor,
    k: int,
    seed,
    q: np.ndarray,
) -> dict[str, tf.Tensor]:
    """Exact counts/moments/extremes, the two dead rates and the percentiles ``_vq``/``_lq``
    (at the percentile points ``q``) of one whole tensor (``tensor_stats``)."""
    flat = tf.reshape(x, [-1])
    n = tf.size(flat, out_type=tf.int64)
    count = tf.cast(n, _F64)
    zero = tf.constant(0.0, _F64)
    inf = tf.constant(_INF, flat.dtype)

    def moments(xf, finite, nf, vmin, vmax):
        e = _scale_exponent(vmin, vmax)
        xs = tf.cast(xf, _F64) * _pow2(-e)
        mean_s = tf.reduce_sum(xs) / tf.maximum(nf, 1.0)
        dev = xs - mean_s
        if finite is not None:
            dev = _where(finite, dev, tf.zeros_like(dev))
        return mean_s * _pow2(e), tf.reduce_sum(dev * dev), e  # m2 in units of 4**e

    def all_finite():
        vmin = tf.cast(tf.reduce_min(flat), _F64)
        vmax = tf.cast(tf.reduce_max(flat), _F64)
        return (flat, count, zero, zero, vmin, vmax, *moments(flat, None, count, vmin, vmax))

    def with_nonfinite():
        finite = tf.math.is_finite(flat)
        xf = _where(finite, flat, tf.zeros_like(flat))
        nf = _count(finite)
        vmin = tf.cast(tf.reduce_min(_where(finite, flat, inf)), _F64)
        vmax = tf.cast(tf.reduce_max(_where(finite, flat, -inf)), _F64)
        return (
            xf, nf, _count(tf.equal(flat, inf)), _count(tf.equal(flat, -inf)), vmin, vmax,
            *moments(xf, finite, nf, vmin, vmax),
        )

    # x * 0 is 0 for finite x and NaN otherwise: one cheap pass decides the common case.
    has_nonfinite = tf.logical_not(tf.math.is_finite(tf.reduce_sum(flat * 0)))
    xf, nf, posinf, neginf, vmin, vmax, mean, m2, e = tf.cond(
        has_nonfinite, with_nonfinite, all_finite
    )
    active = tf.not_equal(xf, 0)
    nnz = _count(active)
    n_neg = _count(xf < 0)
    out: dict[str, tf.Tensor] = {
        "count": count,
        "finite_count": nf,
        "posinf_count": posinf,
        "neginf_count": neginf,
        "pos_count": nnz - n_neg,
        "neg_count": n_neg,
        "mean": mean,
        "m2": m2,
        "min": vmin,
        "max": vmax,
        "_exp": e,
    }
    channel, spatial = _activity_flags(tf.reshape(active, tf.shape(x)), x.shape)
    rank = x.shape.rank
    if rank <= 1:  # each element is its own channel
        out["dead_rate"] = _where(count > 0, (count - nnz) / tf.maximum(count, 1.0), _NAN)
    else:
        out["dead_rate"] = _dead_rate(tf.cast(channel, _F64), count)
    out["spatial_dead_rate"] = _dead_rate(tf.cast(spatial, _F64), count)
    seed = _content_seed(count, mean, m2) if seed is None else _seed_pair(seed)
    out["min_abs"] = tf.cast(tf.reduce_min(_where(active, tf.abs(xf), inf)), _F64)
    channels = x.shape[-1] if rank >= 2 else None
    out["_vq"], out["_lq"] = _percentiles(flat, active, n, nnz, k, seed, out, q, channels)
    return out


def _dead_rate(nnz: tf.Tensor, count: tf.Tensor) -> tf.Tensor:
    """Share of the units (channels or positions) whose non-zero count ``nnz`` is 0;
    NaN when the tensor is empty or no unit is tracked."""
    size = tf.cast(tf.size(nnz), _F64)
    ok = (count > 0) & (size > 0)
    dead = tf.reduce_sum(tf.cast(tf.equal(nnz, 0.0), _F64))
    return _where(ok, dead / tf.maximum(size, 1.0), _NAN)


def _activity_flags(active: tf.Tensor, shape: tf.TensorShape) -> tuple[tf.Tensor, tf.Tensor]:
    """Per-channel (last axis) and per-spatial-position "ever active" flags (bool)."""
    rank = shape.rank
    if rank == 0:
        channel = tf.reshape(active, [1])
    elif rank == 1:
        channel = active  # each element is its own channel
    else:
        channel = tf.reduce_any(active, axis=list(range(rank - 1)))
    if rank >= 3:
        spatial = tf.reduce_any(active, axis=[0, rank - 1])
    else:
        spatial = tf.zeros([0], tf.bool)
    return channel, spatial


def _percentiles(flat, active, n, nnz, k: int, seed, parts, q, channels: int | None = None):
    """Value and log10-magnitude percentiles of one tensor (see ``_sample_quantiles``).

    The sample they come from: every finite non-zero value when a sample would
    need half the tensor or more (exact), otherwise the finite non-zero values
    at about (k + 5 sqrt(k)) * n / nnz positions of a systematic sample (a
    uniform random start, then a fixed stride: every element has the same
    chance, and the positions are in memory order; the stride is coprime with
    the static ``channels`` count so that every channel is visited equally). The
    hits are then a sample of the finite non-zero values of about k or more
    elements. Nothing is compacted before sampling, and under XLA nothing is
    compacted at all (the selection takes a validity mask).
    """
    nnz_f = tf.cast(nnz, _F64)
    n_f = tf.cast(n, _F64)
    all_active = tf.equal(nnz_f, n_f)
    k_eff = k + 5.0 * float(np.sqrt(k))
    n_static = flat.shape[0]

    def quantiles(vals, valid):
        return _sample_quantiles(vals, valid, parts, q)

    def sampled(m):  # m: number of positions (int32 scalar or Python int); XLA: static
        i = tf.cast(tf.range(m), _F64)
        stride = n_f / tf.cast(m, _F64)
        pos = tf.cast(tf.floor((i + _uniform(tf.reshape(m, [1]), seed, 1)) * stride), tf.int64)
        vals = tf.gather(flat, tf.clip_by_value(pos, 0, tf.maximum(n - 1, 0)))
        return quantiles(vals, tf.math.is_finite(vals) & tf.not_equal(vals, 0))

    def strided(m):
        # The same systematic sample as ``sampled`` with a whole stride: one strided
        # slice instead of computing and gathering m positions (half the time on sparse
        # tensors). A stride coprime with the channel count visits every channel equally.
        step = _coprime_at_most(tf.maximum(n // tf.cast(m, tf.int64), 1), channels)
        start = tf.cast(tf.floor(_uniform([], seed, 1) * tf.cast(step, _F64)), tf.int64)
        vals = tf.reshape(tf.strided_slice(flat, tf.reshape(start, [1]), tf.reshape(n, [1]),
                                           tf.reshape(step, [1])), [-1])
        vals = tf.boolean_mask(vals, tf.math.is_finite(vals) & tf.not_equal(vals, 0))
        return quantiles(vals, tf.ones_like(vals, tf.bool))

    xla = in_xla_context()
    if xla:
        # Static shapes only: the selection runs over the whole tensor with the
        # activity mask (exact, a few fused passes), or over k positions when
        # every element is finite and non-zero.
        def whole():
            return quantiles(flat, active)

        if n_static is None or n_static <= 2 * k:
            return whole()
        return tf.cond(all_active, lambda: sampled(k), whole)

    m = tf.math.ceil(_where(all_active, float(k), k_eff * n_f / tf.maximum(nnz_f, 1.0)))

    def compacted():
        vals = tf.boolean_mask(flat, active)
        return quantiles(vals, tf.ones_like(vals, tf.bool))

    return tf.cond(2.0 * m >= n_f, compacted, lambda: strided(m))


def _coprime_at_most(s: tf.Tensor, channels: int | None) -> tf.Tensor:
    """The largest integer in [s - 15, s] (and >= 1) coprime with ``channels``; ``s`` when
    no channel count is known or none of them is (then some channels are sampled more)."""
    primes, c, p = [], int(channels or 1), 2
    while c > 1:  # the prime factors of a static channel count
        if c % p == 0:
            primes.append(p)
            while c % p == 0:
                c //= p
        p += 1
    if not primes:
        return s
    cand = s - tf.range(16, dtype=s.dtype)
    ok = cand >= 1
    for p in primes:
        ok &= tf.not_equal(cand % p, 0)
    first = tf.argmax(tf.cast(ok, tf.int32), output_type=tf.int32)
    return tf.where(tf.reduce_any(ok), cand[first], s)


# --------------------------------------------------------------------------- quantiles


def _sample_quantiles(
    vals: tf.Tensor, valid: tf.Tensor, parts: Mapping[str, tf.Tensor], q: np.ndarray,
    select=None,
) -> tuple[tf.Tensor, tf.Tensor]:
    """Value and log10-magnitude percentiles from a sample: the finite ``vals[valid]``.

    Value percentiles are taken over the finite values with numpy's linear
    interpolation between order statistics; the rank of an order statistic is
    mapped into the sample within its sign stratum, using the exact negative /
    zero / positive counts. This is exact when the sample holds every finite
    non-zero value, and never lets sampling noise move a value across zero.
    The sample's order statistics come from ``select``: ``_select`` (no sort,
    for whole tensors) by default, ``_select_sorted`` for the bounded samples of
    accumulator states.
    """
    p = tf.constant(q / 100.0, _F64)
    n_neg, n_pos = parts["neg_count"], parts["pos_count"]
    n_fin = parts["finite_count"]
    n_zero = n_fin - n_neg - n_pos
    valid = valid & tf.math.is_finite(vals)
    m = _count(valid)
    m_neg = _count(valid & (vals < 0))
    m_pos = m - m_neg
    vmin, vmax = parts["min"], parts["max"]

    def stratum(j, n_pop, m_samp, offset):
        # Population rank j (0-based within the stratum) -> sample position.
        s = _where(
            tf.equal(n_pop, m_samp), j, j * (m_samp - 1.0) / tf.maximum(n_pop - 1.0, 1.0)
        )
        return offset + s

    r = p * tf.maximum(n_fin - 1.0, 0.0)
    lo = tf.floor(r)
    hi = tf.minimum(lo + 1.0, tf.maximum(n_fin - 1.0, 0.0))
    i = tf.concat([lo, hi], 0)  # population ranks
    is_neg = i < n_neg
    s = _where(
        is_neg, stratum(i, n_neg, m_neg, 0.0), stratum(i - n_neg - n_zero, n_pos, m_pos, m_neg)
    )
    s = tf.clip_by_value(s, 0.0, tf.maximum(m - 1.0, 0.0))
    s_lo, s_hi = tf.floor(s), tf.math.ceil(s)
    # Magnitude ranks: log10|x| percentiles over the finite non-zero values (log10
    # is monotone, so only the order statistics used are logged).
    rm = p * tf.maximum(m - 1.0, 0.0)
    rm_lo, rm_hi = tf.floor(rm), tf.math.ceil(rm)
    nv, nm = 2 * len(q), len(q)
    ranks = tf.cast(tf.concat([s_lo, s_hi, rm_lo, rm_hi], 0), tf.int32)
    groups = tf.constant([0] * (2 * nv) + [1] * (2 * nm), tf.int32)
    if select is None:
        # Non-negative samples (ReLU outputs) are their own magnitudes: half the keys.
        picked = tf.cond(
            tf.equal(m_neg, 0.0),
            lambda: _select(vals, None, valid, ranks, groups),
            lambda: _select(vals, tf.abs(vals), valid, ranks, groups),
        )
    else:
        picked = select(vals, tf.abs(vals), valid, ranks, groups)
    picked = tf.cast(picked, _F64)
    a, b, la, lb = tf.split(picked, [nv, nv, nm, nm])
    v = _where(s_hi > s_lo, a + (b - a) * (s - s_lo), a)
    v = _where(is_neg, _where(m_neg > 0, v, vmin), _where(m_pos > 0, v, vmax))
    v = _where(is_neg, v, _where(i < n_neg + n_zero, 0.0, v))
    a, b = tf.split(v, 2)
    vq = _where(hi > lo, a + (b - a) * (r - lo), a)
    # The extremes are known exactly; sampled estimates stay inside them.
    vq = _where(tf.equal(p, 0.0), vmin, _where(tf.equal(p, 1.0), vmax, vq))
    vq = tf.clip_by_value(vq, tf.minimum(vmin, vmax), tf.maximum(vmin, vmax))
    vq = _where(n_fin > 0, vq, _NAN)

    la, lb = _log10(la), _log10(lb)
    lq = _where(rm_hi > rm_lo, la + (lb - la) * (rm - rm_lo), la)
    max_abs = tf.maximum(tf.abs(vmin), tf.abs(vmax))
    lq = _where(
        tf.equal(p, 0.0),
        _log10(parts["min_abs"]),
        _where(tf.equal(p, 1.0), _log10(max_abs), lq),
    )
    lq = _where(m > 0, lq, _NAN)
    return vq, lq


def _order_bits(v: tf.Tensor) -> tuple[tf.Tensor, int]:
    """Integer keys whose unsigned order is the order of the floats ``v`` (and their width).

    float32 -> int32 bit patterns, float64 -> int64; the sign bit is flipped so
    that unsigned digits taken from the top down rank the values.
    """
    if v.dtype == _F64:
        it, bits = tf.int64, 64
    else:
        v, it, bits = tf.cast(v, tf.float32), tf.int32, 32
    b = tf.bitcast(v, it)
    low = tf.constant(2 ** (bits - 1) - 1, it)
    sign = tf.bitwise.right_shift(b, bits - 1)  # arithmetic: all ones for negatives
    signed = tf.bitwise.bitwise_xor(b, tf.bitwise.bitwise_and(sign, low))
    return tf.bitwise.bitwise_xor(signed, tf.constant(-(2 ** (bits - 1)), it)), bits


def _from_order_bits(u: tf.Tensor, bits: int) -> tf.Tensor:
    it = u.dtype
    signed = tf.bitwise.bitwise_xor(u, tf.constant(-(2 ** (bits - 1)), it))
    low = tf.constant(2 ** (bits - 1) - 1, it)
    b = tf.bitwise.bitwise_xor(
        signed, tf.bitwise.bitwise_and(tf.bitwise.right_shift(signed, bits - 1), low)
    )
    return tf.bitcast(b, _F64 if bits == 64 else tf.float32)


def _select(vals, mags, valid, ranks, groups) -> tf.Tensor:
    """Exact order statistics without sorting (radix selection).

    Query j asks for the ``ranks[j]``-th smallest (0-based) of ``vals[valid]``
    (``groups[j]`` = 0) or of ``mags[valid]`` (``groups[j]`` = 1). Each pass
    histograms the next 10-11 bits of the order keys of the elements that still
    share every query's key prefix, so 3 passes (float32) or 6 (float64) find
    every key exactly: linear time, no sort, no data-dependent shapes, and the
    histograms are scatter-adds that XLA compiles into one loop. Ranks past the
    end give unspecified values (callers mask them). ``mags=None``: the magnitudes are the
    values themselves (no valid value is negative), so both groups query one key array.
    """
    if mags is None:
        u, bits = _order_bits(vals)
        slot_e = _where(valid, tf.zeros_like(valid, tf.int32), -1)
        groups = tf.zeros_like(groups)
        n_groups = 1
    else:
        u, bits = _order_bits(tf.concat([vals, mags], 0))
        ones = tf.ones_like(valid, tf.int32)
        slot_e = _where(tf.concat([valid, valid], 0), tf.concat([0 * ones, ones], 0), -1)
        n_groups = 2
    it = u.dtype
    xla = in_xla_context()
    nq = ranks.shape[0]
    widths = [11, 11, 10] if bits == 32 else [11, 11, 11, 11, 10, 10]
    slot_q = groups
    rem = ranks
    key = tf.zeros([nq], it)
    shift = bits
    for step, w in enumerate(widths):
        shift -= w
        nb = 2**w
        digit = tf.cast(tf.bitwise.bitwise_and(tf.bitwise.right_shift(u, shift), nb - 1), tf.int32)
        size = n_groups * nb
        seg = _where(slot_e >= 0, slot_e * nb + digit, size)  # dropped: one spare bin
        if xla:
            hist = tf.math.unsorted_segment_sum(tf.ones_like(seg), seg, size + 1)
        else:
            hist = tf.math.bincount(seg, minlength=size + 1, maxlength=size + 1)
        row = tf.gather(tf.cumsum(tf.reshape(hist[:size], [n_groups, nb]), axis=1), slot_q)
        d = tf.minimum(tf.reduce_sum(tf.cast(row <= rem[:, None], tf.int32), axis=1), nb - 1)
        rem = rem - _where(d > 0, tf.gather(row, tf.maximum(d - 1, 0), batch_dims=1), 0)
        key = tf.bitwise.bitwise_or(tf.bitwise.left_shift(key, tf.cast(w, it)), tf.cast(d, it))
        if step + 1 < len(widths):
            # Queries sharing a prefix share a slot (the largest query index among them).
            idx = slot_q * nb + d
            table = tf.tensor_scatter_nd_max(
                tf.fill([size], -1), idx[:, tf.newaxis], tf.range(nq, dtype=tf.int32)
            )
            slot_q = tf.gather(table, idx)
            slot_e = _where(slot_e >= 0, tf.gather(table, tf.maximum(slot_e * nb + digit, 0)), -1)
            n_groups = nq
    return _from_order_bits(key, bits)


def _select_sorted(vals, mags, valid, ranks, groups) -> tf.Tensor:
    """``_select`` by sorting: faster for small samples, and vectorisable (``vectorized_map``
    has no batched form of ``_select``'s bincount, bitcast and scatter-max)."""
    inf = tf.constant(_INF, vals.dtype)
    by_value = tf.sort(_where(valid, vals, inf))
    by_mag = tf.sort(_where(valid, mags, inf))
    table = tf.stack([by_value, by_mag])
    last = tf.shape(vals, out_type=tf.int32)[0] - 1
    idx = tf.stack([groups, tf.clip_by_value(ranks, 0, tf.maximum(last, 0))], axis=1)
    return tf.gather_nd(table, idx)


def _log10(v):
    return tf.math.log(v) / np.log(10.0)


# --------------------------------------------------------------------------- vector


def _assemble(
    parts: Mapping[str, tf.Tensor], e: tf.Tensor, view: str, q: np.ndarray
) -> tf.Tensor:
    """The packed vector (``metadata.tensor_stats_fields`` layout) from exact parts."""
    count = parts["count"]
    nf = parts["finite_count"]
    posinf, neginf = parts["posinf_count"], parts["neginf_count"]
    nan_count = tf.maximum(count - nf - posinf - neginf, 0.0)
    n_neg, n_pos = parts["neg_count"], parts["pos_count"]
    has = nf > 0
    denom = tf.maximum(nf, 1.0)

    def rate(v):
        return _where(has, v, _NAN)

    scale = _pow2(e)
    mean_s = parts["mean"] * _pow2(-e)
    m2_s = parts["m2"]
    std = tf.sqrt(m2_s / denom) * scale
    sumsq_s = m2_s + nf * mean_s * mean_s
    l2 = tf.sqrt(sumsq_s) * scale
    rms = tf.sqrt(sumsq_s / denom) * scale

    if "_vq" in parts:
        vq, lq = parts["_vq"], parts["_lq"]
    else:
        vals = parts["sample_values"]
        vq, lq = _sample_quantiles(vals, tf.math.is_finite(vals), parts, q, _select_sorted)
    base = tf.stack([
        tf.constant(_NAN, _F64),  # epoch: filled by the caller
        count,
        nf,
        nan_count,
        posinf,
        neginf,
        rate((nf - n_neg - n_pos) / denom),
        # Over the non-zero values, as the article reads it: a ReLU output is +100%.
        _where(n_pos + n_neg > 0, (n_pos - n_neg) / tf.maximum(n_pos + n_neg, 1.0), _NAN),
        rate(parts["mean"]),
        rate(std),
        rate(rms),
        rate(l2),
        rate(parts["min"]),
        rate(parts["max"]),
        rate((n_neg + n_pos) / denom),
        parts["dead_rate"] if "dead_rate" in parts
        else _dead_rate(parts["channel_nnz"], count),
        parts["spatial_dead_rate"] if "spatial_dead_rate" in parts
        else _dead_rate(parts["spatial_nnz"], count),
    ])
    extras = tf.fill([len(metadata.view_extra_fields(view, q))], tf.constant(_NAN, _F64))
    return tf.concat([base, vq, lq, extras], axis=0)


@_no_autograph
def tensor_stats(
    x,
    view: str,
    *,
    quantiles: Sequence[float] = metadata.DEFAULT_QUANTILES,
    sample_size: int = DEFAULT_SAMPLE_SIZE,
    seed=None,
    name: str | None = None,
) -> tf.Tensor:
    """Statistics of ``x`` as a float64 vector laid out as ``metadata.tensor_stats_fields``.

    The ``epoch`` slot and the view's extra slots are NaN (callers fill them).
    ``seed`` (int or shape-[2] int tensor) makes the percentile sample
    deterministic; ``name`` names the tensor in error messages. Raises
    ``TypeError`` for string/complex tensors and ``ValueError`` for unknown rank.
    """
    metadata.tensor_stats_fields(view, quantiles)  # validates the view
    q = _check_quantiles(quantiles)
    k = _check_sample_size(sample_size)
    x = to_float(x, name)
    if x.shape.rank is None:
        raise ValueError(f"tensor {_describe(x, name)!r} must have a known rank")
    n_static = x.shape.num_elements()
    if n_static is not None:
        k = max(1, min(k, n_static))  # no padding to sort for small tensors
    with tf.name_scope("tensor_stats"):
        parts = _batch_parts(x, k, seed, q=q)
        return _assemble(parts, parts["_exp"], view, q)


# --------------------------------------------------------------------------- accumulator


def _flag_shapes(x_shape) -> tuple[list[int], list[int]]:
    shape = tf.TensorShape(x_shape)
    if shape.rank is None:
        raise ValueError("empty_state needs a tensor shape of known rank")
    rank = shape.rank
    dims = shape.as_list()
    if rank == 0:
        channel = [1]
    else:
        channel = [dims[-1]] if dims[-1] is not None else [0]  # unknown: not tracked
    if rank >= 3 and all(d is not None for d in dims[1:-1]):
        spatial = dims[1:-1]
    else:
        spatial = [0]
    return channel, spatial


@_no_autograph
def empty_state(x_shape, *, sample_size: int = DEFAULT_SAMPLE_SIZE) -> dict[str, tf.Tensor]:
    """An accumulator holding nothing, for tensors of static shape ``x_shape``.

    All entries are float64 tensors of fixed shape, so a state can live in
    ``tf.Variable``s. The batch axis may be unknown; the channel (last) axis and
    the spatial axes must be known for the dead rates to be tracked (otherwise
    those slots finalize to NaN).
    """
    k = _check_sample_size(sample_size)
    channel, spatial = _flag_shapes(x_shape)
    z = tf.constant(0.0, _F64)
    return {
        "count": z,
        "finite_count": z,
        "posinf_count": z,
        "neginf_count": z,
        "pos_count": z,
        "neg_count": z,
        "mean": z,
        "m2": z,
        "min": tf.constant(_INF, _F64),
        "max": tf.constant(-_INF, _F64),
        "min_abs": tf.constant(_INF, _F64),
        "channel_nnz": tf.zeros(channel, _F64),
        "spatial_nnz": tf.zeros(spatial, _F64),
        "sample_keys": tf.fill([k], tf.constant(_INF, _F64)),
        "sample_values": tf.fill([k], tf.constant(_INF, _F64)),
    }


def _check_state(state: Mapping[str, tf.Tensor]) -> None:
    missing = set(STATE_MERGE) - set(state)
    if missing:
        raise ValueError(f"not a tb_introspect statistics state: missing {sorted(missing)}")


@_no_autograph
def update_state(
    state: Mapping[str, tf.Tensor], x, seed=None, *, name: str | None = None
) -> dict[str, tf.Tensor]:
    """``state`` with the tensor ``x`` (one batch / step) folded in.

    The same two functions do this in the training step, for all monitored
    tensors at once: ``batch_state`` (one pass set over ``x``) and
    ``merge_pair`` (vectorised over a leading tensor axis).
    """
    _check_state(state)
    k = int(state["sample_keys"].shape[-1])
    x = to_float(x, name)
    if x.shape.rank is None:
        raise ValueError(f"tensor {_describe(x, name)!r} must have a known rank")
    with tf.name_scope("update_state"):
        canonical = _canonical_shape(x.shape.as_list())
        if seed is None:
            seed = _content_seed(state["count"], tf.cast(tf.size(x), _F64))
        parts = batch_state(_as_canonical(x, canonical), k, _seed_pair(seed))
        for key in ("channel_nnz", "spatial_nnz"):
            want = state[key].shape
            if want.num_elements() == 0:
                parts[key] = tf.zeros(want, _F64)
            elif parts[key].shape.num_elements() != want.num_elements() or (
                key == "channel_nnz" and not parts[key].shape.is_compatible_with(want)
            ):
                raise ValueError(
                    f"tensor {_describe(x, name)!r} of shape {x.shape} does not match the"
                    f" state's {key} counts of shape {want}"
                )
            else:
                parts[key] = tf.reshape(parts[key], want)
        return merge_pair(state, parts)


def _canonical_shape(shape: Sequence[int | None]) -> tuple[int | None, ...]:
    """``update_state``'s canonical shape (batch unknown) of a tensor of static ``shape``.

    ``[batch, channels]``, or ``[batch, positions, channels]`` when there are
    spatial/time axes of known size (flattened into one: the dead rates stay the
    same). A vector is one row whose elements are the channels; a scalar is one
    channel.
    """
    shape = list(shape)
    rank = len(shape)
    if rank == 0:
        return (None, 1)
    if rank == 1:
        return (None, shape[0]) if shape[0] is not None else (None, 0)
    c = shape[-1]
    spatial = shape[1:-1]
    if rank >= 3 and c is not None and all(d is not None for d in spatial):
        return (None, int(np.prod(spatial, dtype=np.int64)), c)
    return (None, c if c is not None else 0)


def _as_canonical(x: tf.Tensor, canonical: Sequence[int | None]) -> tf.Tensor:
    """``x`` reshaped to its canonical shape (see ``_canonical_shape``)."""
    rank = x.shape.rank
    if rank == 0:
        return tf.reshape(x, [1, 1])
    if rank == 1:
        return x[tf.newaxis]
    if len(canonical) == 3:
        return tf.reshape(x, [tf.shape(x)[0], canonical[1], canonical[2]])
    if canonical[1] == 0:  # unknown channel count: one channel per row element, untracked
        return tf.reshape(x, [tf.shape(x)[0], -1])
    return tf.reshape(x, [-1, canonical[1]])


def batch_state(x: tf.Tensor, k: int, seed: tf.Tensor) -> dict[str, tf.Tensor]:
    """The accumulator state of one batch ``x`` (canonical ``[B, C]`` or ``[B, P, C]``).

    This runs in the training step for every monitored output at every
    accumulated step, so it makes few passes over ``x``, each a single fused
    kernel where TensorFlow has one: a sum (which also detects non-finite
    values), min, max, the Euclidean norm (sum of squares), and one sign tensor
    whose per-column norms give the exact non-zero count of every
    (position, channel) column (hence the activation rate and both dead rates)
    and whose sum gives the positive/negative split. Every row counts. The
    percentile sample is ``k`` uniformly drawn positions whose non-zero values
    are kept, with bottom-k keys distributed as the smallest of ``nnz`` uniform
    keys, so merges over steps and replicas stay uniform over the non-zero
    values. The smallest non-zero magnitude comes from that sample (exact when
    it holds every non-zero value). ``seed`` is an int64 pair.
    """
    x = to_float(x)
    flat = tf.reshape(x, [-1])
    n = tf.size(flat, out_type=tf.int64)
    count = tf.cast(n, _F64)
    zero = tf.constant(0.0, _F64)
    inf = tf.constant(_INF, x.dtype)
    total = tf.reduce_sum(flat)

    def finite_case():
        return x, count, zero, zero

    def nonfinite_case():
        ok = tf.math.is_finite(x)
        return (tf.where(ok, x, tf.zeros_like(x)), _count(ok),
                _count(tf.equal(x, inf)), _count(tf.equal(x, -inf)))

    # A sum is finite only when every value is (an overflow takes the slow path, still exact).
    finite_sum = tf.math.is_finite(total)
    z, nf, posinf, neginf = tf.cond(finite_sum, finite_case, nonfinite_case)
    signs, channel, spatial = _unit_counts(z)
    nnz = tf.reduce_sum(channel)
    balance = tf.round(tf.cast(tf.reduce_sum(signs), _F64))
    has = nf > 0
    finite_all = tf.equal(nf, count)

    def extreme(fn, fill):
        return lambda: tf.cast(fn(tf.where(tf.math.is_finite(flat), flat, fill)), _F64)

    vmin = tf.cond(finite_all, lambda: tf.cast(tf.reduce_min(flat), _F64),
                   extreme(tf.reduce_min, inf))
    vmax = tf.cond(finite_all, lambda: tf.cast(tf.reduce_max(flat), _F64),
                   extreme(tf.reduce_max, -inf))
    vmin = _where(has, vmin, _INF)
    vmax = _where(has, vmax, -_INF)
    e = _scale_exponent(_where(has, vmin, 0.0), _where(has, vmax, 0.0))
    s = tf.cond(finite_sum, lambda: tf.cast(total, _F64),
                lambda: tf.cast(tf.reduce_sum(z), _F64))
    # A float32 sum can round the mean out of [min, max]; the true mean is inside.
    mean = tf.clip_by_value(s / tf.maximum(nf, 1.0), tf.minimum(vmin, vmax), tf.maximum(vmin, vmax))
    m2 = _second_moment(z, nf, mean, e)
    vals, keys = _draw(tf.reshape(z, [-1]), n, nnz, k, seed)
    pos = (nnz + balance) / 2.0
    return {
        "count": count,
        "finite_count": nf,
        "posinf_count": posinf,
        "neginf_count": neginf,
        "pos_count": pos,
        "neg_count": nnz - pos,
        "mean": _where(has, mean, 0.0),
        "m2": m2,
        "min": vmin,
        "max": vmax,
        "min_abs": tf.reduce_min(_where(tf.math.is_finite(keys), tf.abs(vals), _INF)),
        "channel_nnz": channel,
        "spatial_nnz": spatial,
        "sample_keys": keys,
        "sample_values": vals,
    }


def _unit_counts(x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """(sign tensor ``[B, P*C]``, per-channel and per-position non-zero counts) of a canonical
    batch. The norm of a column of signs is the square root of its non-zero count (exact
    small integers), so the counts of every column cost one sign pass and one fused norm
    kernel. A NaN makes the counts of its column NaN."""
    rows = tf.reshape(x, [tf.shape(x)[0], tf.reduce_prod(tf.shape(x)[1:])])
    signs = tf.sign(rows)
    per_column = tf.round(_sum_of_squares(signs, axis=0))
    if x.shape.rank == 3:
        block = tf.reshape(per_column, tf.shape(x)[1:])
        return signs, tf.reduce_sum(block, axis=0), tf.reduce_sum(block, axis=1)
    return signs, per_column, tf.zeros([0], _F64)


def activity_state(x: tf.Tensor) -> dict[str, tf.Tensor]:
    """The exact activity part of ``batch_state``: ``count``, ``channel_nnz`` and
    ``spatial_nnz`` of one batch ``x`` (canonical ``[B, C]`` or ``[B, P, C]``).

    This is what every step of a window pays when the other statistics come from some
    of its steps only (``Options.stats_every``): two passes over ``x`` instead of
    ``batch_state``'s seven. Non-finite values are not masked out (a NaN makes its
    column's counts NaN, an infinity counts as non-zero); a caller that sees a NaN
    takes ``batch_state`` for that batch.
    """
    x = to_float(x)
    _, channel, spatial = _unit_counts(x)
    return {"count": tf.cast(tf.size(x, out_type=tf.int64), _F64),
            "channel_nnz": channel, "spatial_nnz": spatial}


def _sum_of_squares(x: tf.Tensor, axis: int | None = None) -> tf.Tensor:
    """sum(x*x) as float64: TensorFlow's fused norm kernel (no squared copy), or XLA's fusion."""
    if in_xla_context():  # XLA has no EuclideanNorm; it fuses the square into the sum
        return tf.cast(tf.reduce_sum(tf.square(x), axis=axis), _F64)
    return tf.square(tf.cast(tf.math.reduce_euclidean_norm(x, axis=axis), _F64))


def _second_moment(z: tf.Tensor, nf: tf.Tensor, mean: tf.Tensor, e: tf.Tensor) -> tf.Tensor:
    """Sum of squared deviations of the finite values ``z`` (non-finite ones are 0 in ``z``),
    in units of ``4**e``.

    Fast path: ``sum(z*z) - n*mean**2`` from one pass in the tensor's own dtype.
    When the squares leave float32's range or the subtraction cancels (``|mean|
    >> std``), a second, scaled float64 pass gives the exact value.
    """
    f = _pow2(-e)
    sumsq = _sum_of_squares(z)
    fast = (sumsq - nf * mean * mean) * f * f
    ok = (tf.math.is_finite(sumsq) & (tf.abs(e) < 40.0)
          & (tf.equal(sumsq, 0.0) | (fast * 1e3 > sumsq * f * f)))

    def exact():
        d = tf.cast(z, _F64) * f - mean * f
        # The zeros that stand for non-finite values each added (0 - mean)^2.
        return tf.reduce_sum(d * d) - (tf.cast(tf.size(z), _F64) - nf) * (mean * f) ** 2

    return tf.maximum(tf.cond(ok, lambda: fast, exact), 0.0)


def _draw(zflat: tf.Tensor, n: tf.Tensor, nnz: tf.Tensor, k: int, seed: tf.Tensor):
    """``k`` slots of non-zero finite values (+inf padded) and their bottom-k keys.

    Every element in order when there are at most ``k``; otherwise ``k`` uniform
    draws of positions, of which the non-zero ones are kept. When that finds
    fewer than ``_FEW_HITS`` of a sparse tensor's non-zero values, the draw is
    made among the non-zero values themselves (a compaction pass, paid only by
    nearly-all-zero tensors). A draw keeping ``m`` of ``nnz`` non-zero values
    gets the ``m`` smallest of ``nnz`` uniform keys (``S_j / (S_m + G)``:
    exponential partial sums, ``G ~ Gamma(nnz - m + 1)`` by Wilson-Hilferty), so
    a bottom-k merge keeps every batch in proportion to its non-zero count.
    """
    exact = n <= k
    u = _uniform([k], seed, 1)
    drawn = tf.minimum(tf.cast(tf.floor(u * tf.cast(n, _F64)), tf.int64), tf.maximum(n - 1, 0))
    pos = _where(exact, tf.range(k, dtype=tf.int64), drawn)
    in_range = pos < n
    v = tf.cond(n > 0, lambda: tf.gather(zflat, tf.clip_by_value(pos, 0, tf.maximum(n - 1, 0))),
                lambda: tf.zeros([k], zflat.dtype))
    valid = in_range & tf.not_equal(v, 0)
    hits = _count(valid)

    def among_nonzero():
        active = tf.not_equal(zflat, 0)
        nnz_i = tf.cast(nnz, tf.int64)
        if in_xla_context():  # no dynamic shapes: compact by a scatter to the running count
            idx = _where(active, tf.cumsum(tf.cast(active, tf.int64)) - 1, n)
            compact = tf.scatter_nd(idx[:, tf.newaxis], zflat, tf.reshape(n + 1, [1]))
        else:
            compact = tf.boolean_mask(zflat, active)
        ranks = _where(nnz_i <= k, tf.range(k, dtype=tf.int64),
                       tf.minimum(tf.cast(tf.floor(u * nnz), tf.int64), nnz_i - 1))
        ok = ranks < nnz_i
        picked = tf.gather(compact, tf.clip_by_value(ranks, 0, tf.maximum(nnz_i - 1, 0)))
        return picked, ok, nnz_i <= k

    # every_kept: each non-zero value is in the sample once (i.i.d. keys then).
    v, valid, every_kept = tf.cond((hits < nnz) & (hits < _FEW_HITS), among_nonzero,
                                   lambda: (v, valid, exact))
    vals = _where(valid, tf.cast(v, _F64), _INF)
    m = _count(valid)
    spacings = -tf.math.log1p(-_uniform([k], seed, 2))
    cum = tf.cumsum(spacings)
    shape = tf.maximum(nnz - m + 1.0, 1.0)
    zn = _normal([], seed, 3)
    gamma = shape * tf.pow(
        tf.maximum(1.0 - 1.0 / (9.0 * shape) + zn / (3.0 * tf.sqrt(shape)), 0.0), 3.0
    )
    last = tf.gather(cum, tf.maximum(tf.cast(m, tf.int64) - 1, 0))
    ordered = cum / (last + gamma)
    rank = tf.cumsum(tf.cast(valid, tf.int64)) - 1
    drawn_keys = tf.gather(ordered, tf.maximum(rank, 0))
    keys = _where(every_kept, _uniform([k], seed, 4), drawn_keys)
    return vals, _where(valid, keys, _INF)


#: Fewer sample hits than this in a sparse tensor: draw among its non-zero values instead.
_FEW_HITS = 32.0


def _state_exp(state: Mapping[str, tf.Tensor]) -> tf.Tensor:
    return _scale_exponent(
        _where(state["finite_count"] > 0, state["min"], 0.0),
        _where(state["finite_count"] > 0, state["max"], 0.0),
    )


def _rescale_m2(m2, e_from, e_to):
    """m2 in units of 4**e_from -> units of 4**e_to (two steps: 4**d may overflow)."""
    f = _pow2(e_from - e_to)
    return m2 * f * f


def merge_pair(a: Mapping[str, tf.Tensor], b: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """Merge two states, elementwise over any leading axes (one state per tensor).

    This is the in-step engine's merge: one op per field for all monitored
    tensors. Channel and position counts of states stacked together must
    be padded to a common width (with 0). Moments merge with Chan's formula
    at the merged scale exponent.
    """
    out = {
        key: a[key] + b[key]
        for key in ("count", "finite_count", "posinf_count", "neginf_count", "pos_count",
                    "neg_count")
    }
    for key in ("channel_nnz", "spatial_nnz"):
        out[key] = a[key] + b[key]
    for key, fn in (("min", tf.minimum), ("max", tf.maximum), ("min_abs", tf.minimum)):
        out[key] = fn(a[key], b[key])
    na, nb = a["finite_count"], b["finite_count"]
    n = out["finite_count"]
    e = _state_exp(out)
    mean_a, mean_b = a["mean"] * _pow2(-e), b["mean"] * _pow2(-e)
    mean_s = (na * mean_a + nb * mean_b) / tf.maximum(n, 1.0)
    da = _where(na > 0, mean_a - mean_s, 0.0)
    db = _where(nb > 0, mean_b - mean_s, 0.0)
    m2 = (_rescale_m2(a["m2"], _state_exp(a), e) + na * da * da
          + _rescale_m2(b["m2"], _state_exp(b), e) + nb * db * db)
    out["mean"] = mean_s * _pow2(e)
    out["m2"] = m2
    keys = tf.concat([a["sample_keys"], b["sample_keys"]], axis=-1)
    vals = tf.concat([a["sample_values"], b["sample_values"]], axis=-1)
    k = a["sample_keys"].shape[-1]
    neg, idx = tf.math.top_k(-keys, k=k, sorted=True)
    out["sample_keys"] = -neg
    out["sample_values"] = tf.gather(vals, idx, batch_dims=keys.shape.rank - 1)
    return out


def many_states(tensors: Sequence[tf.Tensor], k: int, seed: tf.Tensor) -> dict[str, tf.Tensor]:
    """States of many tensors of any shapes at once, stacked ``[len(tensors), ...]``.

    For logging time (variables, gradient sums): the tensors, each seen as
    ``[rows, channels]`` (last axis = channels), are concatenated into one
    buffer and every field is a segment reduction over it, so the cost is a
    few dozen ops (and one fill per tensor) whatever the number of tensors. Values are
    finite unless a tensor's sum is not, so the masking of non-finite values is
    paid only then. Channel counts are zero-padded
    to the widest tensor; there are no spatial counts. The percentile sample of
    each tensor is every non-zero value when it has at most ``k``, otherwise
    ``k`` uniform draws among its non-zero values. Sums are taken in float64.
    """
    n = len(tensors)
    mats = [as_rows(to_float(t)) for t in tensors]
    sizes = np.array([int(m.shape.num_elements()) for m in mats], np.int64)
    chans = np.array([int(m.shape[-1]) for m in mats], np.int64)
    cmax = int(max(chans.max(initial=0), 1))
    values = _concat_flat(mats)
    segs = _Segments(sizes)
    # Each element's (tensor, channel) cell of the padded [n, cmax] count block.
    cell = np.concatenate([i * cmax + np.arange(s) % max(c, 1)
                           for i, (s, c) in enumerate(zip(sizes, chans, strict=True))]
                          or [np.zeros(0, np.int64)])
    count = tf.constant(sizes, _F64)
    total = segs.sum(values)
    # Finite sums mean finite values (an overflowing sum takes the slow path, still exact).
    all_finite = tf.reduce_all(tf.math.is_finite(total))

    def finite_case():
        zeros = tf.zeros_like(count)
        return values, count, zeros, zeros, segs.min(values), segs.max(values), total

    def nonfinite_case():
        finite = tf.math.is_finite(values)
        z = tf.where(finite, values, 0.0)
        return (z, segs.sum(tf.cast(finite, _F64)),
                segs.sum(tf.cast(tf.equal(values, _INF), _F64)),
                segs.sum(tf.cast(tf.equal(values, -_INF), _F64)),
                segs.min(tf.where(finite, values, _INF)),
                segs.max(tf.where(finite, values, -_INF)), segs.sum(z))

    z, nf, posinf, neginf, vmin, vmax, s = tf.cond(all_finite, finite_case, nonfinite_case)
    nz = tf.not_equal(z, 0.0)
    has = nf > 0
    vmin, vmax = _where(has, vmin, _INF), _where(has, vmax, -_INF)
    mean = s / tf.maximum(nf, 1.0)
    e = _scale_exponent(_where(has, vmin, 0.0), _where(has, vmax, 0.0))
    dev = z * segs.spread(_pow2(-e)) - segs.spread(mean * _pow2(-e))
    m2 = tf.cond(all_finite, lambda: segs.sum(dev * dev),
                 lambda: segs.sum(tf.square(tf.where(tf.math.is_finite(values), dev, 0.0))))
    nnz = segs.sum(tf.cast(nz, _F64))
    pos = segs.sum(tf.cast(z > 0, _F64))
    per_channel = tf.math.unsorted_segment_sum(tf.cast(nz, _F64), tf.constant(cell, tf.int32),
                                               n * cmax)
    # The sample: uniform draws among each tensor's non-zero values (all of them when few).
    compact = tf.boolean_mask(z, nz)
    nnz_i = tf.cast(nnz, tf.int64)
    start = tf.cumsum(nnz_i, exclusive=True)
    j = tf.range(k, dtype=tf.int64)[tf.newaxis]
    every = nnz_i[:, tf.newaxis] <= k
    drawn = tf.cast(tf.floor(tf.random.stateless_uniform([n, k], seed, dtype=_F64)
                             * tf.cast(nnz_i[:, tf.newaxis], _F64)), tf.int64)
    rank = tf.where(every, j, tf.minimum(drawn, tf.maximum(nnz_i[:, tf.newaxis] - 1, 0)))
    valid = rank < nnz_i[:, tf.newaxis]
    total_nz = tf.size(compact, out_type=tf.int64)
    picked = tf.gather(tf.concat([compact, tf.zeros([1], _F64)], 0),
                       tf.where(valid, start[:, tf.newaxis] + rank, total_nz))
    return {
        "count": count,
        "finite_count": nf,
        "posinf_count": posinf,
        "neginf_count": neginf,
        "pos_count": pos,
        "neg_count": nnz - pos,
        "mean": _where(has, mean, 0.0),
        "m2": m2,
        "min": vmin,
        "max": vmax,
        "min_abs": segs.min(tf.where(nz, tf.abs(z), _INF)),
        "channel_nnz": tf.reshape(per_channel, [n, cmax]),
        "spatial_nnz": tf.zeros([n, 0], _F64),
        # Finalize reads only which slots are filled: every kept value is in the sample.
        "sample_keys": tf.where(valid, tf.zeros_like(picked), _INF),
        "sample_values": tf.where(valid, picked, _INF),
    }


def segment_dots(a: Sequence[tf.Tensor], b: Sequence[tf.Tensor] | None = None) -> tf.Tensor:
    """``[sum(a_i * b_i)]`` in float64 for tensors of any shapes (``b`` defaults to ``a``),
    as one segment sum over their concatenation (norms, update ratios, cosines)."""
    fa = _concat_flat(a)
    prod = fa * fa if b is None else fa * _concat_flat(b)
    return _Segments([int(t.shape.num_elements()) for t in a]).sum(prod)


def _concat_flat(tensors: Sequence[tf.Tensor]) -> tf.Tensor:
    flat = [tf.reshape(t, [-1]) for t in tensors]
    if len({t.dtype for t in flat}) == 1:  # one cast of the concatenation: fewer, wider ops
        return tf.cast(tf.concat(flat, 0), _F64)
    return tf.concat([tf.cast(t, _F64) for t in flat], 0)


class _Segments:
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
        return tf.where(self.empty, tf.constant(identity, r.dtype), r) if self.empty.any() else r

    def sum(self, v: tf.Tensor) -> tf.Tensor:
        return self._reduce(tf.math.segment_sum, v, 0.0)

    def min(self, v: tf.Tensor) -> tf.Tensor:
        return self._reduce(tf.math.segment_min, v, _INF)

    def max(self, v: tf.Tensor) -> tf.Tensor:
        return self._reduce(tf.math.segment_max, v, -_INF)

    def spread(self, per_segment: tf.Tensor) -> tf.Tensor:
        """Each segment's value repeated over its elements."""
        parts = tf.unstack(per_segment, num=len(self.sizes))
        return tf.concat([tf.fill([s], p) for s, p in zip(self.sizes, parts, strict=True)], 0)


def as_rows(x: tf.Tensor) -> tf.Tensor:
    """A variable or gradient as ``[rows, channels]`` (a vector: one row of channels)."""
    if x.shape.rank == 0:
        return tf.reshape(x, [1, 1])
    if x.shape.rank == 1:
        return x[tf.newaxis]
    return tf.reshape(x, [-1, x.shape[-1]])


@_no_autograph
def merge_stacked(stacked: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """Merge states stacked along a new leading axis of static size (e.g. from ``all_gather``)."""
    _check_state(stacked)
    r = stacked["count"].shape[0]
    if r is None:
        raise ValueError("merge_stacked needs a static number of stacked states")
    out = {key: stacked[key][0] for key in STATE_MERGE}
    for i in range(1, r):
        out = merge_pair(out, {key: stacked[key][i] for key in STATE_MERGE})
    return out


@_no_autograph
def merge_states(a: Mapping[str, tf.Tensor], b: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """Associative, commutative merge of two states (steps of an epoch, replicas)."""
    _check_state(a)
    _check_state(b)
    return merge_pair(a, b)


@_no_autograph
def merge_replicas(state: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """In replica context under ``tf.distribute``: every replica gets the merged state.

    Uses ``all_gather`` (min/max/bottom-k are not all-reduce sums). Outside a
    strategy, or with one replica, returns ``state`` unchanged.
    """
    _check_state(state)
    ctx = tf.distribute.get_replica_context()
    if ctx is None:
        raise ValueError("merge_replicas must be called in replica context (inside strategy.run)")
    if ctx.num_replicas_in_sync == 1:
        return dict(state)
    r = ctx.num_replicas_in_sync
    stacked = {}
    for key in STATE_MERGE:
        shape = [r, *state[key].shape.as_list()]
        if state[key].shape.num_elements() == 0:
            # Untracked counts: gathering a zero-sized tensor crashes TF's CPU collectives.
            stacked[key] = tf.zeros(shape, _F64)
        else:
            # all_gather loses the static shape that merge_stacked needs (top_k's k).
            stacked[key] = tf.reshape(ctx.all_gather(state[key][tf.newaxis], axis=0), shape)
    return merge_stacked(stacked)


@_no_autograph
def finalize(
    state: Mapping[str, tf.Tensor],
    view: str,
    *,
    quantiles: Sequence[float] = metadata.DEFAULT_QUANTILES,
) -> tf.Tensor:
    """The packed statistics vector (same layout as ``tensor_stats``) of a state."""
    metadata.tensor_stats_fields(view, quantiles)
    q = _check_quantiles(quantiles)
    _check_state(state)
    with tf.name_scope("finalize_stats"):
        parts = dict(state)
        valid = tf.math.is_finite(parts["sample_keys"])
        parts["sample_values"] = _where(valid, parts["sample_values"], _INF)
        has = parts["finite_count"] > 0
        parts["min"] = _where(has, parts["min"], _NAN)
        parts["max"] = _where(has, parts["max"], _NAN)
        return _assemble(parts, _state_exp(state), view, q)
