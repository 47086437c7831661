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
    return float(scale_exponents(vmin, vmax))


def scale_exponents(vmin, vmax) -> np.ndarray:
    """``scale_exponent`` of each pair of extremes (arrays)."""
    m = np.maximum(np.abs(vmin), np.abs(vmax))
    ok = np.isfinite(m) & (m > 0)
    e = np.floor(np.log2(np.where(ok, m, 1.0)))
    return np.where(ok, np.clip(e, -_MAX_EXP, _MAX_EXP), 0.0)


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
    # Weights and most gradients are all finite, which finite extremes prove (a NaN makes
    # them NaN): the masking passes are then identities (same values, bit for bit), and a
    # logged point takes this for every one of them.
    lo, hi = (flat.min(), flat.max()) if n else (np.nan, np.nan)
    if np.isfinite(lo) and np.isfinite(hi):
        finite, nf = None, n
    else:
        finite = np.isfinite(flat)
        nf = int(np.count_nonzero(finite))
    all_finite = nf == n
    xf = flat if all_finite else np.where(finite, flat, 0)
    active = xf != 0
    n_active = int(np.count_nonzero(active))
    n_pos = int(np.count_nonzero(xf > 0))
    n_neg = n_active - n_pos
    # Weights seldom hold an exact zero: then every unit counts all its elements, and the
    # sample draws from the array itself.
    dense = n_active == n
    st = empty_state(a.shape, sample_size=sample_size)
    blocks, channels, positions = _units(a.shape)
    per_unit = active.reshape(blocks)
    if channels:
        st["channel_nnz"] = (np.full(channels, blocks[0] * blocks[1], np.float64) if dense else
                             np.count_nonzero(per_unit, axis=(0, 1)).astype(np.float64))
    if positions:
        st["spatial_nnz"] = (np.full(positions, blocks[0] * blocks[2], np.float64) if dense
                             else np.count_nonzero(per_unit, axis=(0, 2)).astype(np.float64))
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
        vmin, vmax = float(lo), float(hi)
    else:
        vmin = float(np.min(flat, where=finite, initial=np.inf))
        vmax = float(np.max(flat, where=finite, initial=-np.inf))
    e = scale_exponent(vmin, vmax)
    xs = np.multiply(xf, 2.0**-e, dtype=np.float64)  # exact: a power of two
    mean_s = xs.sum() / nf
    xs -= mean_s  # the deviations, in place
    dev = xs if all_finite else np.where(finite, xs, 0.0)
    m2_s = float(np.dot(dev, dev))
    nonzero = flat if dense else flat[active]
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


#: Arrays of at most this many values are taken together by ``tensor_states`` (when the
#: sample holds them whole); a larger one's own numpy calls cost little beside its passes.
BATCH_MAX = 2**16


