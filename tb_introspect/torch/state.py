"""Fixed-shape statistics states of layer outputs and output gradients, on the device.

One flat float64 buffer per view holds a segment per monitored tensor (``segments``). A
training step only adds to it (device ops, no host sync); the host copies the buffer once
per logged point, reads each segment as a ``stats_np`` state (``segments.to_state``),
merges the ranks' states and finalizes them with ``stats_np``'s algebra, so every slot's
formula lives there.

Each statistics step offers a segment's sample ``k`` uniform draws from the tensor carrying
the ``k`` smallest of ``n`` uniform keys (exponential spacings; every element when
``n <= k``), and the segment keeps the ``k`` smallest keys of the union: a uniform sample of
every value folded in, whatever the batch sizes. The finite non-zero values among them give
the percentiles; the exact sign counts place each order statistic in its stratum
(``stats_np.sample_quantiles``).

The per-step sums are taken in float32 (float64 for float64 tensors) and the within-step
second moment is two-pass, so ``std`` does not cancel when ``|mean| >> std``. Counts are
integer reductions, exact (float64 holds them exactly up to 2**53).
"""

from __future__ import annotations

import math
import threading

import numpy as np
import torch

from tb_introspect.stats_np.segments import ADDITIVE_LEN, EXTREMES_LEN, Segment

_MOD = 2**31


def hash_uniform(index: torch.Tensor, seed: torch.Tensor) -> torch.Tensor:
    """Deterministic uniforms in (0, 1) from integer ``index`` and a device ``seed``: no
    generator state (the user's RNG stream stays untouched, and ``torch.compile`` sees only
    integer ops). Products stay below 2**62, inside int64."""
    h = (index * 1103515245 + seed * 12345 + 1) % _MOD
    h = h ^ (h >> 15)
    h = (h * 747796405 + 289133645) % _MOD
    h = h ^ (h >> 13)
    h = (h * 1103515245 + 12345) % _MOD
    h = h ^ (h >> 16)
    return (h.to(torch.float64) + 0.5) / _MOD


def _uniforms(arange: torch.Tensor, seed: torch.Tensor) -> torch.Tensor:
    """``[2, k]`` uniforms in [0, 1) from device ``seed`` (``k``: ``arange``'s length), by the
    integer hash: no host sync (a GPU, ``torch.compile``)."""
    return hash_uniform(arange, torch.stack([seed * 2, seed * 2 + 1])[:, None])


def _numpy_view(buf: torch.Tensor) -> np.ndarray | None:
    """``buf``'s memory as a numpy array where a fold may write its small parts there
    (an eager CPU buffer): numpy's calls on a few values cost a fraction of a kernel
    launch each. None elsewhere (a GPU, a compiled graph)."""
    if buf.device.type != "cpu" or torch.compiler.is_compiling():
        return None
    return buf.numpy()


_work = threading.local()


def scratch(like: torch.Tensor, n: int, slots: int) -> list[torch.Tensor]:
    """``slots`` flat work tensors of ``n`` elements of ``like``'s dtype, reused by every fold
    of this thread on a CPU: there a fresh tensor of a large output costs a page fault per
    page, several times the pass that fills it (a GPU's caching allocator has none, and a
    compiled graph allocates its own). They hold twice the largest output folded, until
    ``release_scratch``; the views of each size are kept (slicing costs a kernel call)."""
    if like.device.type != "cpu" or torch.compiler.is_compiling():
        return [torch.empty(n, dtype=like.dtype, device=like.device) for _ in range(slots)]
    views = getattr(_work, "views", None)
    if views is None:
        views = _work.views = {}
    got = views.get((like.dtype, n, slots))
    if got is not None:
        return got
    cache = getattr(_work, "bufs", None)
    if cache is None:
        cache = _work.bufs = {}
    whole = cache.get(like.dtype)
    if whole is None or whole.numel() < slots * n:
        whole = cache[like.dtype] = torch.empty(slots * n, dtype=like.dtype)
        views.clear()  # views of the smaller one would keep it alive
    got = views[like.dtype, n, slots] = [whole[i * n:(i + 1) * n] for i in range(slots)]
    return got


def release_scratch() -> None:
    """Free this thread's work tensors and draws (an ``Introspector`` that closes)."""
    _work.bufs, _work.views, _work.draws = {}, {}, {}


