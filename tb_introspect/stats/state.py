"""Accumulator states: of one batch, of many tensors at once, and their merge.

A state is a dict of float64 tensors (``STATE_MERGE`` names each key and how it merges).
It holds exact counts, moments and extremes, the non-zero count of every channel and
spatial position, and a bounded percentile sample (``sample.draw``). ``finalize`` in
``vector.py`` turns any state into the packed statistics vector.
"""

from __future__ import annotations

from collections.abc import Mapping

import tensorflow as tf

from tb_introspect import stats_np
from tb_introspect.stats import sample, shapes
from tb_introspect.stats.numeric import (
    DEFAULT_SAMPLE_SIZE,
    F64,
    INF,
    check_sample_size,
    content_seed,
    count,
    in_xla_context,
    no_autograph,
    pow2,
    scale_exponent,
    sum_of_squares,
    to_float,
    where,
)

#: How each key of a state merges (see ``merge_pair``): ``sum`` adds
#: (``channel_nnz`` / ``spatial_nnz`` are the non-zero counts of each channel and of each
#: spatial position, over ``activity_count`` elements, so the activation rates and both dead
#: rates follow), ``min``/``max`` take the extreme (``channels`` / ``positions`` are the
#: numbers of real units, the count vectors may be zero-padded past them), ``moments`` is
#: (mean, m2) merged with Chan's formula using ``finite_count`` (m2 is stored scaled by
#: 4**-e, e from max(|min|, |max|)), ``bottom_k`` is the random-key sample (keys and values
#: merge together).
# The numpy twin's table, less ``sample_size``: a TensorFlow state carries its sample bound
# as the static slot count of its sample.
STATE_MERGE: dict[str, str] = {
    k: rule for k, rule in stats_np.STATE_MERGE.items() if k != "sample_size"}


def check_state(state: Mapping[str, tf.Tensor]) -> None:
    missing = set(STATE_MERGE) - set(state)
    if missing:
        raise ValueError(f"not a tb_introspect statistics state: missing {sorted(missing)}")


def state_exp(state: Mapping[str, tf.Tensor]) -> tf.Tensor:
    """The scale exponent the state's m2 is stored in."""
    return scale_exponent(
        where(state["finite_count"] > 0, state["min"], 0.0),
        where(state["finite_count"] > 0, state["max"], 0.0),
    )


# --------------------------------------------------------------------------- one batch


def batch_state(x: tf.Tensor, k: int, seed: tf.Tensor | None = None, *,
                thorough: bool = False) -> dict[str, tf.Tensor]:
    """The state of one batch ``x`` in canonical shape (``[B, C]`` or ``[B, P, C]``).

    This runs in the training step for every monitored output at every
    statistics step, so it makes few passes over ``x``, each a single fused
    kernel where TensorFlow has one: a sum (which also detects non-finite
    values), min, max, the Euclidean norm (sum of squares), and one sign tensor
    whose per-column norms give the exact non-zero count of every
    (position, channel) column (hence the activation rate and both dead rates)
    and whose sum gives the positive/negative split. Every row counts. The
    percentile sample is ``sample.draw``'s; the smallest non-zero magnitude comes
    from it (exact when it holds every non-zero value). ``seed`` is an int64
    pair, or ``None`` for one made from the batch's count and sum.

    ``thorough``: the sample holds ``min(k, nnz)`` values (``sample.draw``'s
    ``min_hits=k``), the smallest magnitude is exact and the sums are float64, at the
    price of up to three more passes: for a tensor taken alone (``tensor_stats``), not
    for a training step.
    """
    x = to_float(x)
    state, z = exact_state(x, thorough=thorough)
    if seed is None:
        seed = content_seed(state["count"], state["sum"])
    vals, keys = sample.draw(tf.reshape(z, [-1]), tf.reshape(tf.size(z, out_type=tf.int64), [1]),
                             tf.reshape(tf.reduce_sum(state["channel_nnz"]), [1]), k, seed,
                             float(k) if thorough else sample.FEW_HITS)
    state = with_sample(state, vals, keys)
    if thorough:
        inf = tf.constant(INF, z.dtype)
        state["min_abs"] = tf.cast(
            tf.reduce_min(tf.where(tf.not_equal(z, 0), tf.abs(z), inf)), F64)
    return {key: state[key] for key in STATE_MERGE}


