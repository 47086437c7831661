"""A state's packed vector (``finalize``, ``finalize_many``: the one numpy place each slot's
formula lives) and an array's statistics in one call (``tensor_stats``), as
``tb_introspect.stats.vector`` finalizes in TensorFlow."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from tb_introspect import slots
from tb_introspect.stats_np.quantiles import sample_quantiles
from tb_introspect.stats_np.state import (
    DEFAULT_SAMPLE_SIZE,
    check_quantiles,
    scale_exponents,
    tensor_state,
    tensor_states,
)


def finalize(
    st: Mapping[str, np.ndarray],
    view: str,
    *,
    quantiles: Sequence[float] = slots.DEFAULT_QUANTILES,
) -> np.ndarray:
    """The packed float64 vector of a state, laid out as ``slots.tensor_stats_fields``
    (``stats.finalize``'s slots). The ``epoch`` slot and the view's extra slots are NaN."""
    return finalize_many([st], view, quantiles=quantiles)[0]


def finalize_many(
    states: Sequence[Mapping[str, np.ndarray]],
    view: str,
    *,
    quantiles: Sequence[float] = slots.DEFAULT_QUANTILES,
) -> np.ndarray:
    """``[len(states), slots]``: the packed vector of each state (``finalize``), computed for
    all of them at once: a logged point finalizes dozens to hundreds of small states, whose
    numpy calls would otherwise cost more than their arithmetic."""
    fields = slots.tensor_stats_fields(view, quantiles)
    q = check_quantiles(quantiles)
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
    out[:, [col[slots.quantile_field(qi)] for qi in q]] = vq
    out[:, [col[slots.quantile_field(qi, log=True)] for qi in q]] = lq
    return out


def _units_dead(nnz: Sequence[np.ndarray], units: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Share of each state's ``units`` units whose non-zero count is 0; NaN where the tensor
    is empty or no unit is tracked."""
    dead = units - np.array([np.count_nonzero(c) for c in nnz], dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where((count > 0) & (units > 0), dead / units, np.nan)


def tensor_stats(
    x,
    view: str,
    *,
    quantiles: Sequence[float] = slots.DEFAULT_QUANTILES,
    sample_size: int | None = DEFAULT_SAMPLE_SIZE,
    seed: int | np.random.Generator | None = None,
    name: str | None = None,
) -> np.ndarray:
    """Statistics of array ``x`` as a float64 vector laid out as ``slots.tensor_stats_fields``:
    ``finalize(tensor_state(x))``.

    ``sample_size=None`` takes exact percentiles (sorts every finite non-zero
    value). The ``epoch`` slot and the view's extra slots are NaN.
    """
    slots.tensor_stats_fields(view, quantiles)  # validates the view before any work
    check_quantiles(quantiles)
    st = tensor_state(x, sample_size=sample_size, seed=seed, name=name)
    return finalize(st, view, quantiles=quantiles)


def tensor_stats_many(
    arrays: Sequence,
    view: str,
    *,
    quantiles: Sequence[float] = slots.DEFAULT_QUANTILES,
    sample_size: int | None = DEFAULT_SAMPLE_SIZE,
    names: Sequence[str | None] | None = None,
) -> np.ndarray:
    """``[len(arrays), slots]``: ``tensor_stats`` of each array, the small ones computed
    together (``tensor_states``, ``finalize_many``).

    >>> tensor_stats_many([np.ones(3), np.arange(4.0)], "variable").shape[0]
    2
    """
    slots.tensor_stats_fields(view, quantiles)
    check_quantiles(quantiles)
    states = tensor_states(arrays, sample_size=sample_size, names=names)
    return finalize_many(states, view, quantiles=quantiles)
