"""Numpy twin of the TensorFlow statistics engine ``tb_introspect.stats`` (no TensorFlow).

The same algebra of states: ``tensor_state`` (one array), ``merge_states`` and
``finalize`` (the packed vector, ``metadata.tensor_stats_fields``; the one numpy place
each slot's formula lives), so ``tensor_stats(x)`` is ``finalize(tensor_state(x))``.
PyTorch's device segments (``torch/state.py``) become these states on the host, and the
numpy writer finalizes them too. The view slots computed from two points live here as well:
``update_ratio``, ``implicit_lr`` and ``cos_prev``.

Definitions as in ``docs/statistics.md``: percentiles are exact when the tensor has at most
``sample_size`` finite non-zero values (or ``sample_size=None``), otherwise they come from a
uniform sample of that many finite non-zero values combined with the exact sign/zero counts.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from tb_introspect import metadata

DEFAULT_SAMPLE_SIZE = 2**18
#: Elements per variable the implicit-learning-rate percentiles come from: exact in smaller
#: variables, uniform draws in larger ones (rank error about 1.1 percentile points).
ILR_SAMPLE = 2048
_MAX_EXP = 1000.0

#: How each key of a state merges: ``stats.STATE_MERGE``'s keys and rules, plus
#: ``sample_size``, the sample's bound (``inf``: unbounded), which the TensorFlow states
#: carry as their static slot count while numpy samples are not padded. ``sample_keys`` /
#: ``sample_values`` hold only taken entries (the values in their array's float type); a
#: value that is zero or not finite is a placeholder (a sampled element that is not a finite
#: non-zero value, as PyTorch's segments draw every element): it keeps its key, so bottom-k
#: merges stay uniform, and ``finalize`` skips it.
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
    "activity_count": "sum",
    "channel_nnz": "sum",
    "spatial_nnz": "sum",
    "channels": "max",
    "positions": "max",
    "sample_size": "min",
    "sample_keys": "bottom_k",
    "sample_values": "bottom_k",
}

State = dict[str, np.ndarray]


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


def _check_quantiles(quantiles: Sequence[float]) -> np.ndarray:
    """The quantiles as a read-only float64 vector (cached per tuple: every finalize of a
    logged point asks for the same few)."""
    try:
        return _checked_quantiles(tuple(quantiles))
    except TypeError:  # unhashable items: checked without the cache
        return _checked_quantiles.__wrapped__(quantiles)


@functools.lru_cache(maxsize=16)
def _checked_quantiles(quantiles: Sequence[float]) -> np.ndarray:
    q = np.asarray(quantiles, dtype=np.float64).reshape(-1)
    if q.size == 0 or not np.all((q >= 0) & (q <= 100)):
        raise ValueError(f"quantiles must be percentile points in [0, 100], got {quantiles!r}")
    q.flags.writeable = False
    return q


def _check_sample_size(sample_size: int | None) -> float:
    if sample_size is None:
        return np.inf
    if int(sample_size) < 1:
        raise ValueError(f"sample_size must be a positive integer or None, got {sample_size!r}")
    return float(int(sample_size))


def scale_exponent(vmin: float, vmax: float) -> float:
    """Binary exponent of max(|vmin|, |vmax|), 0 when that is not a positive finite number:
    moments are kept of x * 2**-e so that squares of values near the float64 limits stay
    finite (clipped so that 2**-e itself is a normal float64)."""
    m = max(abs(vmin), abs(vmax))
    if not (np.isfinite(m) and m > 0):
        return 0.0
    return min(max(float(np.floor(np.log2(m))), -_MAX_EXP), _MAX_EXP)


def state_exp(st: Mapping[str, np.ndarray]) -> float:
    """The scale exponent the state's ``m2`` is stored in."""
    if st["finite_count"] <= 0:
        return 0.0
    return scale_exponent(float(st["min"]), float(st["max"]))


def _units(shape: Sequence[int]) -> tuple[tuple[int, int, int], int, int]:
    """(rows, positions, channels) of the canonical view of ``shape`` (``stats.shapes``' rule:
    a scalar is one channel, a vector's elements are channels, axes 1 … rank-2 are
    positions), and the numbers of tracked channels and positions."""
    shape = [int(d) for d in shape]
    if len(shape) == 0:
        return (1, 1, 1), 1, 0
    if len(shape) == 1:
        return (1, 1, shape[0]), shape[0], 0
    positions = int(np.prod(shape[1:-1], dtype=np.int64))
    blocks = (shape[0], positions, shape[-1])
    return blocks, shape[-1], positions if len(shape) >= 3 else 0


