"""Statistics of the variable and gradient views at logging time, on the host, for every
framework.

Weights are read when a point is logged and gradient sums are accumulated on the device;
both arrive here as one host copy per view, split into numpy arrays per variable. The
statistics are ``stats_np``'s, the reference itself, and so are the view slots computed
from two points: ``update_ratio`` and the ``ilr_q<p>`` percentiles of the implicit learning
rate for variables, ``cos_prev`` for gradients (``docs/format.md``, ``docs/statistics.md``).
The previous point's weights and sums stay on the host (``Params``), not on the device.

PyTorch keeps a weight's output channels on axis 0 (``Linear``: ``(out, in)``, ``Conv2d``:
``(out, in, kh, kw)``); the statistics read it with that axis moved last, where the
format's dead rate looks for the channels (Keras's kernels are ``(..., in, out)`` already).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tb_introspect import metadata, stats_np, summary_pb
from tb_introspect.pipeline.plan import Plan
from tb_introspect.pipeline.point import Block, Point


def channels_last(a: np.ndarray) -> np.ndarray:
    """A PyTorch weight with its output-channel axis (0) moved last."""
    return np.moveaxis(a, 0, -1) if a.ndim >= 2 else a


class Params:
    """The variable and gradient blocks of each point, from one host copy of the weights
    and of the window's gradient sums; holds the previous point's copies (the first
    ``update_ratio`` is the change since ``weights``, the weights training started from).

    ``channels_first``: the weights keep their output channels on axis 0 (PyTorch)."""

    def __init__(self, plan: Plan, weights: Sequence[np.ndarray] | None, *,
                 channels_first: bool) -> None:
        self.plan = plan
        self.channels_first = channels_first
        self.w_prev = None if weights is None else [_f64(w) for w in weights]
        self.g_prev: list[np.ndarray] | None = None

    def add_blocks(self, out: Point, weights: Sequence[np.ndarray] | None,
                   gsums: Sequence[np.ndarray] | None, seed: int) -> None:
        """Append the gradient block of ``gsums`` (the window's sums, every variable) and
        the variable block of ``weights`` (every variable) to ``out``; either may be None
        (view not wanted, or not this process's to write). Each view's statistics are
        computed for all its tensors at once (``stats_np.tensor_stats_many``)."""
        plan, o = self.plan, self.plan.options
        specs = plan.variables
        if gsums is not None:
            keep = [i for i, s in enumerate(specs) if plan.writes("gradient", s)]
            if keep:
                g = [gsums[i] for i in keep]
                cos = (np.nan if self.g_prev is None
                       else stats_np.cos_prevs(g, [self.g_prev[i] for i in keep]))
                out.blocks.append(Block("gradient", [specs[i] for i in keep], summary_pb.fill_slots(
                    self._stats(g, "gradient", [specs[i] for i in keep]), "gradient",
                    o.quantiles, cos_prev=cos)))
            self.g_prev = list(gsums)
        if weights is not None:
            keep = [i for i, s in enumerate(specs) if plan.writes("variable", s)]
            w64 = [_f64(w) for w in weights]  # once: the change, its ratio, the next point
            if keep:
                w = [weights[i] for i in keep]
                dw = [w64[i] - self.w_prev[i] for i in keep]
                extras = {"update_ratio": stats_np.update_ratios(w, dw)}
                if gsums is not None:
                    steps = float(o.every) if isinstance(o.every, int) else 1.0
                    ilr = stats_np.implicit_lrs(dw, [gsums[i] for i in keep], o.quantiles,
                                                steps, seed)
                    extras.update({metadata.ILR_PREFIX + metadata.quantile_field(q): ilr[:, k]
                                   for k, q in enumerate(o.quantiles)})
                vecs = summary_pb.fill_slots(self._stats(w, "variable", [specs[i] for i in keep]),
                                             "variable", o.quantiles, **extras)
                out.blocks.append(Block("variable", [specs[i] for i in keep], vecs))
            self.w_prev = w64

    def _stats(self, arrays: list[np.ndarray], view: str, specs: list) -> np.ndarray:
        o = self.plan.options
        return stats_np.tensor_stats_many([self._view(a) for a in arrays], view,
                                          quantiles=o.quantiles, sample_size=o.sample_size,
                                          names=[s.name for s in specs])

    def _view(self, a: np.ndarray) -> np.ndarray:
        return channels_last(a) if self.channels_first else a


def _f64(a: np.ndarray) -> np.ndarray:
    return np.array(a, dtype=np.float64)
