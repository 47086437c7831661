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

A variable split over processes (a ``Shard``: PyTorch's FSDP2 and tensor parallelism) is
never gathered whole: each process takes the state of the block it holds (``stats_np``'s
algebra, its per-channel and per-position counts placed where the block sits in the whole)
and the partial sums of the two-point slots (sum of w², of Δw², of g², of g_prev², of
g·g_prev), packs them into one fixed-length float64 vector (``local_vector``), and the
writing process merges every process's vectors (``add_blocks``'s ``shared``): counts, sums,
moments and extremes exactly, percentiles from the merged bottom-k samples, the implicit
learning rate's percentiles from merged samples of each block's rates (exact up to
``stats_np.ILR_SAMPLE`` elements).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tb_introspect import slots, stats_np, summary_pb
from tb_introspect.pipeline.plan import Plan
from tb_introspect.pipeline.point import Block, Point

#: The partial sums a shard adds for the two-point slots: the variable's (sum of w², of
#: Δw²) and the gradient's (sum of g², of g_prev², of g·g_prev).
_W_PARTIALS, _G_PARTIALS = 2, 3


def channels_last(a: np.ndarray) -> np.ndarray:
    """A PyTorch weight with its output-channel axis (0) moved last."""
    return np.moveaxis(a, 0, -1) if a.ndim >= 2 else a


@dataclass(frozen=True)
class Shard:
    """The block of a variable this process holds: the whole variable's ``shape``, the
    ``offset`` of the block in it (one per axis), and whether this copy ``counts`` (False
    on all but the first of the processes holding the same block). ``index``: per axis,
    the whole's index of each of the block's positions, for a block not contiguous in the
    whole (None: the block runs from ``offset``)."""

    shape: tuple[int, ...]
    offset: tuple[int, ...]
    counts: bool = True
    index: tuple[tuple[int, ...], ...] | None = None

    def positions(self, axis: int, n: int) -> np.ndarray | slice:
        """Where the block's ``n`` positions along ``axis`` sit in the whole."""
        if self.index is None:
            return slice(self.offset[axis], self.offset[axis] + n)
        return np.asarray(self.index[axis], dtype=np.int64)