def exact_state(x: tf.Tensor, *, thorough: bool = False
                ) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
    """``batch_state`` of a float batch less its sample (``sample_keys``, ``sample_values``,
    ``min_abs``: ``with_sample`` adds them) and with the ``sum`` of its finite values, and
    ``x`` with its non-finite values set to 0 (what the sample draws from). Apart so that
    the samples of many tensors are drawn in one call (``sample.draw``)."""
    flat = tf.reshape(x, [-1])
    n = tf.size(flat, out_type=tf.int64)
    n_f = tf.cast(n, F64)
    zero = tf.constant(0.0, F64)
    inf = tf.constant(INF, x.dtype)
    # Thorough: float64 sums (a float32 sum's rounding is about 1e-7 of the sum of |x|).
    total = tf.reduce_sum(tf.cast(flat, F64) if thorough else flat)

    def finite_case():
        return x, n_f, zero, zero

    def nonfinite_case():
        ok = tf.math.is_finite(x)
        return (tf.where(ok, x, tf.zeros_like(x)), count(ok),
                count(tf.equal(x, inf)), count(tf.equal(x, -inf)))

    # A sum is finite only when every value is (an overflow takes the slow path, still exact).
    finite_sum = tf.math.is_finite(total)
    z, nf, posinf, neginf = tf.cond(finite_sum, finite_case, nonfinite_case)
    signs, channel, spatial = _unit_counts(z)
    nnz = tf.reduce_sum(channel)
    balance = tf.round(tf.cast(tf.reduce_sum(signs), F64))
    has = nf > 0
    finite_all = tf.equal(nf, n_f)

    def extreme(fn, fill):
        return lambda: tf.cast(fn(tf.where(tf.math.is_finite(flat), flat, fill)), F64)

    vmin = tf.cond(finite_all, lambda: tf.cast(tf.reduce_min(flat), F64),
                   extreme(tf.reduce_min, inf))
    vmax = tf.cond(finite_all, lambda: tf.cast(tf.reduce_max(flat), F64),
                   extreme(tf.reduce_max, -inf))
    vmin = where(has, vmin, INF)
    vmax = where(has, vmax, -INF)
    e = scale_exponent(where(has, vmin, 0.0), where(has, vmax, 0.0))
    f = pow2(-e)
    # A sum that overflowed (or saw non-finite values) is taken again, scaled and in float64.
    s = tf.cond(finite_sum, lambda: tf.cast(total, F64),
                lambda: tf.reduce_sum(tf.cast(z, F64) * f) / f)
    # A float32 sum can round the mean out of [min, max]; the true mean is inside.
    mean = tf.clip_by_value(tf.cast(s * f, F64) / tf.maximum(nf, 1.0) / f,
                            tf.minimum(vmin, vmax), tf.maximum(vmin, vmax))
    m2 = _second_moment(z, nf, mean, e, exact_only=thorough)
    pos = (nnz + balance) / 2.0
    dims = tf.shape(x)
    return {
        "count": n_f,
        "sum": s,
        "finite_count": nf,
        "posinf_count": posinf,
        "neginf_count": neginf,
        "pos_count": pos,
        "neg_count": nnz - pos,
        "mean": where(has, mean, 0.0),
        "m2": m2,
        "min": vmin,
        "max": vmax,
        "activity_count": nf,
        "channel_nnz": channel,
        "spatial_nnz": spatial,
        "channels": tf.cast(dims[-1], F64),
        "positions": tf.cast(dims[1], F64) if x.shape.rank == 3 else zero,
    }, z


def with_sample(state: Mapping[str, tf.Tensor], vals: tf.Tensor, keys: tf.Tensor
                ) -> dict[str, tf.Tensor]:
    """``exact_state``'s states (one, or stacked ``[S]``) with the ``[S, k]`` sample
    ``sample.draw`` gave them, and the smallest non-zero magnitude it holds."""
    out = dict(state)
    if state["count"].shape.rank == 0:
        vals, keys = vals[0], keys[0]
    out["sample_keys"], out["sample_values"] = keys, vals
    out["min_abs"] = tf.reduce_min(where(tf.math.is_finite(keys), tf.abs(vals), INF), axis=-1)
    return out


