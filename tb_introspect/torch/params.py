"""Statistics of the variable and gradient views at logging time, on the host.

Weights are read when a point is logged and gradient sums are accumulated on the device;
both arrive here as one host copy per view, split into numpy arrays per parameter. The
statistics are ``stats_np``'s, the reference itself, and so are the view slots the Keras
side fills: ``update_ratio`` and the ``ilr_q<p>`` percentiles of the implicit learning rate
for variables, ``cos_prev`` for gradients (``docs/format.md``, ``docs/statistics.md``).

PyTorch keeps a weight's output channels on axis 0 (``Linear``: ``(out, in)``, ``Conv2d``:
``(out, in, kh, kw)``); the statistics read it with that axis moved last, where the
format's dead rate looks for the channels (Keras's kernels are ``(..., in, out)``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tb_introspect import metadata, stats_np, summary_pb


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
        extras = {"update_ratio": stats_np.update_ratio(w, dw)}
        if gsums is not None:
            extras.update(stats_np.implicit_lr(dw, gsums[i], quantiles, steps_per_sample,
                                               np.random.default_rng([seed, i])))
        out.append(summary_pb.fill_slots(vec, "variable", quantiles, epoch=epoch, **extras))
    return out


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
        cos = np.nan if prevs is None else stats_np.cos_prev(g, prevs[i])
        vec = summary_pb.fill_slots(vec, "gradient", quantiles, epoch=epoch, cos_prev=cos)
        if skipped is not None and skipped[i].any():
            for j, f in enumerate(metadata.NONFINITE_FIELDS):
                vec[at[f]] += skipped[i, j]
            vec[at["count"]] += skipped[i].sum()
        out.append(vec)
    return out
