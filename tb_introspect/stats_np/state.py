"""The numpy engine's states: one array's (``tensor_state``), many small arrays' at once
(``tensor_states``), their merge (``merge_states``) and their packed form
(``pack_state``), as ``tb_introspect.stats.state`` holds the TensorFlow ones."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import numpy as np

DEFAULT_SAMPLE_SIZE = 2**18
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


def check_quantiles(quantiles: Sequence[float]) -> np.ndarray:
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
    cat, starts = flat64([flats[i] for i in batch])
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


def flat64(arrays: Sequence) -> tuple[np.ndarray, np.ndarray]:
    """The arrays flattened into one float64 vector, and the start of each."""
    sizes = np.array([np.size(a) for a in arrays], dtype=np.int64)
    cat = (np.concatenate([np.reshape(a, -1) for a in arrays], dtype=np.float64)
           if len(arrays) else np.zeros(0))
    return cat, np.cumsum(sizes) - sizes