def empty_state(shape: Sequence[int] = (), *,
                sample_size: int | None = DEFAULT_SAMPLE_SIZE) -> State:
    """A state holding nothing, for arrays of ``shape`` (the batch axis is not used): the
    identity of ``merge_states``."""
    _, channels, positions = _units(shape)
    zero = np.float64(0.0)
    return {
        "count": zero, "finite_count": zero, "posinf_count": zero, "neginf_count": zero,
        "pos_count": zero, "neg_count": zero, "mean": zero, "m2": zero,
        "min": np.float64(np.inf), "max": np.float64(-np.inf), "min_abs": np.float64(np.inf),
        "activity_count": zero,
        "channel_nnz": np.zeros(channels), "spatial_nnz": np.zeros(positions),
        "channels": np.float64(channels), "positions": np.float64(positions),
        "sample_size": np.float64(_check_sample_size(sample_size)),
        "sample_keys": np.zeros(0), "sample_values": np.zeros(0),
    }


def _content_seed(mean_s: float, m2_s: float) -> list[int]:
    """A seed from the bits of the scaled moments: without a user seed the sample is a
    deterministic function of the data (equal tensors give equal statistics)."""
    return [int(np.array([v], np.float64).view(np.uint64)[0]) for v in (mean_s, m2_s)]


def _sample(nonzero: np.ndarray, k: float, rng: np.random.Generator
            ) -> tuple[np.ndarray, np.ndarray]:
    """(keys, values): every value with its own uniform key when they fit in ``k``, otherwise
    ``k`` uniform draws carrying the ``k`` smallest of ``nonzero.size`` uniform keys
    (exponential spacings over a gamma-distributed rest), so that a bottom-k merge keeps
    every state in proportion to its non-zero count."""
    m = nonzero.size
    # The values keep the array's float type: converted once they are picked, they sort
    # in the same order (float32 -> float64 is exact), in half the time.
    if m <= k:
        return rng.random(m), nonzero
    k = int(k)
    values = nonzero[rng.integers(0, m, k)]
    spacings = np.cumsum(rng.exponential(size=k))
    keys = spacings / (spacings[-1] + rng.gamma(m - k + 1.0))
    return keys, values


def tensor_state(
    x,
    *,
    sample_size: int | None = DEFAULT_SAMPLE_SIZE,
    seed: int | np.random.Generator | None = None,
    name: str | None = None,
) -> State:
    """The state of array ``x`` taken whole (``stats.batch_state`` of one batch, thorough):
    float64 two-pass moments, exact counts, extremes and smallest non-zero magnitude, and a
    sample of at most ``sample_size`` (``None``: every) finite non-zero values."""
    k = _check_sample_size(sample_size)
    a = _to_float(x, name)
    flat = a.reshape(-1)
    n = flat.size
    finite = np.isfinite(flat)
    nf = int(np.count_nonzero(finite))
    # Weights and most gradients are all finite: the masking passes are then identities
    # (same values, bit for bit), and a logged point takes this for every one of them.
    all_finite = nf == n
    xf = flat if all_finite else np.where(finite, flat, 0)
    pos = xf > 0
    neg = xf < 0
    active = pos | neg
    n_pos, n_neg = int(np.count_nonzero(pos)), int(np.count_nonzero(neg))
    st = empty_state(a.shape, sample_size=sample_size)
    blocks, channels, positions = _units(a.shape)
    per_unit = active.reshape(blocks)
    if channels:
        st["channel_nnz"] = np.count_nonzero(per_unit, axis=(0, 1)).astype(np.float64)
    if positions:
        st["spatial_nnz"] = np.count_nonzero(per_unit, axis=(0, 2)).astype(np.float64)
    st.update(
        count=np.float64(n), finite_count=np.float64(nf),
        posinf_count=np.float64(0 if all_finite else np.count_nonzero(flat == np.inf)),
        neginf_count=np.float64(0 if all_finite else np.count_nonzero(flat == -np.inf)),
        pos_count=np.float64(n_pos), neg_count=np.float64(n_neg),
        activity_count=np.float64(nf),
    )
    if not nf:
        return st
    if all_finite:
        vmin, vmax = float(flat.min()), float(flat.max())
    else:
        vmin = float(np.min(flat, where=finite, initial=np.inf))
        vmax = float(np.max(flat, where=finite, initial=-np.inf))
    e = scale_exponent(vmin, vmax)
    xs = xf.astype(np.float64)
    xs *= 2.0**-e
    mean_s = xs.sum() / nf
    xs -= mean_s  # the deviations, in place
    dev = xs if all_finite else np.where(finite, xs, 0.0)
    m2_s = float(np.dot(dev, dev))
    nonzero = flat[active]
    if seed is None:
        seed = _content_seed(mean_s, m2_s)
    keys, values = _sample(nonzero, k, np.random.default_rng(seed))
    st.update(
        mean=np.float64(mean_s * 2.0**e), m2=np.float64(m2_s), min=np.float64(vmin),
        max=np.float64(vmax),
        min_abs=np.float64(np.abs(nonzero).min() if nonzero.size else np.inf),
        sample_keys=keys, sample_values=values,
    )
    return st