def tensor_states(
    arrays: Sequence,
    *,
    sample_size: int | None = DEFAULT_SAMPLE_SIZE,
    names: Sequence[str | None] | None = None,
) -> list[State]:
    """``tensor_state`` of each array. Non-empty arrays of at most ``BATCH_MAX`` values
    that the sample holds whole are taken together, by segment reductions over one float64
    concatenation: a few dozen numpy calls for all of them where each alone costs as many
    (a logged point's weights, biases and normalization scales). Their moments are summed
    in another order, so they may differ from ``tensor_state``'s in the last bits; their
    sample keys come from one generator seeded by the data."""
    k = _check_sample_size(sample_size)
    names = list(names) if names is not None else [None] * len(arrays)
    flats = [_to_float(x, nm) for x, nm in zip(arrays, names, strict=True)]
    out: list[State | None] = [None] * len(flats)
    batch = []
    for i, a in enumerate(flats):
        if 0 < a.size <= min(BATCH_MAX, k):
            batch.append(i)
        else:
            out[i] = tensor_state(a, sample_size=sample_size, name=names[i])
    if not batch:
        return out
    sizes = np.array([flats[i].size for i in batch], dtype=np.int64)
    cat, starts = _flat64([flats[i] for i in batch])
    finite = np.isfinite(cat)
    nf = np.add.reduceat(finite, starts, dtype=np.int64)
    if int(nf.sum()) == cat.size:  # the usual case: the masking passes are identities
        xf, lows, highs = cat, cat, cat
        posinf = neginf = np.zeros(len(batch), dtype=np.int64)
    else:
        xf = np.where(finite, cat, 0.0)
        lows, highs = np.where(finite, cat, np.inf), np.where(finite, cat, -np.inf)
        posinf = np.add.reduceat(cat == np.inf, starts, dtype=np.int64)
        neginf = np.add.reduceat(cat == -np.inf, starts, dtype=np.int64)
    active = xf != 0
    n_active = np.add.reduceat(active, starts, dtype=np.int64)
    n_pos = np.add.reduceat(xf > 0, starts, dtype=np.int64)
    vmin = np.minimum.reduceat(lows, starts)
    vmax = np.maximum.reduceat(highs, starts)
    e = scale_exponents(vmin, vmax)
    xs = xf * np.repeat(2.0**-e, sizes)
    mean_s = np.add.reduceat(xs, starts) / np.maximum(nf, 1)
    xs -= np.repeat(mean_s, sizes)
    if xf is not cat:
        xs[~finite] = 0.0
    m2_s = np.add.reduceat(xs * xs, starts)
    mags = np.abs(xf)
    dense = n_active == sizes  # weights seldom hold an exact zero: every unit counts all
    if not dense.all():
        mags[~active] = np.inf
    min_abs = np.minimum.reduceat(mags, starts)
    # the values in the arrays' own float type (float32 sorts in half the time)
    narrow = {a.dtype for a in (flats[i] for i in batch)} == {np.dtype(np.float32)}
    values = (np.concatenate([flats[i].reshape(-1) for i in batch]) if narrow else cat)[active]
    keys = np.random.default_rng(_content_seed(float(mean_s.sum()), float(m2_s.sum()))
                                 ).random(values.size)
    ends = np.cumsum(n_active)
    for j, i in enumerate(batch):
        st = empty_state(flats[i].shape, sample_size=sample_size)
        blocks, channels, positions = _units(flats[i].shape)
        if dense[j]:
            if channels:
                st["channel_nnz"] = np.full(channels, blocks[0] * blocks[1], np.float64)
            if positions:
                st["spatial_nnz"] = np.full(positions, blocks[0] * blocks[2], np.float64)
        else:
            per_unit = active[starts[j]:starts[j] + sizes[j]].reshape(blocks)
            if channels:
                st["channel_nnz"] = np.count_nonzero(per_unit, axis=(0, 1)).astype(np.float64)
            if positions:
                st["spatial_nnz"] = np.count_nonzero(per_unit, axis=(0, 2)).astype(np.float64)
        a, b = ends[j] - n_active[j], ends[j]
        st.update(
            count=np.float64(sizes[j]), finite_count=np.float64(nf[j]),
            posinf_count=np.float64(posinf[j]), neginf_count=np.float64(neginf[j]),
            pos_count=np.float64(n_pos[j]), neg_count=np.float64(n_active[j] - n_pos[j]),
            activity_count=np.float64(nf[j]), mean=np.float64(mean_s[j] * 2.0**e[j]),
            m2=np.float64(m2_s[j]), min=vmin[j], max=vmax[j], min_abs=min_abs[j],
            sample_keys=keys[a:b], sample_values=values[a:b],
        )
        out[i] = st
    return out


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


#: The scalars of a packed state (``pack_state``), in order.
PACKED_SCALARS = ("count", "finite_count", "posinf_count", "neginf_count", "pos_count",
                  "neg_count", "mean", "m2", "min", "max", "min_abs", "activity_count")


def packed_length(channels: int, positions: int, k: int) -> int:
    """The length of ``pack_state``'s vector for these widths and sample bound."""
    return len(PACKED_SCALARS) + channels + positions + 2 * k


def pack_state(st: Mapping[str, np.ndarray], channels: int, positions: int, k: int
               ) -> np.ndarray:
    """A state as one fixed-length float64 vector (``packed_length``), so that the states of
    many tensors and ranks travel in one buffer: the scalars, the per-channel and
    per-position counts (``channels`` / ``positions`` wide), then ``k`` sample keys (``inf``
    where not taken) and ``k`` values. The sample must hold at most ``k`` entries."""
    out = np.zeros(packed_length(channels, positions, k))
    s = len(PACKED_SCALARS)
    out[:s] = [float(st[key]) for key in PACKED_SCALARS]
    out[s:s + channels] = st["channel_nnz"]
    out[s + channels:s + channels + positions] = st["spatial_nnz"]
    keys, values = st["sample_keys"], st["sample_values"]
    a = s + channels + positions
    out[a:a + k] = np.inf
    out[a:a + keys.size] = keys
    out[a + k:a + k + values.size] = values
    return out


