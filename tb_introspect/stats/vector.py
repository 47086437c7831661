"""The packed statistics vector of a state: the one place each slot's formula lives."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import tensorflow as tf

from tb_introspect import slots
from tb_introspect.stats import shapes
from tb_introspect.stats.numeric import (
    DEFAULT_SAMPLE_SIZE,
    F64,
    INF,
    NAN,
    check_quantiles,
    check_sample_size,
    describe,
    no_autograph,
    pow2,
    seed_pair,
    to_float,
    where,
)
from tb_introspect.stats.quantiles import sample_quantiles
from tb_introspect.stats.state import batch_state, check_state, state_exp


def _units_dead(nnz: tf.Tensor, units: tf.Tensor, count: tf.Tensor) -> tf.Tensor:
    """Share of the ``units`` real units (channels or positions; ``nnz`` may be zero-padded
    past them) whose non-zero count is 0; NaN when the tensor is empty or no unit is
    tracked."""
    active = tf.reduce_sum(tf.cast(nnz > 0, F64), axis=-1)
    return where((count > 0) & (units > 0), (units - active) / tf.maximum(units, 1.0), NAN)


@no_autograph
def finalize(
    state: Mapping[str, tf.Tensor],
    view: str | None,
    *,
    quantiles: Sequence[float] = slots.DEFAULT_QUANTILES,
) -> tf.Tensor:
    """The packed statistics vector of a state, laid out as ``slots.tensor_stats_fields``
    (``view`` None: without the view's extra slots, the part every view shares).

    States stacked on leading axes (one per tensor: scalars ``[n]``, counts and samples
    ``[n, width]``) give the vectors stacked the same way, ``[n, fields]``: every formula
    is elementwise over the leading axes. The ``epoch`` slot and the view's extra slots are
    NaN (callers fill them). A logged point finalizes on the host instead
    (``finalize_rows``, the numpy twin's same slots).
    """
    if view is not None:
        slots.tensor_stats_fields(view, quantiles)  # validates the view
    q = check_quantiles(quantiles)
    check_state(state)
    with tf.name_scope("finalize_stats"):
        count = state["count"]
        nf = state["finite_count"]
        posinf, neginf = state["posinf_count"], state["neginf_count"]
        n_neg, n_pos = state["neg_count"], state["pos_count"]
        has = nf > 0
        denom = tf.maximum(nf, 1.0)
        vmin = where(has, state["min"], NAN)
        vmax = where(has, state["max"], NAN)

        def rate(v):
            return where(has, v, NAN)

        e = state_exp(state)
        scale = pow2(e)
        mean_s = state["mean"] * pow2(-e)
        m2_s = state["m2"]
        sumsq_s = m2_s + nf * mean_s * mean_s
        # The non-zero counts are over activity_count elements: the collector's exact
        # rectifier counts cover more steps than the rest of the state.
        tracked = state["channels"] > 0
        active = where(tracked, tf.reduce_sum(state["channel_nnz"], axis=-1), n_pos + n_neg)
        over = where(tracked, state["activity_count"], nf)
        activation = where(over > 0, active / tf.maximum(over, 1.0), NAN)
        sample = where(tf.math.is_finite(state["sample_keys"]), state["sample_values"], INF)
        vq, lq = sample_quantiles(sample, dict(state, min=vmin, max=vmax), q)
        nan = tf.fill(tf.shape(count), tf.constant(NAN, F64))
        base = tf.stack([
            nan,  # epoch: filled by the caller
            count,
            nf,
            tf.maximum(count - nf - posinf - neginf, 0.0),
            posinf,
            neginf,
            1.0 - activation,
            # Over the non-zero values, as the article reads it: a ReLU output is +100%.
            where(n_pos + n_neg > 0, (n_pos - n_neg) / tf.maximum(n_pos + n_neg, 1.0), NAN),
            rate(state["mean"]),
            rate(tf.sqrt(m2_s / denom) * scale),
            rate(tf.sqrt(sumsq_s / denom) * scale),
            rate(tf.sqrt(sumsq_s) * scale),
            vmin,
            vmax,
            activation,
            _units_dead(state["channel_nnz"], state["channels"], count),
            _units_dead(state["spatial_nnz"], state["positions"], count),
        ], axis=-1)
        shared = tf.concat([base, vq, lq], axis=-1)
        return shared if view is None else with_extra_slots(shared, view, q)


def with_extra_slots(shared: tf.Tensor, view: str, quantiles: Sequence[float]) -> tf.Tensor:
    """``shared`` (``finalize(state, None)``: the slots every view shares, on the last axis)
    with ``view``'s extra slots appended, NaN (a logged point fills them on the host)."""
    extra = len(slots.view_extra_fields(view, quantiles))
    if not extra:
        return shared
    nan = tf.fill(tf.concat([tf.shape(shared)[:-1], [extra]], 0), tf.constant(NAN, F64))
    return tf.concat([shared, nan], axis=-1)


@no_autograph
def tensor_stats(
    x,
    view: str,
    *,
    quantiles: Sequence[float] = slots.DEFAULT_QUANTILES,
    sample_size: int = DEFAULT_SAMPLE_SIZE,
    seed=None,
    name: str | None = None,
) -> tf.Tensor:
    """Statistics of ``x`` as a float64 vector laid out as ``slots.tensor_stats_fields``:
    the state of ``x`` as one batch, finalized.

    The ``epoch`` slot and the view's extra slots are NaN (callers fill them).
    ``seed`` (int or shape-[2] int tensor) makes the percentile sample
    deterministic; ``name`` names the tensor in error messages. Raises
    ``TypeError`` for string/complex tensors and ``ValueError`` for unknown rank.

    >>> v = tensor_stats(tf.range(10.0), "variable")
    >>> float(v[slots.tensor_stats_fields("variable").index("max")])
    9.0
    """
    slots.tensor_stats_fields(view, quantiles)
    k = check_sample_size(sample_size)
    x = to_float(x, name)
    if x.shape.rank is None:
        raise ValueError(f"tensor {describe(x, name)!r} must have a known rank")
    n_static = x.shape.num_elements()
    if n_static is not None:
        k = max(1, min(k, n_static))  # no empty slots to sort for small tensors
    with tf.name_scope("tensor_stats"):
        canonical = shapes.canonical_shape(x.shape.as_list())
        state = batch_state(shapes.as_canonical(x, canonical), k,
                            None if seed is None else seed_pair(seed), thorough=True)
        if canonical[-1] == 0:  # unknown channel count: the rows' widths are not units
            state["channels"] = tf.constant(0.0, F64)
        return finalize(state, view, quantiles=quantiles)