def _unit_counts(x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """(sign tensor ``[B, P*C]``, per-channel and per-position non-zero counts) of a canonical
    batch. The norm of a column of signs is the square root of its non-zero count (exact
    small integers), so the counts of every column cost one sign pass and one fused norm
    kernel. A NaN makes the counts of its column NaN."""
    signs = tf.sign(_as_rows(x))
    return (signs, *_per_unit(tf.round(sum_of_squares(signs, axis=0)), x))


def _as_rows(x: tf.Tensor) -> tf.Tensor:
    return tf.reshape(x, [tf.shape(x)[0], tf.reduce_prod(tf.shape(x)[1:])])


def _per_unit(per_column: tf.Tensor, x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Per-channel and per-position sums of the ``[P*C]`` column counts of ``x``."""
    if x.shape.rank == 3:
        block = tf.reshape(per_column, tf.shape(x)[1:])
        return tf.reduce_sum(block, axis=0), tf.reduce_sum(block, axis=1)
    return per_column, tf.zeros([0], F64)


def activity_state(x: tf.Tensor) -> dict[str, tf.Tensor]:
    """The exact activity part of ``batch_state``: ``activity_count``, ``channel_nnz`` and
    ``spatial_nnz`` of one batch ``x`` (canonical ``[B, C]`` or ``[B, P, C]``).

    This is what every step pays for each rectifier output, so it is one elementwise pass
    and one read: ``x / x`` (``divide_no_nan``: 1 where ``x`` is non-zero, 0 where it is
    zero, NaN where it is NaN or infinite), its columns summed by a matrix-vector product
    with a vector of ones: 10–30 % less CPU than a sign pass and a column norm. Under
    XLA, whose matrix-vector product is the slower there, it is the sign pass and column
    norm, and an infinity counts as non-zero. A NaN column tells the caller to take
    ``batch_state`` for that batch.
    """
    x = to_float(x)
    if in_xla_context():
        _, channel, spatial = _unit_counts(x)
    else:
        rows = _as_rows(x)
        ones = tf.ones(tf.shape(rows)[:1], rows.dtype)
        unit = tf.math.divide_no_nan(rows, rows)
        per_column = tf.cast(tf.linalg.matvec(unit, ones, transpose_a=True), F64)
        channel, spatial = _per_unit(per_column, x)
    return {"activity_count": tf.cast(tf.size(x, out_type=tf.int64), F64),
            "channel_nnz": channel, "spatial_nnz": spatial}


def _second_moment(z: tf.Tensor, nf: tf.Tensor, mean: tf.Tensor, e: tf.Tensor,
                   exact_only: bool = False) -> tf.Tensor:
    """Sum of squared deviations of the finite values ``z`` (non-finite ones are 0 in ``z``),
    in units of ``4**e``.

    Fast path: ``sum(z*z) - n*mean**2`` from one pass in the tensor's own dtype.
    When the squares leave float32's range or the subtraction cancels (``|mean|
    >> std``), or with ``exact_only``, a second, scaled float64 pass gives the exact value.
    """
    f = pow2(-e)

    def exact():
        d = tf.cast(z, F64) * f - mean * f
        # The zeros that stand for non-finite values each added (0 - mean)^2.
        return tf.reduce_sum(d * d) - (tf.cast(tf.size(z), F64) - nf) * (mean * f) ** 2

    if exact_only:
        return tf.maximum(exact(), 0.0)
    sumsq = sum_of_squares(z)
    fast = (sumsq - nf * mean * mean) * f * f
    ok = (tf.math.is_finite(sumsq) & (tf.abs(e) < 40.0)
          & (tf.equal(sumsq, 0.0) | (fast * 1e3 > sumsq * f * f)))
    return tf.maximum(tf.cond(ok, lambda: fast, exact), 0.0)


# --------------------------------------------------------------------------- accumulate


@no_autograph
def empty_state(x_shape, *, sample_size: int = DEFAULT_SAMPLE_SIZE) -> dict[str, tf.Tensor]:
    """A state holding nothing, for tensors of static shape ``x_shape``.

    All entries are float64 tensors of fixed shape, so a state can live in
    ``tf.Variable``s. The batch axis may be unknown; the channel (last) axis and
    the spatial axes must be known for the dead rates to be tracked (otherwise
    those slots finalize to NaN).
    """
    k = check_sample_size(sample_size)
    shape = tf.TensorShape(x_shape)
    if shape.rank is None:
        raise ValueError("empty_state needs a tensor shape of known rank")
    canonical = shapes.canonical_shape(shape.as_list())
    z = tf.constant(0.0, F64)
    return {
        "count": z,
        "finite_count": z,
        "posinf_count": z,
        "neginf_count": z,
        "pos_count": z,
        "neg_count": z,
        "mean": z,
        "m2": z,
        "min": tf.constant(INF, F64),
        "max": tf.constant(-INF, F64),
        "min_abs": tf.constant(INF, F64),
        "activity_count": z,
        "channel_nnz": tf.zeros([canonical[-1]], F64),
        "spatial_nnz": tf.zeros([canonical[1] if len(canonical) == 3 else 0], F64),
        "channels": z,
        "positions": z,
        "sample_keys": tf.fill([k], tf.constant(INF, F64)),
        "sample_values": tf.fill([k], tf.constant(INF, F64)),
    }


def _rescale_m2(m2, e_from, e_to):
    """m2 in units of 4**e_from -> units of 4**e_to (two steps: 4**d may overflow)."""
    f = pow2(e_from - e_to)
    return m2 * f * f


def merge_pair(a: Mapping[str, tf.Tensor], b: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """Merge two states, elementwise over any leading axes (one state per tensor).

    This is the engine's one merge: one op per field for all monitored tensors, used
    for the steps of a window and for replicas. Channel and position counts of states
    stacked together must be padded to a common width (with 0). Moments merge with
    Chan's formula at the merged scale exponent.
    """
    out = {}
    for key, how in STATE_MERGE.items():
        if how == "sum":
            out[key] = a[key] + b[key]
        elif how in ("min", "max"):
            out[key] = (tf.minimum if how == "min" else tf.maximum)(a[key], b[key])
    na, nb = a["finite_count"], b["finite_count"]
    n = out["finite_count"]
    e = state_exp(out)
    mean_a, mean_b = a["mean"] * pow2(-e), b["mean"] * pow2(-e)
    mean_s = (na * mean_a + nb * mean_b) / tf.maximum(n, 1.0)
    da = where(na > 0, mean_a - mean_s, 0.0)
    db = where(nb > 0, mean_b - mean_s, 0.0)
    m2 = (_rescale_m2(a["m2"], state_exp(a), e) + na * da * da
          + _rescale_m2(b["m2"], state_exp(b), e) + nb * db * db)
    out["mean"] = mean_s * pow2(e)
    out["m2"] = m2
    out["sample_keys"], out["sample_values"] = tf.cond(
        tf.reduce_all(tf.equal(a["sample_keys"], INF)),
        lambda: (b["sample_keys"], b["sample_values"]),  # a window's first: nothing to merge
        lambda: _bottom_k(a, b))
    return out


def _bottom_k(a: Mapping[str, tf.Tensor], b: Mapping[str, tf.Tensor]
              ) -> tuple[tf.Tensor, tf.Tensor]:
    """The sample keys and values of the ``k`` smallest keys of both samples, in no order
    (nothing reads a sample's order; an unsorted selection takes about half the time)."""
    keys = tf.concat([a["sample_keys"], b["sample_keys"]], axis=-1)
    vals = tf.concat([a["sample_values"], b["sample_values"]], axis=-1)
    neg, idx = tf.math.top_k(-keys, k=a["sample_keys"].shape[-1], sorted=False)
    return -neg, tf.gather(vals, idx, batch_dims=keys.shape.rank - 1)


@no_autograph
def merge_stacked(stacked: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """Merge states stacked along a new leading axis of static size (e.g. from ``all_gather``).

    Each entry may have more leading axes after that one (one state per tensor)."""
    check_state(stacked)
    r = stacked["count"].shape[0]
    if r is None:
        raise ValueError("merge_stacked needs a static number of stacked states")
    out = {key: stacked[key][0] for key in STATE_MERGE}
    for i in range(1, r):
        out = merge_pair(out, {key: stacked[key][i] for key in STATE_MERGE})
    return out
