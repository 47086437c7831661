"""The view slots computed from two points: ``update_ratio``, ``implicit_lr`` and
``cos_prev``, of whole arrays or of sums (sharded tensors)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tb_introspect import slots
from tb_introspect.stats_np.quantiles import Sorted
from tb_introspect.stats_np.state import flat64

#: Elements per variable the implicit-learning-rate percentiles come from: exact in smaller
#: variables, uniform draws in larger ones (rank error about 1.1 percentile points).
ILR_SAMPLE = 2048


# ------------------------------------------------------------- slots from two points


def _segment_sums(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The sum of each segment of ``values`` beginning at ``starts`` (0 for an empty one)."""
    out = np.zeros(starts.size)
    ends = np.append(starts[1:], values.size)
    some = ends > starts
    if some.any():
        out[some] = np.add.reduceat(values, starts[some])
    return out


def update_ratio_of_sums(ww: np.ndarray, dd: np.ndarray) -> np.ndarray:
    """``update_ratio`` from the sums of w² (``ww``) and of dw² (``dd``): what a variable
    split over processes merges (NaN or inf when ``w`` is all zero)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return np.sqrt(dd) / np.sqrt(ww)


def cosine_of_sums(ab: np.ndarray, aa: np.ndarray, bb: np.ndarray) -> np.ndarray:
    """``cos_prev`` from the sums of a·b, a² and b² (NaN when either is zero)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return ab / np.sqrt(aa * bb)


def _vector64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).reshape(-1)


def update_ratios(ws: Sequence[np.ndarray], dws: Sequence[np.ndarray]) -> np.ndarray:
    """``update_ratio`` of each variable: ‖dw‖ / ‖w‖, the change ``dw`` since the previous
    point relative to the weights ``w`` (NaN or inf when ``w`` is all zero)."""
    # One float64 copy and one dot product per array: concatenating a model's variables
    # first cost twice the memory traffic (a point's largest host cost on MobileNetV2).
    ww, dd = np.zeros(len(ws)), np.zeros(len(ws))
    for i, (w, dw) in enumerate(zip(ws, dws, strict=True)):
        w, dw = _vector64(w), _vector64(dw)
        ww[i], dd[i] = np.dot(w, w), np.dot(dw, dw)
    return update_ratio_of_sums(ww, dd)


def cos_prevs(gs: Sequence[np.ndarray], prevs: Sequence[np.ndarray]) -> np.ndarray:
    """``cos_prev`` of each gradient aggregate: the cosine with the previous point's (NaN
    when either is zero)."""
    ab, aa, bb = np.zeros(len(gs)), np.zeros(len(gs)), np.zeros(len(gs))
    for i, (g, prev) in enumerate(zip(gs, prevs, strict=True)):
        a, b = _vector64(g), _vector64(prev)
        ab[i], aa[i], bb[i] = np.dot(a, b), np.dot(a, a), np.dot(b, b)
    return cosine_of_sums(ab, aa, bb)


def implicit_lrs(dws: Sequence[np.ndarray], gsums: Sequence[np.ndarray],
                 quantiles: Sequence[float] = slots.DEFAULT_QUANTILES,
                 steps_per_sample: float = 1.0, seed: int = 0) -> np.ndarray:
    """``[variables, Q]``, the ``ilr_q<p>`` slots: percentiles of |dw| / |G| over the
    elements whose gradient sum ``G`` (``gsum`` times ``steps_per_sample`` with
    ``every=N``) is not zero, over every element of up to ``ILR_SAMPLE`` and ``ILR_SAMPLE``
    uniform draws of larger variables (variable ``i``'s from the generator
    ``[seed, i]``); NaN when no gradient sum is non-zero."""
    ds, gs = [], []
    for i, (dw, gsum) in enumerate(zip(dws, gsums, strict=True)):
        d, g = np.reshape(dw, -1), np.reshape(gsum, -1)
        if d.size > ILR_SAMPLE:  # drawn first: the rest of a large variable is never read
            pick = np.random.default_rng([seed, i]).integers(0, d.size, ILR_SAMPLE)
            d, g = d[pick], g[pick]
        ds.append(d)
        gs.append(g)
    d, starts = flat64(ds)
    g, _ = flat64(gs)
    rate, kept = _rates(d, g, steps_per_sample)
    rows = np.split(rate[kept], np.cumsum(_segment_sums(kept, starts)).astype(np.int64)[:-1])
    return ilr_quantiles(rows, quantiles)


def _rates(d: np.ndarray, g: np.ndarray, steps_per_sample: float
           ) -> tuple[np.ndarray, np.ndarray]:
    """|d| / |g * steps| and where it counts (the gradient sum non-zero, the rate finite)."""
    d, g = np.abs(d), np.abs(g) * steps_per_sample
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = d / g
    return rate, (g > 0) & np.isfinite(rate)


def ilr_shard_sample(dw: np.ndarray, gsum: np.ndarray, steps_per_sample: float,
                     seed: Sequence[int], k: int = ILR_SAMPLE) -> np.ndarray:
    """The implicit learning rates of one shard of a variable as a fixed-length vector of
    ``k`` keys (``inf`` where none) then ``k`` rates: a bottom-``k`` uniform sample (every
    rate while they fit), which ``ilr_merge`` merges over shards into a uniform sample of
    the whole variable's rates (exact when it has at most ``k`` elements)."""
    rate, kept = _rates(np.reshape(dw, -1).astype(np.float64),
                        np.reshape(gsum, -1).astype(np.float64), steps_per_sample)
    rate = rate[kept]
    keys = np.random.default_rng(list(seed)).random(rate.size)
    if rate.size > k:
        pick = np.argpartition(keys, k - 1)[:k]
        keys, rate = keys[pick], rate[pick]
    out = np.full(2 * k, np.inf)
    out[:keys.size] = keys
    out[k:k + rate.size] = rate
    return out


def ilr_merge(samples: Sequence[np.ndarray], k: int,
              quantiles: Sequence[float] = slots.DEFAULT_QUANTILES) -> np.ndarray:
    """``[Q]``: the ``ilr_q<p>`` slots of one variable from its shards' ``ilr_shard_sample``
    vectors (the ``k`` smallest keys of their union)."""
    keys = np.concatenate([s[:k] for s in samples])
    rates = np.concatenate([s[k:2 * k] for s in samples])
    taken = np.isfinite(keys)
    keys, rates = keys[taken], rates[taken]
    if keys.size > k:
        rates = rates[np.argpartition(keys, k - 1)[:k]]
    return ilr_quantiles([rates], quantiles)[0]


def ilr_quantiles(rows: Sequence[np.ndarray],
                  quantiles: Sequence[float] = slots.DEFAULT_QUANTILES) -> np.ndarray:
    """``[len(rows), Q]``: the percentiles of each row of implicit learning rates (NaN for
    an empty row)."""
    p = np.asarray(quantiles, dtype=np.float64) / 100.0
    m = np.array([r.size for r in rows], dtype=np.float64)[:, None]
    out = Sorted(rows).select(np.maximum(p * (m - 1), 0))
    out[m[:, 0] == 0] = np.nan
    return out