def unpack_state(vec: np.ndarray, channels: int, positions: int, k: int) -> State:
    """The state ``pack_state`` packed (bit for bit)."""
    st = empty_state(sample_size=k)
    s = len(PACKED_SCALARS)
    st.update({key: np.float64(v) for key, v in zip(PACKED_SCALARS, vec[:s], strict=True)})
    st["channel_nnz"] = vec[s:s + channels].copy()
    st["spatial_nnz"] = vec[s + channels:s + channels + positions].copy()
    st["channels"], st["positions"] = np.float64(channels), np.float64(positions)
    a = s + channels + positions
    keys = vec[a:a + k]
    taken = np.isfinite(keys)
    st["sample_keys"], st["sample_values"] = keys[taken].copy(), vec[a + k:a + 2 * k][taken].copy()
    return st


def _rescale_m2(m2: float, e_from: float, e_to: float) -> float:
    """m2 in units of 4**e_from -> units of 4**e_to (two steps: 4**d may overflow)."""
    f = 2.0 ** (e_from - e_to)
    return m2 * f * f


def finalize(
    st: Mapping[str, np.ndarray],
    view: str,
    *,
    quantiles: Sequence[float] = metadata.DEFAULT_QUANTILES,
) -> np.ndarray:
    """The packed float64 vector of a state, laid out as ``metadata.tensor_stats_fields``
    (``stats.finalize``'s slots). The ``epoch`` slot and the view's extra slots are NaN."""
    return finalize_many([st], view, quantiles=quantiles)[0]


def finalize_many(
    states: Sequence[Mapping[str, np.ndarray]],
    view: str,
    *,
    quantiles: Sequence[float] = metadata.DEFAULT_QUANTILES,
) -> np.ndarray:
    """``[len(states), slots]``: the packed vector of each state (``finalize``), computed for
    all of them at once: a logged point finalizes dozens to hundreds of small states, whose
    numpy calls would otherwise cost more than their arithmetic."""
    fields = metadata.tensor_stats_fields(view, quantiles)
    q = _check_quantiles(quantiles)
    col = {f: i for i, f in enumerate(fields)}
    out = np.full((len(states), len(fields)), np.nan)
    if not states:
        return out

    def get(key: str) -> np.ndarray:
        return np.array([st[key] for st in states], dtype=np.float64)

    n, nf, posinf, neginf = get("count"), get("finite_count"), get("posinf_count"), \
        get("neginf_count")
    n_pos, n_neg = get("pos_count"), get("neg_count")
    channels, positions = get("channels"), get("positions")
    out[:, col["count"]], out[:, col["finite_count"]] = n, nf
    out[:, col["nan_count"]] = np.maximum(n - nf - posinf - neginf, 0.0)
    out[:, col["posinf_count"]], out[:, col["neginf_count"]] = posinf, neginf
    out[:, col["dead_rate"]] = _units_dead([st["channel_nnz"] for st in states], channels, n)
    out[:, col["spatial_dead_rate"]] = _units_dead([st["spatial_nnz"] for st in states],
                                                   positions, n)
    # The per-unit counts are over activity_count elements, which may cover more steps
    # than the rest of the state (PyTorch's rectifier outputs).
    tracked = channels > 0
    active = np.where(tracked, [np.sum(st["channel_nnz"]) for st in states], n_pos + n_neg)
    over = np.where(tracked, get("activity_count"), nf)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        out[:, col["activation_rate"]] = np.where(over > 0, active / over, np.nan)
        out[:, col["zero_fraction"]] = np.where(over > 0, (over - active) / over, np.nan)
        vmin, vmax = get("min"), get("max")
        e = scale_exponents(vmin, vmax)
        scale = 2.0**e
        mean = get("mean")
        mean_s = mean * 2.0**-e
        m2_s = get("m2")
        sumsq_s = m2_s + nf * mean_s * mean_s
        signed = n_pos + n_neg
        moments = {
            "sign_balance": np.where(signed > 0, (n_pos - n_neg) / signed, np.nan),
            "mean": mean, "std": np.sqrt(m2_s / nf) * scale,
            "rms": np.sqrt(sumsq_s / nf) * scale,
            "l2": np.sqrt(sumsq_s) * scale,  # a true L2 above the float64 range is inf
            "min": vmin, "max": vmax,
        }
    some = nf > 0
    for key, value in moments.items():
        out[some, col[key]] = value[some]
    samples = []
    for st in states:
        values = st["sample_values"]
        samples.append(values[np.isfinite(values) & (values != 0)])
    min_abs = get("min_abs")
    vq, lq = sample_quantiles(
        samples, n_neg=n_neg, n_zero=nf - n_pos - n_neg, n_pos=n_pos, vmin=vmin, vmax=vmax,
        min_abs=np.where(np.isfinite(min_abs), min_abs, np.nan), quantiles=q,
    )
    out[:, [col[metadata.quantile_field(qi)] for qi in q]] = vq
    out[:, [col[metadata.quantile_field(qi, log=True)] for qi in q]] = lq
    return out