def merge_states(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> State:
    """Merge two states (associative and commutative: steps, calls, ranks).

    Counts add, extremes take the extreme, moments merge with Chan's formula at the
    merged scale exponent (two-pass within each state, so ``std`` does not cancel), and the
    sample keeps the ``sample_size`` smallest keys of the union. Per-unit counts must have
    the same widths."""
    out: State = {}
    for key, how in STATE_MERGE.items():
        if how == "sum":
            if np.shape(a[key]) != np.shape(b[key]):
                raise ValueError(f"cannot merge states with {key} of shapes"
                                 f" {np.shape(a[key])} and {np.shape(b[key])}")
            out[key] = a[key] + b[key]
        elif how in ("min", "max"):
            out[key] = (np.minimum if how == "min" else np.maximum)(a[key], b[key])
    na, nb = a["finite_count"], b["finite_count"]
    n = out["finite_count"]
    e = state_exp(out)
    f = 2.0**-e
    mean_a, mean_b = a["mean"] * f, b["mean"] * f
    delta = mean_b - mean_a
    # The one-sided forms keep a merge with an empty state exact.
    mean_s = mean_a + delta * (nb / n) if n else 0.0
    with np.errstate(over="ignore"):  # an m2 already infinite stays so
        m2 = (_rescale_m2(a["m2"], state_exp(a), e) + _rescale_m2(b["m2"], state_exp(b), e)
              + (delta * delta * (na * nb / n) if n else 0.0))
    out["mean"] = np.float64(mean_s * 2.0**e)
    out["m2"] = np.float64(m2)
    keys = np.concatenate([a["sample_keys"], b["sample_keys"]])
    values = np.concatenate([a["sample_values"], b["sample_values"]])
    keep = np.argsort(keys, kind="stable")
    if keys.size > out["sample_size"]:
        keep = keep[:int(out["sample_size"])]
    out["sample_keys"], out["sample_values"] = keys[keep], values[keep]
    return out


def _rescale_m2(m2: float, e_from: float, e_to: float) -> float:
    """m2 in units of 4**e_from -> units of 4**e_to (two steps: 4**d may overflow)."""
    f = 2.0 ** (e_from - e_to)
    return m2 * f * f


def _units_dead(nnz: np.ndarray, units: float, count: float) -> float:
    """Share of the ``units`` units whose non-zero count is 0; NaN when the tensor is empty
    or no unit is tracked."""
    if not (count > 0 and units > 0):
        return np.nan
    return float((units - np.count_nonzero(nnz)) / units)


def finalize(
    st: Mapping[str, np.ndarray],
    view: str,
    *,
    quantiles: Sequence[float] = metadata.DEFAULT_QUANTILES,
) -> np.ndarray:
    """The packed float64 vector of a state, laid out as ``metadata.tensor_stats_fields``
    (``stats.finalize``'s slots). The ``epoch`` slot and the view's extra slots are NaN."""
    fields = metadata.tensor_stats_fields(view, quantiles)
    q = _check_quantiles(quantiles)
    n, nf = float(st["count"]), float(st["finite_count"])
    posinf, neginf = float(st["posinf_count"]), float(st["neginf_count"])
    n_pos, n_neg = float(st["pos_count"]), float(st["neg_count"])
    out = dict.fromkeys(fields, np.nan)
    out.update(count=n, finite_count=nf, nan_count=max(n - nf - posinf - neginf, 0.0),
               posinf_count=posinf, neginf_count=neginf,
               dead_rate=_units_dead(st["channel_nnz"], float(st["channels"]), n),
               spatial_dead_rate=_units_dead(st["spatial_nnz"], float(st["positions"]), n))
    # The per-unit counts are over activity_count elements, which may cover more steps
    # than the rest of the state (PyTorch's rectifier outputs).
    if st["channels"] > 0:
        active, over = float(np.sum(st["channel_nnz"])), float(st["activity_count"])
    else:
        active, over = n_pos + n_neg, nf
    if over > 0:
        out["activation_rate"], out["zero_fraction"] = active / over, (over - active) / over
    if not nf:
        return np.array([out[f] for f in fields], dtype=np.float64)
    vmin, vmax = float(st["min"]), float(st["max"])
    e = scale_exponent(vmin, vmax)
    scale = 2.0**e
    mean_s = float(st["mean"]) * 2.0**-e
    m2_s = float(st["m2"])
    sumsq_s = m2_s + nf * mean_s * mean_s
    with np.errstate(over="ignore"):  # a true L2 above the float64 range is inf
        l2 = np.sqrt(sumsq_s) * scale
    out.update(
        sign_balance=(n_pos - n_neg) / (n_pos + n_neg) if n_pos + n_neg else np.nan,
        mean=float(st["mean"]),
        std=np.sqrt(m2_s / nf) * scale,
        rms=np.sqrt(sumsq_s / nf) * scale,
        l2=l2,
        min=vmin,
        max=vmax,
    )
    values = st["sample_values"]
    sample = values[np.isfinite(values) & (values != 0)]
    min_abs = float(st["min_abs"])
    vq, lq = sample_quantiles(
        sample, n_neg=n_neg, n_zero=nf - n_pos - n_neg, n_pos=n_pos, vmin=vmin, vmax=vmax,
        min_abs=min_abs if np.isfinite(min_abs) else np.nan, quantiles=q,
    )
    for qi, vv, lv in zip(q, vq, lq, strict=True):
        out[metadata.quantile_field(qi)] = vv
        out[metadata.quantile_field(qi, log=True)] = lv
    return np.array([out[f] for f in fields], dtype=np.float64)


#: From this many values a partition at the wanted order statistics may beat a sort; below
#: it numpy 2's vectorised sort always wins (``benchmarks/stats_bench.py`` times both).
PARTITION_FROM = 2**16
#: Whether arrays of ``PARTITION_FROM`` values or more are partitioned instead of sorted:
#: None until the first such array, then what timing both once on this CPU chose. It
#: depends on the CPU: with AVX-512 the sort made one tensor's statistics 2-2.5 times faster
#: than the partition from 10**4 to 2**18 values, on an AVX2 machine the partition won from
#: 2**16 on (``benchmarks/stats_bench.py --numpy-only``).
PARTITION: bool | None = None


def _partition_wins() -> bool:
    global PARTITION
    if PARTITION is None:
        x = np.random.default_rng(0).standard_normal(PARTITION_FROM)
        kth = np.linspace(0, x.size - 1, 40).astype(np.int64)

        def best(fn: Callable[[], object]) -> float:
            times = []
            for _ in range(3):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            return min(times)
        PARTITION = best(lambda: np.partition(x, kth)) < best(lambda: np.sort(x))
    return PARTITION


def _select(values: np.ndarray, positions: np.ndarray, scale=None) -> np.ndarray:
    """The order statistics of ``values`` at fractional sorted ``positions``, linearly
    interpolated (after ``scale``, e.g. ``np.log10``). A large array is partitioned at the
    positions' floors and ceilings instead of sorted where that is the faster on this CPU
    (a logged point takes this for every large weight and gradient)."""
    lo = np.floor(positions).astype(np.int64)
    hi = np.ceil(positions).astype(np.int64)
    if values.size < PARTITION_FROM or not _partition_wins():
        part = np.sort(values)
    else:
        part = np.partition(values, np.unique(np.concatenate([lo, hi])))
    a, b = part[lo].astype(np.float64), part[hi].astype(np.float64)
    if scale is not None:
        a, b = scale(a), scale(b)
    return np.where(hi > lo, a + (b - a) * (positions - lo), a)


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
    vals = np.asarray(sample)
    if vals.dtype.kind != "f":
        vals = vals.astype(np.float64)
    m = vals.size
    m_neg = int(np.count_nonzero(vals < 0))
    m_pos = m - m_neg

    def stratum(j, n_pop, m_samp, offset):
        # Population rank j (0-based within the stratum) -> sorted sample position.
        s = j if n_pop == m_samp else j * (m_samp - 1.0) / max(n_pop - 1.0, 1.0)
        return offset + np.clip(s, 0, max(m_samp - 1, 0))

    r = p * (n_fin - 1)
    lo = np.floor(r)
    hi = np.minimum(lo + 1, n_fin - 1)
    i = np.concatenate([lo, hi])  # population ranks
    neg = i < n_neg
    zero = ~neg & (i < n_neg + n_zero)
    at = np.where(neg, stratum(np.minimum(i, max(n_neg - 1, 0)), n_neg, m_neg, 0),
                  stratum(np.maximum(i - n_neg - n_zero, 0), n_pos, m_pos, m_neg))
    v = _select(vals, np.clip(at, 0, m - 1)) if m else np.zeros(i.shape)
    v = np.where(neg, v if m_neg else vmin, np.where(zero, 0.0, v if m_pos else vmax))
    a, b = v[:i.size // 2], v[i.size // 2:]
    vq = np.where(hi > lo, a + (b - a) * (r - lo), a)
    vq = np.where(p == 0, vmin, np.where(p == 1, vmax, vq))
    vq = np.clip(vq, vmin, vmax)

    if m == 0:
        return vq, np.full(p.shape, np.nan)
    rm = p * (m - 1)
    lq = _select(np.abs(vals), rm, np.log10)
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
    """Statistics of array ``x`` as a float64 vector laid out as ``metadata.tensor_stats_fields``:
    ``finalize(tensor_state(x))``.

    ``sample_size=None`` takes exact percentiles (sorts every finite non-zero
    value). The ``epoch`` slot and the view's extra slots are NaN.
    """
    metadata.tensor_stats_fields(view, quantiles)  # validates the view before any work
    _check_quantiles(quantiles)
    st = tensor_state(x, sample_size=sample_size, seed=seed, name=name)
    return finalize(st, view, quantiles=quantiles)


# ------------------------------------------------------------- slots from two points


def update_ratio(w: np.ndarray, dw: np.ndarray) -> float:
    """``update_ratio``: ‖dw‖ / ‖w‖, the change ``dw`` since the previous point relative to
    the weights ``w`` (NaN or inf when ``w`` is all zero)."""
    w = np.asarray(w, np.float64).reshape(-1)
    dw = np.asarray(dw, np.float64).reshape(-1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return float(np.sqrt(np.dot(dw, dw)) / np.sqrt(np.dot(w, w)))


def cos_prev(g: np.ndarray, prev: np.ndarray) -> float:
    """``cos_prev``: the cosine between a gradient aggregate and the previous point's (NaN
    when either is zero)."""
    a = np.asarray(g, np.float64).reshape(-1)
    b = np.asarray(prev, np.float64).reshape(-1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return float(np.dot(a, b) / np.sqrt(np.dot(a, a) * np.dot(b, b)))


def implicit_lr(dw: np.ndarray, gsum: np.ndarray,
                quantiles: Sequence[float] = metadata.DEFAULT_QUANTILES,
                steps_per_sample: float = 1.0,
                rng: np.random.Generator | None = None) -> dict[str, float]:
    """The ``ilr_q<p>`` slots: percentiles of |dw| / |G| over the elements whose gradient sum
    ``G`` (``gsum`` times ``steps_per_sample`` with ``every=N``) is not zero, over every
    element of up to ``ILR_SAMPLE`` and ``ILR_SAMPLE`` uniform draws (``rng``) of larger
    variables; NaN when no gradient sum is non-zero."""
    d, g = np.asarray(dw).reshape(-1), np.asarray(gsum).reshape(-1)
    if d.size > ILR_SAMPLE:  # drawn first: the rest of a large variable is never read
        pick = (rng or np.random.default_rng(0)).integers(0, d.size, ILR_SAMPLE)
        d, g = d[pick], g[pick]
    d = np.abs(d.astype(np.float64))
    g = np.abs(g.astype(np.float64)) * steps_per_sample
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = d / g
    rate = rate[(g > 0) & np.isfinite(rate)]
    values = np.percentile(rate, quantiles) if rate.size else [np.nan] * len(quantiles)
    return {metadata.ILR_PREFIX + metadata.quantile_field(q): float(v)
            for q, v in zip(quantiles, values, strict=True)}
