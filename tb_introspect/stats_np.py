"""Numpy twin of ``tb_introspect.stats.tensor_stats`` (no TensorFlow).

Same vector layout and definitions (``docs/statistics.md``): percentiles are
exact when the tensor has at most ``sample_size`` finite non-zero values (or
``sample_size=None``), otherwise they come from a uniform sample of that many
finite non-zero values combined with the exact sign/zero counts.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tb_introspect import metadata

DEFAULT_SAMPLE_SIZE = 2**18
_MAX_EXP = 1000.0


def _to_float(x, name: str | None) -> np.ndarray:
    label = name or "<array>"
    try:
        a = np.asarray(x)
    except Exception as e:  # noqa: BLE001 - anything numpy cannot take
        raise TypeError(f"cannot compute statistics of {label!r}: {e}") from e
    kind = a.dtype.kind
    if kind not in "fiub" or a.dtype == object:
        # ml_dtypes' bfloat16 has kind 'V'; it converts to float32 exactly.
        if a.dtype.name == "bfloat16":
            return a.astype(np.float32)
        raise TypeError(
            f"cannot compute statistics of tensor {label!r} with dtype {a.dtype}:"
            " expected a float, integer or bool array"
        )
    if a.dtype == np.float64 or (kind in "iu" and a.dtype.itemsize >= 4):
        return a.astype(np.float64, copy=False)
    return a.astype(np.float32, copy=False)


def _scale_exponent(vmin: float, vmax: float) -> float:
    m = max(abs(vmin), abs(vmax))
    if not (np.isfinite(m) and m > 0):
        return 0.0
    return float(np.clip(np.floor(np.log2(m)), -_MAX_EXP, _MAX_EXP))


def _dead_rates(active: np.ndarray) -> tuple[float, float]:
    if active.size == 0:
        return np.nan, np.nan
    rank = active.ndim
    if rank <= 1:
        channel = active.reshape(-1)
    else:
        channel = active.any(axis=tuple(range(rank - 1)))
    dead = 1.0 - channel.mean() if channel.size else np.nan
    if rank >= 3:
        spatial = active.any(axis=(0, rank - 1))
        sdead = 1.0 - spatial.mean() if spatial.size else np.nan
    else:
        sdead = np.nan
    return float(dead), float(sdead)


def _order_value(sorted_vals: np.ndarray, s: np.ndarray) -> np.ndarray:
    lo = np.floor(s)
    hi = np.ceil(s)
    a = sorted_vals[lo.astype(np.int64)]
    b = sorted_vals[hi.astype(np.int64)]
    return np.where(hi > lo, a + (b - a) * (s - lo), a)


def sample_quantiles(
    sample: np.ndarray,
    *,
    n_neg: float,
    n_zero: float,
    n_pos: float,
    vmin: float,
    vmax: float,
    min_abs: float,
    quantiles: Sequence[float],
) -> tuple[np.ndarray, np.ndarray]:
    """Value and log10|x| percentiles from a sample of the finite non-zero values.

    Mirrors ``stats.quantiles.sample_quantiles``: each population order statistic is
    mapped into the sample within its sign stratum; exact when ``sample`` holds
    every finite non-zero value.
    """
    p = np.asarray(quantiles, dtype=np.float64) / 100.0
    n_fin = n_neg + n_zero + n_pos
    if n_fin == 0:
        nan = np.full(p.shape, np.nan)
        return nan, nan.copy()
    srt = np.sort(np.asarray(sample, dtype=np.float64))
    m = srt.size
    m_neg = int(np.searchsorted(srt, 0.0, side="left"))
    m_pos = m - m_neg

    def stratum(j, n_pop, m_samp, offset, fallback):
        if m_samp == 0:
            return np.full(j.shape, fallback)
        s = j if n_pop == m_samp else j * (m_samp - 1.0) / max(n_pop - 1.0, 1.0)
        s = np.clip(s, 0, m_samp - 1)
        return _order_value(srt, offset + s)

    def value_at_rank(i):
        neg_v = stratum(np.minimum(i, max(n_neg - 1, 0)), n_neg, m_neg, 0, vmin)
        pos_j = np.maximum(i - n_neg - n_zero, 0)
        pos_v = stratum(pos_j, n_pos, m_pos, m_neg, vmax)
        return np.where(i < n_neg, neg_v, np.where(i < n_neg + n_zero, 0.0, pos_v))

    r = p * (n_fin - 1)
    lo = np.floor(r)
    hi = np.minimum(lo + 1, n_fin - 1)
    a, b = value_at_rank(lo), value_at_rank(hi)
    vq = np.where(hi > lo, a + (b - a) * (r - lo), a)
    vq = np.where(p == 0, vmin, np.where(p == 1, vmax, vq))
    vq = np.clip(vq, vmin, vmax)

    if m == 0:
        return vq, np.full(p.shape, np.nan)
    mags = np.sort(np.abs(srt))
    rm = p * (m - 1)
    lo = np.floor(rm).astype(np.int64)
    hi = np.ceil(rm).astype(np.int64)
    la, lb = np.log10(mags[lo]), np.log10(mags[hi])
    lq = np.where(hi > lo, la + (lb - la) * (rm - lo), la)
    max_abs = max(abs(vmin), abs(vmax))
    lq = np.where(p == 0, np.log10(min_abs), np.where(p == 1, np.log10(max_abs), lq))
    return vq, lq


def tensor_stats(
    x,
    view: str,
    *,
    quantiles: Sequence[float] = metadata.DEFAULT_QUANTILES,
    sample_size: int | None = DEFAULT_SAMPLE_SIZE,
    seed: int | np.random.Generator | None = None,
    name: str | None = None,
) -> np.ndarray:
    """Statistics of array ``x`` as a float64 vector laid out as ``metadata.tensor_stats_fields``.

    ``sample_size=None`` takes exact percentiles (sorts every finite non-zero
    value). The ``epoch`` slot and the view's extra slots are NaN.
    """
    fields = metadata.tensor_stats_fields(view, quantiles)
    q = np.asarray(quantiles, dtype=np.float64).reshape(-1)
    if q.size == 0 or not np.all((q >= 0) & (q <= 100)):
        raise ValueError(f"quantiles must be percentile points in [0, 100], got {quantiles!r}")
    if sample_size is not None and int(sample_size) < 1:
        raise ValueError(f"sample_size must be a positive integer or None, got {sample_size!r}")
    a = _to_float(x, name)
    flat = a.reshape(-1)
    n = flat.size
    finite = np.isfinite(flat)
    xf = np.where(finite, flat, 0)
    pos = xf > 0
    neg = xf < 0
    active = pos | neg
    nf = int(finite.sum())
    n_pos, n_neg = int(pos.sum()), int(neg.sum())
    n_zero = nf - n_pos - n_neg
    posinf = int(np.count_nonzero(flat == np.inf))
    neginf = int(np.count_nonzero(flat == -np.inf))
    out = dict.fromkeys(fields, np.nan)
    out.update(
        count=n,
        finite_count=nf,
        nan_count=n - nf - posinf - neginf,
        posinf_count=posinf,
        neginf_count=neginf,
    )
    out["dead_rate"], out["spatial_dead_rate"] = _dead_rates(active.reshape(a.shape))
    if nf:
        vmin = float(np.min(flat, where=finite, initial=np.inf))
        vmax = float(np.max(flat, where=finite, initial=-np.inf))
        e = _scale_exponent(vmin, vmax)
        xs = xf.astype(np.float64) * 2.0**-e
        mean_s = xs.sum() / nf
        dev = np.where(finite, xs - mean_s, 0.0)
        m2_s = float(np.dot(dev, dev))
        sumsq_s = m2_s + nf * mean_s * mean_s
        scale = 2.0**e
        with np.errstate(over="ignore"):  # a true L2 above the float64 range is inf
            l2 = np.sqrt(sumsq_s) * scale
        out.update(
            zero_fraction=n_zero / nf,
            sign_balance=(n_pos - n_neg) / (n_pos + n_neg) if n_pos + n_neg else np.nan,
            mean=mean_s * scale,
            std=np.sqrt(m2_s / nf) * scale,
            rms=np.sqrt(sumsq_s / nf) * scale,
            l2=l2,
            min=vmin,
            max=vmax,
            activation_rate=(n_pos + n_neg) / nf,
        )
        nonzero = flat[active]
        if sample_size is not None and nonzero.size > int(sample_size):
            if seed is None:  # deterministic in the data, like the TF path
                seed = [int(np.array([v], np.float64).view(np.uint64)[0]) for v in (mean_s, m2_s)]
            rng = np.random.default_rng(seed)
            nonzero = nonzero[rng.integers(0, nonzero.size, int(sample_size))]
        min_abs = float(np.abs(flat[active]).min()) if n_pos + n_neg else np.nan
        vq, lq = sample_quantiles(
            nonzero, n_neg=n_neg, n_zero=n_zero, n_pos=n_pos,
            vmin=vmin, vmax=vmax, min_abs=min_abs, quantiles=q,
        )
        for qi, vv, lv in zip(q, vq, lq, strict=True):
            out[metadata.quantile_field(qi)] = vv
            out[metadata.quantile_field(qi, log=True)] = lv
    return np.array([out[f] for f in fields], dtype=np.float64)
