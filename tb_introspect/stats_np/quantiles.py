"""Percentiles from a sample and the exact sign and zero counts (``sample_quantiles``), with
the order statistics of many rows at once (``Sorted``), as ``tb_introspect.stats.quantiles``
takes them in TensorFlow."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

#: From this many values a partition at the wanted order statistics may beat a sort; below
#: it numpy 2's vectorised sort always wins (``benchmarks/stats_bench.py`` times both).
PARTITION_FROM = 2**16
#: Whether arrays of ``PARTITION_FROM`` values or more are partitioned instead of sorted:
#: None until the first such array, then what timing both once on this CPU chose. It
#: depends on the CPU: with AVX-512 the sort made one tensor's statistics 2-2.5 times faster
#: than the partition from 10**4 to 2**18 values, on an AVX2 machine the partition won from
#: 2**16 on (``benchmarks/stats_bench.py --numpy-only``).
PARTITION: bool | None = None


def partition_wins() -> bool:
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


class Sorted:
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
            elif partition_wins():
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

    def magnitudes(self) -> Sorted:
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


class _Magnitudes(Sorted):
    """The absolute values of a ``Sorted``'s rows of finite non-zero values, in order.
    A group of small rows is sorted again by magnitude (``SORT_MAGNITUDES_UP_TO``); a larger
    one is not (a second sort cost a point as much as the first): a sorted row's
    magnitudes are two sorted runs, the negatives read backwards and the positives, so each
    wanted one is found by a binary search for how many of the smallest come from the
    negatives, for every row and rank at once (the engine's ``order_statistics``). A row
    partitioned instead of sorted is partitioned again by magnitude."""

    def __init__(self, values: Sorted) -> None:
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
    rows = Sorted(samples)
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