def _sum(t: torch.Tensor, big: bool) -> torch.Tensor:
    """The float64 sum of ``t`` (accumulated in float64 from 2**24 elements on: exact there
    for 0/1 and +-1 tensors, which float32 holds exactly up to 2**24)."""
    return t.sum(dtype=torch.float64) if big else t.sum().to(torch.float64)


def _finite_sum(flat: torch.Tensor, big: bool) -> float | None:
    """The float64 sum of ``flat`` when it is finite, on a CPU: then every value is (barring
    a sum that overflows, which takes the general path), and a fold skips the five passes
    that zero and count non-finite values. A GPU would have to wait for the device to
    know: there (and in a compiled graph) every fold takes the general path (None)."""
    if flat.device.type != "cpu" or torch.compiler.is_compiling():
        return None
    total = float(_sum(flat, big))
    return total if math.isfinite(total) else None


def is_finite(x: torch.Tensor) -> bool:
    """Whether every value of ``x`` is finite, from one sum (a finite sum has finite terms;
    one that overflows reads as non-finite). On a CPU only: a GPU would make the step wait
    for the device."""
    return math.isfinite(x.detach().sum(dtype=_SUM_DTYPES.get(x.dtype, torch.float32)))


#: What ``is_finite`` sums in: float32 but for float64 (a half sum would overflow).
_SUM_DTYPES = {torch.float64: torch.float64}


def _finite_nonzero(flat: torch.Tensor, finite: bool, out: torch.Tensor) -> torch.Tensor:
    """``out``: 1.0 where ``flat`` holds a finite non-zero value, else 0.0. ``finite``: the
    caller knows it holds no NaN or Inf, so no pass zeroes them."""
    if finite:
        return torch.ne(flat, 0, out=out)
    torch.nan_to_num(flat, nan=0.0, posinf=0.0, neginf=0.0, out=out)
    return out.ne_(0)


def _columns(active: torch.Tensor, seg: Segment) -> torch.Tensor:
    """The non-zero counts of every channel, then of every position, from the 0/1 float
    tensor ``active`` (summed over the batch first, in one pass: a vector-matrix product
    with ones, exact below 2**24 rows and two to four times faster than ``sum(0)`` on a
    CPU; float sums being several times faster than boolean ones; the rest runs on the
    small column tensor)."""
    if seg.rank == 0:
        return active.reshape(1).to(torch.float64)
    batch = active.shape[0]
    if batch >= 2**24:
        cols = active.sum(0, dtype=torch.float64)
    else:
        ones = torch.ones(batch, dtype=active.dtype, device=active.device)
        # mv, not matmul: autocast leaves it in the counts' float type (exact)
        cols = torch.mv(active.reshape(batch, -1).t(), ones).reshape(active.shape[1:])
    return _channels_and_positions(cols.to(torch.float64), seg)


def _channels_and_positions(cols: torch.Tensor, seg: Segment) -> torch.Tensor:
    """The per-channel, then per-position sums of ``cols``, a count per column (the
    batch summed)."""
    if seg.rank <= 2:
        return cols.reshape(-1)
    channel = cols.sum(dim=seg.channel_dims).reshape(-1)
    position = cols.sum(dim=seg.position_dims).reshape(-1)
    return torch.cat([channel, position])