class Params:
    """The variable and gradient blocks of each point, from one host copy of the weights
    and of the window's gradient sums; holds the previous point's copies (the first
    ``update_ratio`` is the change since ``weights``, the weights training started from).

    ``channels_first``: the weights keep their output channels on axis 0 (PyTorch).
    ``shards``: per variable, the ``Shard`` this process holds, None for a whole copy (the
    weights and sums handed in are then the local blocks of the sharded ones)."""

    def __init__(self, plan: Plan, weights: Sequence[np.ndarray] | None, *,
                 channels_first: bool, shards: Sequence[Shard | None] | None = None) -> None:
        self.plan = plan
        self.channels_first = channels_first
        n = len(plan.variables)
        self.shards = list(shards) if shards is not None else [None] * n
        self.sharded = [i for i, sh in enumerate(self.shards) if sh is not None]
        self.w_prev = None if weights is None else [_exact_copy(w) for w in weights]
        self.g_prev: list[np.ndarray | None] = [None] * n
        o = plan.options
        self.k = {i: min(int(np.prod(self.shards[i].shape, dtype=np.int64)) or 1,
                         o.sample_size, o.step_sample_size) for i in self.sharded}
        self.k_ilr = {i: min(int(np.prod(self.shards[i].shape, dtype=np.int64)) or 1,
                             stats_np.ILR_SAMPLE) for i in self.sharded}

    # ------------------------------------------------------------- sharded variables

    def _units(self, i: int) -> tuple[int, int]:
        shape = self.shards[i].shape
        if not shape:
            return 1, 0
        return shape[0], int(np.prod(shape[2:], dtype=np.int64)) if len(shape) >= 3 else 0

    def _layout(self, i: int, weights: bool, gsums: bool) -> list[tuple[str, int]]:
        c, p = self._units(i)
        state = stats_np.packed_length(c, p, self.k[i])
        parts = []
        if weights:
            parts += [("w", state), ("wp", _W_PARTIALS)]
            if gsums:
                parts.append(("ilr", 2 * self.k_ilr[i]))
        if gsums:
            parts += [("g", state), ("gp", _G_PARTIALS)]
        return parts

    def _global_state(self, i: int, local: np.ndarray) -> stats_np.State:
        """The state of this process's block of variable ``i``, its per-unit counts placed
        where the block sits (the identity where this copy does not count)."""
        sh, k = self.shards[i], self.k[i]
        c, p = self._units(i)
        empty = stats_np.empty_state(sample_size=k)
        empty.update(channel_nnz=np.zeros(c), spatial_nnz=np.zeros(p),
                     channels=np.float64(c), positions=np.float64(p))
        if not sh.counts or local.size == 0:
            return empty
        st = stats_np.tensor_state(self._view(local), sample_size=k)
        if local.ndim >= 1:
            empty["channel_nnz"][sh.positions(0, local.shape[0])] = st["channel_nnz"]
        if p:
            grid = np.zeros(sh.shape[2:])
            where = np.ix_(*(np.arange(sh.shape[a])[sh.positions(a, n)]
                             for a, n in enumerate(local.shape[2:], start=2)))
            grid[where] = st["spatial_nnz"].reshape(local.shape[2:])
            empty["spatial_nnz"] = grid.reshape(-1)
        st.update(channel_nnz=empty["channel_nnz"], spatial_nnz=empty["spatial_nnz"],
                  channels=np.float64(c), positions=np.float64(p))
        return st

    def local_vector(self, weights: Sequence[np.ndarray] | None,
                     gsums: Sequence[np.ndarray] | None, seed: int) -> np.ndarray:
        """Every process: this process's fixed-length vector of its sharded variables'
        states and partial sums (empty when none is sharded); keeps the blocks for the next
        point's two-point slots."""
        parts = []
        steps = self._steps()
        for i in self.sharded:
            sh, c, p = self.shards[i], *self._units(i)
            w = None if weights is None else _f64(weights[i])
            g = None if gsums is None else _f64(gsums[i])
            counts = sh.counts
            if w is not None:
                dw = w - self.w_prev[i]
                parts.append(stats_np.pack_state(self._global_state(i, w), c, p, self.k[i]))
                parts.append(np.array([np.dot(w.ravel(), w.ravel()),
                                       np.dot(dw.ravel(), dw.ravel())]) * counts)
                if g is not None:
                    k = self.k_ilr[i]
                    parts.append(stats_np.ilr_shard_sample(dw, g, steps, [seed, i, *sh.offset],
                                                           k) if counts else
                                 np.full(2 * k, np.inf))
                self.w_prev[i] = w
            if g is not None:
                prev = self.g_prev[i]
                gp = (np.array([np.dot(g.ravel(), g.ravel()), np.nan, np.nan]) if prev is None
                      else np.array([np.dot(g.ravel(), g.ravel()),
                                     np.dot(prev.ravel(), prev.ravel()),
                                     np.dot(g.ravel(), prev.ravel())]))
                parts.append(stats_np.pack_state(self._global_state(i, g), c, p, self.k[i]))
                parts.append(gp * counts)
                self.g_prev[i] = g
        return np.concatenate(parts) if parts else np.zeros(0)

    def _merged(self, shared: np.ndarray, weights: bool, gsums: bool) -> dict:
        """{(i, part): merged state or summed partials or merged ilr slots} of the sharded
        variables, from every process's ``local_vector`` (``shared``: ``[processes, L]``)."""
        out, at = {}, 0
        q = self.plan.options.quantiles
        for i in self.sharded:
            c, p = self._units(i)
            for part, n in self._layout(i, weights, gsums):
                block = shared[:, at:at + n]
                at += n
                if part in ("w", "g"):
                    st = stats_np.unpack_state(block[0], c, p, self.k[i])
                    for row in block[1:]:
                        st = stats_np.merge_states(st, stats_np.unpack_state(row, c, p,
                                                                             self.k[i]))
                    out[i, part] = st
                elif part == "ilr":
                    out[i, part] = stats_np.ilr_merge(list(block), self.k_ilr[i], q)
                else:
                    out[i, part] = block.sum(axis=0)
        return out

    # ------------------------------------------------------------- the blocks

    def add_blocks(self, out: Point, weights: Sequence[np.ndarray] | None,
                   gsums: Sequence[np.ndarray] | None, seed: int,
                   shared: np.ndarray | None = None) -> None:
        """Append the gradient block of ``gsums`` (the window's sums, every variable) and
        the variable block of ``weights`` (every variable) to ``out``; either may be None
        (view not wanted, or not this process's to write). Each view's statistics are
        computed for all its tensors at once (``stats_np.tensor_states``). Sharded
        variables come from ``shared``, every process's ``local_vector``."""
        plan, o = self.plan, self.plan.options
        specs = plan.variables
        merged = (self._merged(shared, weights is not None, gsums is not None)
                  if self.sharded and shared is not None else {})
        whole = [sh is None for sh in self.shards]
        if gsums is not None:
            keep = [i for i, s in enumerate(specs) if plan.writes("gradient", s)]
            if keep:
                cos = np.full(len(keep), np.nan)
                plain = [j for j, i in enumerate(keep) if whole[i] and self.g_prev[i] is not None]
                if plain:
                    cos[plain] = stats_np.cos_prevs([gsums[keep[j]] for j in plain],
                                                    [self.g_prev[keep[j]] for j in plain])
                for j, i in enumerate(keep):
                    if not whole[i]:
                        gg, pp, gp = merged[i, "gp"]
                        cos[j] = stats_np.cosine_of_sums(gp, gg, pp)
                out.blocks.append(Block("gradient", [specs[i] for i in keep], summary_pb.fill_slots(
                    self._stats(keep, gsums, "gradient", merged, "g"), "gradient",
                    o.quantiles, cos_prev=cos)))
            for i in range(len(specs)):
                if whole[i]:
                    self.g_prev[i] = gsums[i]
        if weights is not None:
            keep = [i for i, s in enumerate(specs) if plan.writes("variable", s)]
            if keep:
                plain = [j for j, i in enumerate(keep) if whole[i]]
                # Subtracted in float64 (exact), with no float64 copy of the weights.
                dw = {keep[j]: np.subtract(weights[keep[j]], self.w_prev[keep[j]],
                                           dtype=np.float64) for j in plain}
                ratio = np.full(len(keep), np.nan)
                if plain:
                    ratio[plain] = stats_np.update_ratios([weights[keep[j]] for j in plain],
                                                          [dw[keep[j]] for j in plain])
                ilr = np.full((len(keep), len(o.quantiles)), np.nan)
                if gsums is not None and plain:
                    ilr[plain] = stats_np.implicit_lrs([dw[keep[j]] for j in plain],
                                                       [gsums[keep[j]] for j in plain],
                                                       o.quantiles, self._steps(), seed)
                for j, i in enumerate(keep):
                    if not whole[i]:
                        ww, dd = merged[i, "wp"]
                        ratio[j] = stats_np.update_ratio_of_sums(ww, dd)
                        if gsums is not None:
                            ilr[j] = merged[i, "ilr"]
                extras = {"update_ratio": ratio}
                if gsums is not None:
                    extras.update({slots.ILR_PREFIX + slots.quantile_field(q): ilr[:, k]
                                   for k, q in enumerate(o.quantiles)})
                vecs = summary_pb.fill_slots(self._stats(keep, weights, "variable", merged, "w"),
                                             "variable", o.quantiles, **extras)
                out.blocks.append(Block("variable", [specs[i] for i in keep], vecs))
            for i in range(len(specs)):
                if whole[i]:
                    self.w_prev[i] = _exact_copy(weights[i])

    def _steps(self) -> float:
        every = self.plan.options.every
        return float(every) if isinstance(every, int) else 1.0

    def _stats(self, keep: list[int], arrays: Sequence[np.ndarray], view: str,
               merged: dict, part: str) -> np.ndarray:
        o = self.plan.options
        specs = self.plan.variables
        plain = [i for i in keep if self.shards[i] is None]
        states = dict(zip(plain, stats_np.tensor_states(
            [self._view(arrays[i]) for i in plain], sample_size=o.sample_size,
            names=[specs[i].name for i in plain]), strict=True))
        return stats_np.finalize_many(
            [states[i] if i in states else merged[i, part] for i in keep], view,
            quantiles=o.quantiles)

    def _view(self, a: np.ndarray) -> np.ndarray:
        return channels_last(a) if self.channels_first else a


def _f64(a: np.ndarray) -> np.ndarray:
    return np.array(a, dtype=np.float64)


def _exact_copy(a: np.ndarray) -> np.ndarray:
    """A copy of weights for the next point's change, in a type whose float64 difference
    is exact: float32 stays float32 (half a float64 copy's memory and traffic)."""
    a = np.asarray(a)
    return np.array(a) if a.dtype in (np.float32, np.float64) else _f64(a)
