"""Independent numpy reference for the statistics (tests only).

Written from the definitions in docs/statistics.md with plain numpy, exact
percentiles (``np.percentile``, linear interpolation) and no code shared with
``tb_introspect.stats`` / ``stats_np``.
"""

from __future__ import annotations

import numpy as np

from tb_introspect import slots


def reference_stats(x, view: str, quantiles=slots.DEFAULT_QUANTILES) -> dict[str, float]:
    a = np.asarray(x)
    if a.dtype.name == "bfloat16" or a.dtype.kind == "b":
        a = a.astype(np.float32)
    f = a.astype(np.float64).reshape(-1)  # float64 holds every float16/32 and int32 value
    fin = f[np.isfinite(f)]
    nz = fin[fin != 0]
    n, nf = f.size, fin.size
    out = dict.fromkeys(slots.tensor_stats_fields(view, quantiles), np.nan)
    out.update(
        count=n,
        finite_count=nf,
        nan_count=int(np.isnan(f).sum()),
        posinf_count=int((f == np.inf).sum()),
        neginf_count=int((f == -np.inf).sum()),
    )
    active = np.isfinite(a.astype(np.float64)) & (a.astype(np.float64) != 0)
    if n:
        if a.ndim <= 1:
            out["dead_rate"] = 1.0 - active.reshape(-1).mean()
        else:
            ch = active.reshape(-1, a.shape[-1]).any(axis=0)
            out["dead_rate"] = 1.0 - ch.mean() if ch.size else np.nan
        if a.ndim >= 3:
            sp = active.any(axis=(0, a.ndim - 1))
            out["spatial_dead_rate"] = 1.0 - sp.mean() if sp.size else np.nan
    if nf:
        # Scaled by a power of two so that squares of huge values stay finite.
        scale = 2.0 ** np.floor(np.log2(np.abs(fin).max())) if np.abs(fin).max() > 0 else 1.0
        s = fin / scale
        with np.errstate(over="ignore"):
            l2 = np.sqrt(np.sum(s * s)) * scale
        out.update(
            zero_fraction=(fin == 0).mean(),
            sign_balance=((fin > 0).sum() - (fin < 0).sum()) / (fin != 0).sum()
            if (fin != 0).any() else np.nan,
            mean=s.mean() * scale,
            std=s.std() * scale,
            rms=np.sqrt(np.mean(s * s)) * scale,
            l2=l2,
            min=fin.min(),
            max=fin.max(),
            activation_rate=(fin != 0).mean(),
        )
        for q, v in zip(quantiles, np.percentile(fin, quantiles), strict=True):
            out[slots.quantile_field(q)] = v
        if nz.size:
            logs = np.percentile(np.log10(np.abs(nz)), quantiles)
            for q, v in zip(quantiles, logs, strict=True):
                out[slots.quantile_field(q, log=True)] = v
    return out


def as_dict(vector, view: str, quantiles=slots.DEFAULT_QUANTILES) -> dict[str, float]:
    fields = slots.tensor_stats_fields(view, quantiles)
    v = np.asarray(vector, dtype=np.float64)
    assert v.shape == (len(fields),), (v.shape, len(fields))
    return dict(zip(fields, v.tolist(), strict=True))


COUNT_FIELDS = ("count", "finite_count", "nan_count", "posinf_count", "neginf_count")


def assert_stats_close(got: dict, want: dict, rtol: float = 1e-9, skip=("epoch",)) -> None:
    bad = []
    for key, w in want.items():
        if key in skip:
            continue
        g = got[key]
        if key in COUNT_FIELDS:
            ok = g == w
        elif np.isnan(w):
            ok = np.isnan(g)
        else:
            ok = np.isclose(g, w, rtol=rtol, atol=0) or g == w
        if not ok:
            bad.append(f"{key}: got {g!r}, want {w!r}")
    assert not bad, "\n".join(bad)


def percentile_band(data, q: float, tol_pp: float = 0.5) -> tuple[float, float]:
    """Exact percentiles q - tol and q + tol: the 0.5-pp rank-error band around q."""
    lo, hi = np.percentile(data, [max(0.0, q - tol_pp), min(100.0, q + tol_pp)])
    return float(lo), float(hi)


def rank_error_violations(data, reported, quantiles, tol_pp: float = 0.5) -> list[str]:
    """Quantiles whose reported value lies outside the exact [q - tol, q + tol] band."""
    bad = []
    for q, v in zip(quantiles, reported, strict=True):
        lo, hi = percentile_band(data, q, tol_pp)
        # Compared with a relative slack of a few ulps of float64 interpolation.
        eps = 1e-12 * max(abs(lo), abs(hi), 1e-300)
        if not (lo - eps <= v <= hi + eps):
            bad.append(f"q{q}: {v!r} outside [{lo!r}, {hi!r}]")
    return bad