class ActivityTally:
    """The lean steps' exact activity counts of one layer output, kept per column and
    added to its segment once per logged point (``settle``).

    A lean call is three kernels (zero the non-finite values, mark the non-zero ones, add
    the batch's column counts with a matrix-vector product) where ``fold`` runs about ten:
    on the small outputs of a small model their fixed cost is most of a fold (about 40
    against 130 us on a 16x16x8x8 ReLU output, one CPU thread). The columns are counted in
    the output's float type, exact below 2**24 rows: it settles before that."""

    LIMIT = 2**24

    def __init__(self) -> None:
        self.cols: torch.Tensor | None = None
        self.ones: torch.Tensor | None = None
        self.shape: tuple[int, ...] = ()
        self.rows = 0
        self.count = 0

    def accepts(self, x: torch.Tensor, seg: Segment) -> bool:
        """Whether ``add`` takes ``x`` (else ``fold`` does): eager, batched, not huge."""
        return (seg.rank >= 2 and x.shape[0] < self.LIMIT
                and not torch.compiler.is_compiling())

    def add(self, buf: torch.Tensor, seg: Segment, xf: torch.Tensor,
            finite: bool = False) -> None:
        """Count the finite non-zero values of float tensor ``xf`` per column (``finite``:
        it holds no NaN or Inf)."""
        batch, n = xf.shape[0], xf.numel()
        if self.cols is not None and (self.rows + batch > self.LIMIT
                                      or self.cols.dtype != xf.dtype
                                      or self.cols.numel() * batch != n):
            self.settle(buf, seg)
            self.cols = None
        (act,) = scratch(xf, n, 1)
        _finite_nonzero(xf.reshape(-1), finite, act)
        if self.cols is None:
            self.cols = torch.zeros(n // batch, dtype=xf.dtype, device=xf.device)
            self.shape = tuple(xf.shape[1:])
        if self.ones is None or self.ones.numel() != batch or self.ones.dtype != xf.dtype:
            self.ones = torch.ones(batch, dtype=xf.dtype, device=xf.device)
        self.cols.addmv_(act.view(batch, -1).t(), self.ones)
        self.rows += batch
        self.count += n

    def settle(self, buf: torch.Tensor, seg: Segment) -> None:
        """Add the counts so far to the segment's ``act_count`` and column counts (the same
        column order for any shape of the same widths: the channel axis does not move)."""
        if not self.count or self.cols is None:
            return
        a = seg.offset + ADDITIVE_LEN
        cols = self.cols.to(torch.float64).view(self.shape)
        buf[a:a + seg.channels + seg.positions].add_(_channels_and_positions(cols, seg))
        buf[a - 1].add_(float(self.count))
        self.cols.zero_()
        self.rows = self.count = 0


def fold(buf: torch.Tensor, seg: Segment, x: torch.Tensor, seed: torch.Tensor,
         full: bool, arange: torch.Tensor, tally: ActivityTally | None = None,
         finite: bool = False, kurtosis: bool = False) -> float | None:
    """Add tensor ``x`` to its segment of ``buf``. ``full``: every part (a statistics step);
    otherwise only the activity counts (``act_count`` and the channel/position counts of
    finite non-zero values): two elementwise passes and a column sum (one pass fewer when
    the caller knows ``x`` is ``finite``), into ``tally`` when given (the caller settles it
    before reading ``buf``).

    Every part is an elementwise float op or a float reduction (boolean reductions are
    several times slower), written into two work tensors of ``x``'s size (``scratch``):
    the non-finite values are zeroed once (``xz``) and counted by kind from ``x - xz``
    (0, NaN or +-Inf); the finite values' moments are two-pass (a sum, then the dot product
    of the deviations) over ``xz``, corrected for the zeros put in (exact algebra, no
    masking pass); with NaN or Inf present and no finite zero, ``min`` / ``max`` may read 0
    for a tensor of one sign. On a CPU a tensor whose sum is finite skips the zeroing and the
    counting by kind (``_finite_sum``, ``_fold_finite``): the same state, bit for bit, in
    about half the passes. An eager CPU fold does its small parts (the column tensor's sums,
    the sample, the scalars) in numpy on the buffer's memory (``_numpy_view``): a fold of a small
    output is mostly the fixed cost of its calls, several times numpy's for a torch op."""
    o, c, p = seg.offset, seg.channels, seg.positions
    xf = x.detach()
    if xf.dtype != torch.float64:
        xf = xf.float()
    a = o + ADDITIVE_LEN
    n = xf.numel()
    if n == 0:  # adds nothing (and aminmax has no identity)
        return None
    big = n >= 2**24
    flat = xf.reshape(-1)
    if not full:
        if tally is not None and tally.accepts(xf, seg):
            tally.add(buf, seg, xf, finite)
            return None
        (act,) = scratch(flat, n, 1)
        active = _finite_nonzero(flat, finite, act)
        buf[a:a + c + p].add_(_columns(active.view(xf.shape), seg))
        buf[a - 1].add_(float(n))
        return None
    xz, work = scratch(flat, n, 2)
    host = _numpy_view(buf)
    total = _finite_sum(flat, big) if host is not None else None
    if total is not None:
        return _fold_finite(host, seg, xf, flat, total, work, int(seed), kurtosis)
    torch.nan_to_num(flat, nan=0.0, posinf=0.0, neginf=0.0, out=xz)
    total = _sum(xz, big)
    sign = torch.sign(xz, out=work)
    balance = _sum(sign, big)  # positives - negatives
    mn, mx = torch.aminmax(xz)
    if host is not None:
        cols = torch.from_numpy(_host_columns(sign.abs_().view(xf.shape), seg))
        _host_sample(host, seg, xz.numpy(), int(seed), host[o] == 0)
    else:
        cols = _columns(sign.abs_().view(xf.shape), seg)
        _merge_sample(buf, seg, xz, seed, arange)
    nnz = cols[:c].sum()
    mean_z = total / n
    ext = torch.stack([mn.to(torch.float64), -mx.to(torch.float64)])
    # x - xz: 0 where x is finite, NaN, +Inf or -Inf where it is not
    kinds = torch.sub(flat, xz, out=work)
    dev = xz.sub_(mean_z.to(xz.dtype))
    m2_z = torch.dot(dev, dev).to(torch.float64)  # sum over all n of (xz - mean_z)^2
    inf = torch.nan_to_num(kinds, nan=0.0, posinf=1.0, neginf=-1.0, out=dev)
    inf_balance = _sum(inf, big)  # +Inf count - -Inf count
    # +Inf count + -Inf count: a dot product of +-1/0 values is an exact integer below
    # 2**24
    infs = _sum(inf.abs_(), big) if big else torch.dot(inf, inf).to(torch.float64)
    nan = _sum(kinds.nan_to_num_(nan=1.0, posinf=0.0, neginf=0.0), big)
    posinf, neginf = (infs + inf_balance) / 2, (infs - inf_balance) / 2
    bad = nan + infs
    nfin = n - bad
    mean = total / nfin.clamp(min=1)
    # sum over the finite values of (x - mean)^2, from the zeroed tensor's moments
    m2 = (m2_z + n * (mean_z - mean) ** 2 - bad * mean * mean).clamp(min=0)
    full_n = torch.full((), float(n), dtype=torch.float64, device=xf.device)
    parts = torch.stack([
        full_n, nan, posinf, neginf,
        (nnz + balance) / 2, (nnz - balance) / 2, total, m2, nfin * mean * mean, full_n,
    ])
    buf[o:a + c + p].add_(torch.cat([parts, cols]))
    e = seg.extremes_at
    buf[e:e + EXTREMES_LEN] = torch.minimum(buf[e:e + EXTREMES_LEN], ext)
    return None


def _fold_finite(host: np.ndarray, seg: Segment, xf: torch.Tensor, flat: torch.Tensor,
                 total: float, work: torch.Tensor, seed: int,
                 kurtosis: bool = False) -> float | None:
    """``fold``'s statistics fold of a CPU tensor of finite ``total`` (so every value is
    finite): five passes over it (its sum, its signs, their sum, its extremes, the deviations'
    dot product) and the column counts, the rest in numpy on the buffer's memory ``host``.
    The state is the general path's, bit for bit. ``kurtosis``: ``fold``'s."""
    o, c, p, n = seg.offset, seg.channels, seg.positions, flat.numel()
    a = o + ADDITIVE_LEN
    fresh = host[o] == 0  # no statistics fold since the reset: the sample is empty
    sign = torch.sign(flat, out=work)
    bal = float(_sum(sign, n >= 2**24))  # positives - negatives
    mn, mx = torch.aminmax(flat)
    counts = _host_columns(sign.abs_().view(xf.shape), seg)
    _host_sample(host, seg, flat.numpy(), seed, fresh)
    mean = total / n
    dev = torch.sub(flat, mean, out=work)
    m2 = float(torch.dot(dev, dev))
    nz = float(counts[:c].sum())
    host[o:a] += (n, 0.0, 0.0, 0.0, (nz + bal) / 2, (nz - bal) / 2, total, m2,
                  n * mean * mean, n)
    host[a:a + c + p] += counts
    e = seg.extremes_at
    host[e] = min(host[e], float(mn))
    host[e + 1] = min(host[e + 1], -float(mx))
    return deviation_kurtosis(dev, m2) if kurtosis else None


def deviation_kurtosis(dev: torch.Tensor, m2: float | None = None) -> float:
    """The kurtosis m4 / m2² of a CPU tensor from its deviations from the mean ``dev``
    (squared in place), ``m2`` their sum of squares when known; NaN for a constant one."""
    n = dev.numel()
    m2 = (float(torch.dot(dev, dev)) if m2 is None else m2) / n
    squares = dev.square_()
    m4 = float(torch.dot(squares, squares)) / n
    return m4 / (m2 * m2) if m2 * m2 > 0 else math.nan


def _merge_sample(buf: torch.Tensor, seg: Segment, flat: torch.Tensor, seed: torch.Tensor,
                  arange: torch.Tensor) -> None:
    k, n = seg.k, flat.numel()
    if n == 0:
        return
    if n <= k:  # every element, each with its own uniform key
        keys = torch.full((k,), math.inf, dtype=torch.float64, device=flat.device)
        keys[:n] = _uniforms(arange, seed)[0, :n]
        vals = torch.zeros(k, dtype=torch.float64, device=flat.device)
        vals[:n] = flat.to(torch.float64)
    else:  # k uniform positions carrying the k smallest of n uniform keys
        keys, pos = _draws(arange, seed, n)
        vals = flat[pos].to(torch.float64)
    held = buf[seg.sample_at:seg.sample_at + 2 * k].view(2, k)  # keys, then values
    both = torch.cat([held, torch.stack([keys, vals])], 1)
    keep = torch.topk(both[0], k, largest=False, sorted=False).indices
    held.copy_(both[:, keep])


def _draws(arange: torch.Tensor, seed: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` smallest of ``n`` uniform keys (exponential spacings) and ``k`` uniform
    positions in ``[0, n)`` (``k``: ``arange``'s length), by the integer hash."""
    u_key, u_pos = _uniforms(arange, seed)
    return torch.cumsum(-torch.log(u_key), 0) / (n + 1), (u_pos * n).long().clamp_(max=n - 1)


def _host_columns(active: torch.Tensor, seg: Segment) -> np.ndarray:
    """``_columns`` of a CPU tensor, the sums over the small column tensor in numpy."""
    if seg.rank == 0:
        return active.reshape(1).numpy().astype(np.float64)
    batch = active.shape[0]
    if batch >= 2**24:
        cols = active.sum(0, dtype=torch.float64).numpy()
    else:
        ones = getattr(_work, "ones", None)
        if ones is None or ones.numel() != batch or ones.dtype != active.dtype:
            ones = _work.ones = torch.ones(batch, dtype=active.dtype)
        cols = torch.mv(active.reshape(batch, -1).t(), ones).numpy().astype(np.float64)
    if seg.rank <= 2:
        return cols
    cols = cols.reshape(active.shape[1:])
    return np.concatenate([cols.sum(axis=seg.channel_dims).reshape(-1),
                           cols.sum(axis=seg.position_dims).reshape(-1)])


#: Draws of each kind one block holds (``_host_draws``): 32 folds' of the default sample
#: (2048), 1 MiB in all.
DRAW_BLOCK = 2**16


def _host_draws(seed: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Fold ``seed``'s ``k`` cumulated exponential spacings and ``k`` uniforms in [0, 1):
    a row of the block of ``DRAW_BLOCK // k`` consecutive seeds, drawn by numpy's
    generator seeded with the block's number (the tool's own: the user's RNG streams stay
    untouched) in one call each, a function of ``seed`` alone."""
    rows = max(1, DRAW_BLOCK // k)
    block, row = divmod(seed, rows)
    blocks = getattr(_work, "draws", None)
    if blocks is None:
        blocks = _work.draws = {}
    got = blocks.get((block, k))
    if got is None:
        if len(blocks) >= 4:  # several Introspectors in turn keep theirs
            blocks.clear()
        rng = np.random.default_rng([block % 2**63, k])
        got = blocks[block, k] = (np.cumsum(rng.standard_exponential((rows, k)), 1),
                                  rng.random((rows, k)))
    return got[0][row], got[1][row]


def _host_sample(host: np.ndarray, seg: Segment, flat: np.ndarray, seed: int,
                 fresh: bool) -> None:
    """``_merge_sample`` of an eager CPU fold, in numpy on the buffer's memory ``host``
    (``_host_draws``): a fifth of the torch kernels' time. ``fresh``: the segment's sample
    is empty, so the draws are written, not merged."""
    k, n = seg.k, flat.size
    spacings, uniforms = _host_draws(seed, k)
    if n <= k:  # every element, each with its own uniform key
        keys, vals = uniforms[:n], flat
    else:  # k uniform positions carrying the k smallest of n uniform keys
        keys = spacings / (n + 1)
        pos = np.multiply(uniforms, n).astype(np.int64)
        vals = flat[np.minimum(pos, n - 1, out=pos)]
    s = seg.sample_at
    if not fresh:  # the k smallest keys of the held sample and the draws
        held = host[s:s + 2 * k]
        keys = np.concatenate([held[:k], keys])
        vals = np.concatenate([held[k:], vals])
        keep = np.argpartition(keys, k - 1)[:k]
        keys, vals = keys[keep], vals[keep]
    host[s:s + keys.size] = keys
    host[s + k:s + k + vals.size] = vals