def _units_dead(nnz: Sequence[np.ndarray], units: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Share of each state's ``units`` units whose non-zero count is 0; NaN where the tensor
    is empty or no unit is tracked."""
    dead = units - np.array([np.count_nonzero(c) for c in nnz], dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where((count > 0) & (units > 0), dead / units, np.nan)


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


class _Sorted:
    """Rows of values, sorted for their order statistics (``select``).

    Rows under ``PARTITION_FROM`` values are sorted together, padded with +inf to the next
    power of two: one sort per width, not one per row (a point's many small tensors). A
    larger row is sorted alone, or kept to be partitioned at the wanted positions where
    that is the faster on this CPU."""

    def __init__(self, rows: Sequence[np.ndarray]) -> None:
        widths: dict[int, list[int]] = {}
        self.large: dict[int, np.ndarray] = {}
        for i, row in enumerate(rows):
            if row.size < PARTITION_FROM:
                widths.setdefault(max(16, 1 << (row.size - 1).bit_length()), []).append(i)
            elif _partition_wins():
                self.large[i] = row
            else:
                widths.setdefault(row.size, []).append(i)
        self.groups: list[tuple[list[int], np.ndarray]] = []
        for width, idx in widths.items():
            # float32 rows sort as float32, twice as fast, in the same order
            mat = np.full((len(idx), width), np.inf,
                          dtype=np.result_type(np.float32, *(rows[i].dtype for i in idx)))
            for j, i in enumerate(idx):
                mat[j, :rows[i].size] = rows[i]
            mat.sort(axis=1)
            self.groups.append((idx, mat))

    def magnitudes(self) -> _Sorted:
        """The rows' absolute values, in order (``_Magnitudes``)."""
        return _Magnitudes(self)

    def _take(self, mat: np.ndarray, ranks: np.ndarray) -> np.ndarray:
        """The ``ranks``-th (0-based) order statistics of each sorted row of ``mat``."""
        return np.take_along_axis(mat, ranks, axis=1)

    def select(self, positions: np.ndarray, scale=None) -> np.ndarray:
        """``[rows, P]``: each row's order statistics at its fractional sorted ``positions``
        (within the row), linearly interpolated (after ``scale``, e.g. ``np.log10``)."""
        lo = np.floor(positions).astype(np.int64)
        hi = np.ceil(positions).astype(np.int64)
        a, b = np.empty(positions.shape), np.empty(positions.shape)
        for idx, mat in self.groups:
            a[idx], b[idx] = np.split(self._take(mat, np.concatenate([lo[idx], hi[idx]], 1)),
                                      2, axis=1)
        for i, row in self.large.items():
            part = np.partition(row, np.unique(np.concatenate([lo[i], hi[i]])))
            a[i], b[i] = part[lo[i]], part[hi[i]]
        with np.errstate(divide="ignore", invalid="ignore"):  # +inf where a row is empty
            if scale is not None:
                a, b = scale(a), scale(b)
            return np.where(hi > lo, a + (b - a) * (positions - lo), a)


#: A group of sorted rows of at most this many values (padding included) is sorted again by
#: magnitude: its sort costs less than ``_Magnitudes``' binary search, whose dozen rounds
#: of a dozen numpy calls each cost 100-250 us whatever the rows' width
#: (``benchmarks/stats_bench.py``).
SORT_MAGNITUDES_UP_TO = 2**16


class _Magnitudes(_Sorted):
    """The absolute values of a ``_Sorted``'s rows of finite non-zero values, in order.
    A group of small rows is sorted again by magnitude (``SORT_MAGNITUDES_UP_TO``); a larger
    one is not (a second sort cost a point as much as the first): a sorted row's
    magnitudes are two sorted runs, the negatives read backwards and the positives, so each
    wanted one is found by a binary search for how many of the smallest come from the
    negatives, for every row and rank at once (the engine's ``order_statistics``). A row
    partitioned instead of sorted is partitioned again by magnitude."""

    def __init__(self, values: _Sorted) -> None:
        super().__init__(())
        self.groups = values.groups
        self.large = {i: np.abs(r) for i, r in values.large.items()}

    def _take(self, mat: np.ndarray, ranks: np.ndarray) -> np.ndarray:
        if (mat[:, 0] > 0).all():  # no negatives (rectifier outputs): the values' order
            return np.take_along_axis(mat, ranks, axis=1)
        if mat.size <= SORT_MAGNITUDES_UP_TO:
            return np.take_along_axis(np.sort(np.abs(mat), axis=1), ranks, axis=1)
        width, rows = mat.shape[1], np.arange(mat.shape[0])[:, np.newaxis]

        def at(i: np.ndarray) -> np.ndarray:  # past the ends: unspecified, masked below
            return mat[rows, np.minimum(np.maximum(i, 0), width - 1)]

        m_neg = np.count_nonzero(mat < 0, axis=1, keepdims=True)
        m_pos = np.count_nonzero((mat > 0) & (mat < np.inf), axis=1, keepdims=True)
        # The smallest count of negatives among the ranks + 1 smallest magnitudes at which
        # the last positive taken is no larger than the next negative's magnitude.
        lo = np.maximum(0, ranks + 1 - m_pos)
        hi = np.minimum(ranks + 1, m_neg)
        for _ in range(width.bit_length() + 1):
            mid = (lo + hi) // 2
            fits = (mid >= hi) | (at(m_neg + ranks - mid) <= -at(m_neg - 1 - mid))
            hi = np.where(fits, mid, hi)
            lo = np.where(fits, lo, mid + 1)
        taken = ranks + 1 - lo  # positives among them
        return np.maximum(np.where(lo > 0, -at(m_neg - lo), -np.inf),
                          np.where(taken > 0, at(m_neg + taken - 1), -np.inf))


def sample_quantiles(
    samples: Sequence[np.ndarray],
    *,
    n_neg: np.ndarray,
    n_zero: np.ndarray,
    n_pos: np.ndarray,
    vmin: np.ndarray,
    vmax: np.ndarray,
    min_abs: np.ndarray,
    quantiles: Sequence[float],
) -> tuple[np.ndarray, np.ndarray]:
    """``[len(samples), Q]`` value and log10|x| percentiles, one row per state, from its
    sample of finite non-zero values and its counts and extremes (vectors over the states).

    Mirrors ``stats.quantiles.sample_quantiles``: each population order statistic is
    mapped into the sample within its sign stratum; exact when a sample holds every finite
    non-zero value.
    """
    p = np.asarray(quantiles, dtype=np.float64) / 100.0
    nq = p.size
    m = np.array([s.size for s in samples], dtype=np.float64)[:, None]
    m_neg = np.array([np.count_nonzero(s < 0) for s in samples], dtype=np.float64)[:, None]
    m_pos = m - m_neg
    n_neg, n_zero, n_pos = (np.asarray(v, dtype=np.float64)[:, None]
                            for v in (n_neg, n_zero, n_pos))
    vmin, vmax, min_abs = (np.asarray(v, dtype=np.float64)[:, None]
                           for v in (vmin, vmax, min_abs))
    n_fin = n_neg + n_zero + n_pos

    def stratum(j, n_pop, m_samp, offset):
        # Population rank j (0-based within the stratum) -> sorted sample position.
        s = np.where(n_pop == m_samp, j, j * (m_samp - 1.0) / np.maximum(n_pop - 1.0, 1.0))
        return offset + np.clip(s, 0, np.maximum(m_samp - 1, 0))

    r = p * (n_fin - 1)
    lo = np.floor(r)
    hi = np.minimum(lo + 1, n_fin - 1)
    i = np.concatenate([lo, hi], axis=1)  # population ranks
    neg = i < n_neg
    zero = ~neg & (i < n_neg + n_zero)
    at = np.where(neg, stratum(np.minimum(i, np.maximum(n_neg - 1, 0)), n_neg, m_neg, 0),
                  stratum(np.maximum(i - n_neg - n_zero, 0), n_pos, m_pos, m_neg))
    rows = _Sorted(samples)
    v = rows.select(np.clip(at, 0, np.maximum(m - 1, 0)))
    v = np.where(neg, np.where(m_neg > 0, v, vmin),
                 np.where(zero, 0.0, np.where(m_pos > 0, v, vmax)))
    a, b = v[:, :nq], v[:, nq:]
    with np.errstate(invalid="ignore"):
        vq = np.where(hi > lo, a + (b - a) * (r - lo), a)
    vq = np.where(p == 0, vmin, np.where(p == 1, vmax, vq))
    vq = np.clip(vq, vmin, vmax)
    vq[n_fin[:, 0] == 0] = np.nan

    lq = rows.magnitudes().select(np.maximum(p * (m - 1), 0), np.log10)
    with np.errstate(divide="ignore", invalid="ignore"):
        max_abs = np.maximum(np.abs(vmin), np.abs(vmax))
        lq = np.where(p == 0, np.log10(min_abs), np.where(p == 1, np.log10(max_abs), lq))
    lq[(m[:, 0] == 0) | (n_fin[:, 0] == 0)] = np.nan
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


def tensor_stats_many(
    arrays: Sequence,
    view: str,
    *,
    quantiles: Sequence[float] = metadata.DEFAULT_QUANTILES,
    sample_size: int | None = DEFAULT_SAMPLE_SIZE,
    names: Sequence[str | None] | None = None,
) -> np.ndarray:
    """``[len(arrays), slots]``: ``tensor_stats`` of each array, the small ones computed
    together (``tensor_states``, ``finalize_many``).

    >>> tensor_stats_many([np.ones(3), np.arange(4.0)], "variable").shape[0]
    2
    """
    metadata.tensor_stats_fields(view, quantiles)
    _check_quantiles(quantiles)
    states = tensor_states(arrays, sample_size=sample_size, names=names)
    return finalize_many(states, view, quantiles=quantiles)


# ------------------------------------------------------------- slots from two points


def _flat64(arrays: Sequence) -> tuple[np.ndarray, np.ndarray]:
    """The arrays flattened into one float64 vector, and the start of each."""
    sizes = np.array([np.size(a) for a in arrays], dtype=np.int64)
    cat = (np.concatenate([np.reshape(a, -1) for a in arrays], dtype=np.float64)
           if len(arrays) else np.zeros(0))
    return cat, np.cumsum(sizes) - sizes


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


def _f64_flat(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).reshape(-1)


def update_ratios(ws: Sequence[np.ndarray], dws: Sequence[np.ndarray]) -> np.ndarray:
    """``update_ratio`` of each variable: ‖dw‖ / ‖w‖, the change ``dw`` since the previous
    point relative to the weights ``w`` (NaN or inf when ``w`` is all zero)."""
    # One float64 copy and one dot product per array: concatenating a model's variables
    # first cost twice the memory traffic (a point's largest host cost on MobileNetV2).
    ww, dd = np.zeros(len(ws)), np.zeros(len(ws))
    for i, (w, dw) in enumerate(zip(ws, dws, strict=True)):
        w, dw = _f64_flat(w), _f64_flat(dw)
        ww[i], dd[i] = np.dot(w, w), np.dot(dw, dw)
    return update_ratio_of_sums(ww, dd)


def cos_prevs(gs: Sequence[np.ndarray], prevs: Sequence[np.ndarray]) -> np.ndarray:
    """``cos_prev`` of each gradient aggregate: the cosine with the previous point's (NaN
    when either is zero)."""
    ab, aa, bb = np.zeros(len(gs)), np.zeros(len(gs)), np.zeros(len(gs))
    for i, (g, prev) in enumerate(zip(gs, prevs, strict=True)):
        a, b = _f64_flat(g), _f64_flat(prev)
        ab[i], aa[i], bb[i] = np.dot(a, b), np.dot(a, a), np.dot(b, b)
    return cosine_of_sums(ab, aa, bb)


def implicit_lrs(dws: Sequence[np.ndarray], gsums: Sequence[np.ndarray],
                 quantiles: Sequence[float] = metadata.DEFAULT_QUANTILES,
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
    d, starts = _flat64(ds)
    g, _ = _flat64(gs)
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
              quantiles: Sequence[float] = metadata.DEFAULT_QUANTILES) -> np.ndarray:
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
                  quantiles: Sequence[float] = metadata.DEFAULT_QUANTILES) -> np.ndarray:
    """``[len(rows), Q]``: the percentiles of each row of implicit learning rates (NaN for
    an empty row)."""
    p = np.asarray(quantiles, dtype=np.float64) / 100.0
    m = np.array([r.size for r in rows], dtype=np.float64)[:, None]
    out = _Sorted(rows).select(np.maximum(p * (m - 1), 0))
    out[m[:, 0] == 0] = np.nan
    return out
