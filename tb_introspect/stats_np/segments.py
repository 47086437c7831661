"""Where each tensor's statistics state lives in its view's flat float64 buffer (a
``Segment``), and the host side of a segment: its ``stats_np`` state (``to_state``), the
ranks' segments merged, its finalized vector. The device folds that fill segments are the
front-ends' (``torch/state.py``, ``jax/fold.py``); this layout and its reading are shared.

A segment of a tensor with ``C`` channels, ``P`` spatial positions and sample size ``k``:

* additive part (summed over steps and calls): ``ADDITIVE_SLOTS`` counts and sums, then the
  non-zero count of each channel and of each position;
* extremes (merged with a minimum): ``min`` and ``-max``;
* the bottom-``k`` sample: ``k`` keys then ``k`` values (``state.fold`` says how a step
  offers its draws).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tb_introspect.stats_np import state as stats_np
from tb_introspect.stats_np.vector import finalize as finalize_state

#: The additive scalars of a segment, in order: the element count, the non-finite counts,
#: the finite values' sign counts and sum, ``m2`` (each fold's sum of squared deviations
#: from its own mean), ``count_mean_squared`` (each fold's finite count times its mean
#: squared: with ``sum`` it gives the spread between the folds' means, ``to_state``) and
#: ``act_count`` (the elements the activity counts are over).
ADDITIVE_SLOTS = ("count", "nan", "posinf", "neginf", "pos", "neg", "sum", "m2",
                  "count_mean_squared", "act_count")
#: The slots merged with a minimum.
EXTREME_SLOTS = ("min", "neg_max")
ADDITIVE_LEN = len(ADDITIVE_SLOTS)
EXTREMES_LEN = len(EXTREME_SLOTS)


@dataclass
class Segment:
    """Where one tensor's state lives in its view's buffer, and what its axes are."""

    channels: int
    positions: int
    k: int
    offset: int = 0
    channel_dims: tuple[int, ...] = ()   # dims reduced for the per-channel counts
    position_dims: tuple[int, ...] = ()  # dims reduced for the per-position counts
    rank: int = 2

    @property
    def length(self) -> int:
        return ADDITIVE_LEN + self.channels + self.positions + EXTREMES_LEN + 2 * self.k

    @property
    def extremes_at(self) -> int:
        return self.offset + ADDITIVE_LEN + self.channels + self.positions

    @property
    def sample_at(self) -> int:
        return self.extremes_at + EXTREMES_LEN

    def empty(self) -> np.ndarray:
        """The segment holding nothing (extremes and sample keys infinite)."""
        seg = np.zeros(self.length)
        e = ADDITIVE_LEN + self.channels + self.positions
        seg[e:e + EXTREMES_LEN] = math.inf
        seg[e + EXTREMES_LEN:e + EXTREMES_LEN + self.k] = math.inf
        return seg


def layout(shape: Sequence[int], channels_first: bool, k: int) -> Segment:
    """The segment of a tensor of ``shape`` (batch first). Rank <= 1: one channel; rank 2:
    ``(batch, features)``; rank >= 3: ``(batch, C, *spatial)`` when ``channels_first``
    (PyTorch's convolution layout) else ``(batch, *spatial, C)``.

    The counts are taken per column (every position and channel, summed over the batch);
    ``channel_dims`` / ``position_dims`` are the column axes summed for the per-channel and
    the per-position counts."""
    rank = len(shape)
    channels, positions = widths(shape, channels_first)
    if rank <= 2:
        return Segment(channels, 0, k, rank=rank)
    c_axis = 0 if channels_first else rank - 2  # in the column tensor (batch summed)
    return Segment(channels, positions, k, rank=rank,
                   channel_dims=tuple(d for d in range(rank - 1) if d != c_axis),
                   position_dims=(c_axis,))


def widths(shape: Sequence[int], channels_first: bool) -> tuple[int, int]:
    """(channels, positions) of a tensor of ``shape``, as ``layout`` reads it (plain
    integer arithmetic: ``torch.compile`` traces it without a graph break)."""
    rank = len(shape)
    if rank <= 1:
        return 1, 0
    if rank == 2:
        return int(shape[1]), 0
    c_axis = 1 if channels_first else rank - 1
    positions = 1
    for d in range(1, rank):
        if d != c_axis:
            positions *= int(shape[d])
    return int(shape[c_axis]), positions


def channels_last_shape(shape: Sequence[int], channels_first: bool) -> tuple[int, ...]:
    """``shape`` with the channel axis last and the batch unknown (-1), as the format's
    metadata describes a layer output (the plugin reads spatial axes as ``shape[1:-1]``)."""
    shape = [int(d) for d in shape]
    if len(shape) >= 3 and channels_first:
        shape = [shape[0], *shape[2:], shape[1]]
    return tuple([-1, *shape[1:]]) if shape else ()


def to_state(segment: np.ndarray, seg: Segment, activity_rates: bool = True) -> stats_np.State:
    """The ``stats_np`` state of one segment.

    ``activity_rates``: the per-unit counts are over every counted step (lean steps add
    only them, the output view); their elements are the counted ones less the statistics
    steps' non-finite values (a lean step's are zeros, not activity). Otherwise they are
    over the finite values of the statistics steps, which is the same for a segment of full
    folds only (the output-gradient view)."""
    v = dict(zip(ADDITIVE_SLOTS, segment[:ADDITIVE_LEN], strict=True))
    c, p = seg.channels, seg.positions
    a = ADDITIVE_LEN + c + p
    vmin, vmax = segment[a], -segment[a + 1]
    s, k = a + EXTREMES_LEN, seg.k
    keys, values = segment[s:s + k], segment[s + k:s + 2 * k]
    taken = np.isfinite(keys)  # empty slots have infinite keys; zeros stay as placeholders
    keys, values = keys[taken], values[taken]
    sample = values[np.isfinite(values) & (values != 0)]
    nfin = v["count"] - v["nan"] - v["posinf"] - v["neginf"]
    st = stats_np.empty_state(sample_size=k)
    st.update(
        count=v["count"], finite_count=nfin, posinf_count=v["posinf"],
        neginf_count=v["neginf"], pos_count=v["pos"], neg_count=v["neg"],
        activity_count=v["act_count"] - (v["count"] - nfin) if activity_rates else nfin,
        channel_nnz=segment[ADDITIVE_LEN:ADDITIVE_LEN + c],
        spatial_nnz=segment[ADDITIVE_LEN + c:a],
        channels=np.float64(c), positions=np.float64(p),
        # the smallest non-zero magnitude: exact while the sample holds every non-zero
        # value, otherwise at or above the true one (the Keras side's rule)
        min_abs=np.abs(sample).min() if sample.size else np.float64(np.inf),
        sample_keys=keys, sample_values=values,
    )
    if nfin <= 0:
        return st
    if v["pos"] + v["neg"] == nfin and sample.size:
        # A fold zeroes non-finite values before its min / max, so with no finite zero an
        # extreme that reads 0 is one of them: the sample bounds the true one (exactly while
        # it holds every value).
        if vmin == 0:
            vmin = sample.min()
        if vmax == 0:
            vmax = sample.max()
    mean = v["sum"] / nfin
    # The segment sums each step's two-pass m2 and n * mean**2; what they leave over the
    # merged mean is the spread between steps.
    between = max(v["count_mean_squared"] - nfin * mean * mean, 0.0)
    f = 2.0 ** -stats_np.scale_exponent(vmin, vmax)
    with np.errstate(over="ignore"):  # a device sum that overflowed stays infinite
        m2 = (v["m2"] + between) * f * f
    st.update(mean=np.float64(mean), m2=np.float64(m2), min=np.float64(vmin),
              max=np.float64(vmax))
    return st


def from_state(st: stats_np.State, seg: Segment) -> np.ndarray:
    """The segment of a state of ``to_state`` (``activity_rates=True``), as one step that
    folded everything: its m2 is the state's whole spread, so ``to_state`` reads it back."""
    out = np.zeros(seg.length)
    nfin = float(st["finite_count"])
    count = float(st["count"])
    total = float(st["mean"]) * nfin
    mean = total / nfin if nfin else 0.0
    f = 2.0 ** stats_np.state_exp(st)
    with np.errstate(over="ignore"):
        m2 = float(st["m2"]) * f * f
    out[:ADDITIVE_LEN] = [
        count, count - nfin - st["posinf_count"] - st["neginf_count"], st["posinf_count"],
        st["neginf_count"], st["pos_count"], st["neg_count"], total, m2,
        # the same expression to_state subtracts: nothing is left between steps
        nfin * mean * mean, st["activity_count"] + (count - nfin),
    ]
    c, p = seg.channels, seg.positions
    out[ADDITIVE_LEN:ADDITIVE_LEN + c] = st["channel_nnz"]
    out[ADDITIVE_LEN + c:ADDITIVE_LEN + c + p] = st["spatial_nnz"]
    e, k = seg.extremes_at - seg.offset, seg.k
    out[e:e + EXTREMES_LEN] = st["min"], -st["max"]
    keys, values = st["sample_keys"], st["sample_values"]
    out[e + EXTREMES_LEN:e + EXTREMES_LEN + k] = np.inf
    out[e + EXTREMES_LEN:e + EXTREMES_LEN + keys.size] = keys
    out[e + EXTREMES_LEN + k:e + EXTREMES_LEN + k + values.size] = values
    return out


def merge_ranks(segs: np.ndarray, seg: Segment) -> np.ndarray:
    """One segment from the segments ``[ranks, length]`` of every rank (``stats_np``'s merge
    of their states)."""
    if segs.shape[0] == 1:
        return segs[0]
    st = to_state(segs[0], seg)
    for other in segs[1:]:
        st = stats_np.merge_states(st, to_state(other, seg))
    return from_state(st, seg)


def finalize(segment: np.ndarray, seg: Segment, view: str,
             quantiles: Sequence[float], activity_rates: bool) -> np.ndarray:
    """The packed vector of one merged segment (``epoch`` and extra slots NaN): ``stats_np``'s
    ``finalize`` of its state (``to_state``, which says what ``activity_rates`` does)."""
    return finalize_state(to_state(segment, seg, activity_rates), view, quantiles=quantiles)
