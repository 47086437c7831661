"""Statistics of the variable and gradient views at logging time, on the host.

Weights are read when a point is logged and gradient sums are accumulated on the device;
both arrive here as one host copy per view, split into numpy arrays per parameter. The
statistics are ``stats_np``'s, the reference itself, with the view slots the Keras side
fills: ``update_ratio`` and the ``ilr_q<p>`` percentiles of the implicit learning rate for
variables, ``cos_prev`` for gradients (``docs/format.md``, ``docs/statistics.md``).

PyTorch keeps a weight's output channels on axis 0 (``Linear``: ``(out, in)``, ``Conv2d``:
``(out, in, kh, kw)``); the statistics read it with that axis moved last, where the
format's dead rate looks for the channels (Keras's kernels are ``(..., in, out)``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tb_introspect import metadata, stats_np, summary_pb

#: Elements per variable the implicit-learning-rate percentiles come from (the Keras
#: side's ``ILR_SAMPLE``: exact in smaller variables, uniform draws in larger ones).
ILR_SAMPLE = 2048


def channels_last(a: np.ndarray) -> np.ndarray:
    """A PyTorch weight with its output-channel axis (0) moved last."""
    return np.moveaxis(a, 0, -1) if a.ndim >= 2 else a


def variable_vectors(
    ws: Sequence[np.ndarray], prevs: Sequence[np.ndarray], gsums: Sequence[np.ndarray] | None,
    *, names: Sequence[str], epoch: int, quantiles: Sequence[float], sample_size: int,
    steps_per_sample: float, seed: int,
) -> list[np.ndarray]:
    """The packed variable vectors: statistics of ``ws``, ``update_ratio`` against ``prevs``
    (the weights at the previous point) and the implicit learning rate when ``gsums`` (the
    window's gradient sums) is given."""
    out = []
    for i, (w, prev, name) in enumerate(zip(ws, prevs, names, strict=True)):
        vec = stats_np.tensor_stats(channels_last(w), "variable", quantiles=quantiles,
                                    sample_size=sample_size, name=name)
        dw = w.astype(np.float64) - prev
        norm = float(np.sqrt(np.dot(w.reshape(-1).astype(np.float64),
                                    w.reshape(-1).astype(np.float64))))
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = float(np.sqrt(np.dot(dw.reshape(-1), dw.reshape(-1)))) / norm
        extras = {"update_ratio": ratio}
        if gsums is not None:
            rng = np.random.default_rng([seed, i])
            extras.update(implicit_lr(dw, gsums[i], quantiles, steps_per_sample, rng))
        out.append(summary_pb.fill_slots(vec, "variable", quantiles, epoch=epoch, **extras))
    return out


def implicit_lr(dw: np.ndarray, gsum: np.ndarray, quantiles: Sequence[float],
                steps_per_sample: float, rng: np.random.Generator) -> dict[str, float]:
    """``ilr_q<p>``: percentiles of |dw| / |G| over the elements whose gradient sum ``G``
    (times ``steps_per_sample`` with ``every=N``) is not zero; NaN when none is."""
    d = np.abs(dw.reshape(-1).astype(np.float64))
    g = np.abs(gsum.reshape(-1).astype(np.float64)) * steps_per_sample
    if d.size > ILR_SAMPLE:
        pick = rng.integers(0, d.size, ILR_SAMPLE)
        d, g = d[pick], g[pick]
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = d / g
    rate = rate[(g > 0) & np.isfinite(rate)]
    values = np.percentile(rate, quantiles) if rate.size else [np.nan] * len(quantiles)
    return {metadata.ILR_PREFIX + metadata.quantile_field(q): float(v)
            for q, v in zip(quantiles, values, strict=True)}


def gradient_vectors(
    gs: Sequence[np.ndarray], prevs: Sequence[np.ndarray] | None, skipped: np.ndarray | None,
    *, names: Sequence[str], epoch: int, quantiles: Sequence[float], sample_size: int,
) -> list[np.ndarray]:
    """The packed gradient vectors of the window's gradient sums ``gs``, ``cos_prev``
    against the previous point's sums, and the non-finite values of skipped steps
    (``skipped``: ``[parameters, 3]`` NaN, +Inf, -Inf counts) added to the non-finite
    slots: those steps left the sum, their non-finite values are still counted."""
    fields = metadata.tensor_stats_fields("gradient", quantiles)
    at = {f: fields.index(f) for f in ("count", *metadata.NONFINITE_FIELDS)}
    out = []
    for i, (g, name) in enumerate(zip(gs, names, strict=True)):
        vec = stats_np.tensor_stats(channels_last(g), "gradient", quantiles=quantiles,
                                    sample_size=sample_size, name=name)
        cos = np.nan
        if prevs is not None:
            a, b = g.reshape(-1).astype(np.float64), prevs[i].reshape(-1).astype(np.float64)
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                cos = float(np.dot(a, b) / np.sqrt(np.dot(a, a) * np.dot(b, b)))
        vec = summary_pb.fill_slots(vec, "gradient", quantiles, epoch=epoch, cos_prev=cos)
        if skipped is not None and skipped[i].any():
            for j, f in enumerate(metadata.NONFINITE_FIELDS):
                vec[at[f]] += skipped[i, j]
            vec[at["count"]] += skipped[i].sum()
        out.append(vec)
    return out
