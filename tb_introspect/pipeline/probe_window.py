"""The one contract of the transformer probes (docs/format.md, "Version 4: probes"): the
window state both front-ends fold their statistics steps into, its reduction over replicas
or ranks into a point's values, and the numpy reference of every number they compute.

The Keras front-end (``keras/probes.py``, in the traced step) and the PyTorch one
(``torch/probes.py``, in hooks) compute the numbers in their framework and fold them into
the state on the device, with no host copy per step; a logged point copies each replica's
or rank's state to the host once and hands them all to ``combine``. Each front-end's tests
hold its numbers to the references here, and ``tests/stats/test_probe_parity.py`` holds the
two front-ends to each other on one model.

**State** (``empty``): per row ``WIDTH`` float64 columns: for each of ``MEANS`` the sum of
the window's values then their count (``SUM[f]``, ``COUNT[f] == SUM[f] + 1``), then for each
of ``MAXIMA`` the window's running maximum (``PEAK[f]``; -inf: no value yet).

**Non-finite values**: a mean leaves a non-finite value out (neither summed nor counted: the
mean of the finite ones, NaN where none). A maximum keeps +inf (a real peak: the PROBES
matrix carries it, ``summary_pb.probes_matrix`` clips only finite values to float32's range)
and a NaN makes the window's maximum NaN (a NaN step stays visible, whatever the other
steps' peaks); -inf is no value (NaN at the point).

**Replicas and ranks** (``combine``): every replica's (Keras) or rank's (PyTorch, in the
point's one exchange between ranks) state: a mean over all their counted values, a maximum
over them all (NaN if any is NaN). The rows a point holds are the writing rank's.

**The numbers** (the references below): ``abs_median``, the lower median of the finite |a|
of a sample of a layer output (every value up to ``SAMPLE_SIZE`` values; the sample of a
larger output is each front-end's own draw); ``kurtosis``, m4 / m2² of every value;
``attention_logit_max``, the largest |pre-softmax logit| at the query rows ``query_rows``
picks, against every key, of the first ``batch_elements`` batch elements; ``head_logits``,
the head's largest logit and the mean over rows of the logits' logsumexp.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tb_introspect import slots

VALUE_FIELDS: tuple[str, ...] = slots.PROBE_VALUE_FIELDS
#: The probes averaged over the window's statistics steps (a sum and a count each).
MEANS: tuple[str, ...] = ("abs_median", "kurtosis", "logit_lse")
#: The probes whose window value is the largest of its statistics steps'.
MAXIMA: tuple[str, ...] = ("attn_logit_max", "logit_max")
#: Columns of a row of the state.
WIDTH = 2 * len(MEANS) + len(MAXIMA)
#: Column of each averaged probe's sum; its count is the next column.
SUM: dict[str, int] = {f: 2 * i for i, f in enumerate(MEANS)}
COUNT: dict[str, int] = {f: 2 * i + 1 for i, f in enumerate(MEANS)}
#: Column of each maximum.
PEAK: dict[str, int] = {f: 2 * len(MEANS) + i for i, f in enumerate(MAXIMA)}
#: The first maximum's column: ``state[:, :MAXIMA_AT]`` adds, ``state[:, MAXIMA_AT:]`` takes
#: the larger.
MAXIMA_AT = 2 * len(MEANS)

#: At most this many values of a layer output give ``abs_median`` (every value up to it).
SAMPLE_SIZE = slots.PROBE_SAMPLE_SIZE
#: At most this many query rows of an attention call give its ``attn_logit_max``.
QUERY_ROWS = 64
#: At most about this many logits of an attention call are made: fewer batch elements past
#: it (``batch_elements``).
LOGIT_BUDGET = 2**22
#: An additive (float) attention mask's value at or below this excludes its position
#: (``-inf``, ``finfo.min``), as a boolean mask's False does.
MASKED = -1e30

assert set(MEANS) | set(MAXIMA) == set(VALUE_FIELDS) and not set(MEANS) & set(MAXIMA)


# ------------------------------------------------------------------ the state


def empty(rows: int) -> np.ndarray:
    """The state of ``rows`` rows with no value: ``[rows, WIDTH]`` float64, sums and counts
    0, maxima -inf."""
    state = np.zeros((rows, WIDTH))
    state[:, MAXIMA_AT:] = -np.inf
    return state


def fold(state: np.ndarray, row: int, field: str, value: float) -> None:
    """Fold one value of ``field`` into ``state[row]``, in place: the reference of what the
    front-ends' device folds do (a non-finite value left out of a mean; a NaN maximum
    stays NaN)."""
    value = float(value)
    if field in SUM:
        if np.isfinite(value):
            state[row, SUM[field]] += value
            state[row, COUNT[field]] += 1.0
        return
    col = PEAK[field]
    old = state[row, col]
    state[row, col] = np.nan if np.isnan(old) or np.isnan(value) else max(old, value)


def merge(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """One window's state of two (``[rows, WIDTH]`` each, one rank's): their sums and
    counts added, each maximum the larger (NaN if either is NaN)."""
    out = np.array(a, dtype=np.float64)
    out[:, :MAXIMA_AT] += b[:, :MAXIMA_AT]
    out[:, MAXIMA_AT:] = np.maximum(out[:, MAXIMA_AT:], b[:, MAXIMA_AT:])
    return out


def combine(states: np.ndarray | Sequence[np.ndarray],
            rows: Sequence[str]) -> dict[str, np.ndarray]:
    """A point's probes from every replica's or rank's window state (``[rows, WIDTH]`` each,
    or one ``[replicas, rows, WIDTH]`` array; ``rows``: the rows' names in order): row name
    -> its ``VALUE_FIELDS`` values. A mean: the sum over replicas over their count, NaN
    where nothing counted; a maximum: the largest, NaN if any replica's is NaN, +inf kept,
    NaN where none (-inf)."""
    stacked = np.asarray(states, dtype=np.float64)
    if stacked.ndim == 2:
        stacked = stacked[np.newaxis]
    if stacked.shape[1:] != (len(rows), WIDTH):
        raise ValueError(f"probe states of shape {stacked.shape[1:]}, expected"
                         f" ({len(rows)}, {WIDTH})")
    sums = stacked[:, :, :MAXIMA_AT].sum(axis=0)
    table = np.full((len(rows), len(VALUE_FIELDS)), np.nan)
    for j, field in enumerate(VALUE_FIELDS):
        if field in SUM:
            count = sums[:, COUNT[field]]
            with np.errstate(invalid="ignore", divide="ignore"):
                table[:, j] = np.where(count > 0, sums[:, SUM[field]] / count, np.nan)
        else:
            highest = stacked[:, :, PEAK[field]].max(axis=0)  # NaN if any replica's is
            table[:, j] = np.where(np.isneginf(highest), np.nan, highest)
    return {name: table[i] for i, name in enumerate(rows)}


# ------------------------------------------------------------------ the numbers


def abs_median(values: np.ndarray) -> float:
    """The lower median of the finite ``|values|`` (of an even count the smaller middle
    value: ``torch.nanmedian``'s, with ±inf left out as NaN is); NaN where none is finite.
    A front-end takes it of a sample of at most ``SAMPLE_SIZE`` values."""
    a = np.abs(np.asarray(values).reshape(-1))
    a = a[np.isfinite(a)]
    if not a.size:
        return float("nan")
    j = (a.size - 1) // 2
    return float(np.partition(a, j)[j])


def kurtosis(values: np.ndarray) -> float:
    """m4 / m2² of every value (central moments; 3 for a Gaussian, not excess); NaN for a
    constant tensor or one with a non-finite value."""
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    if not x.size or not np.isfinite(x).all():
        return float("nan")
    d = x - x.mean()
    m2 = np.mean(d * d)
    if not m2 > 0:
        return float("nan")
    z = d / np.sqrt(m2)  # standardised first: d**4 of a large d overflows
    return float(np.mean(z**4))


def query_rows(length: int, rows: int = QUERY_ROWS) -> np.ndarray:
    """The query rows an attention call of ``length`` queries is probed at: all of them up
    to ``rows``, else ``rows`` evenly spread from the first to the last. One integer rule
    either front-end computes as it is, for a static or a traced length:
    ``arange(n) * (length - 1) // max(n - 1, 1)`` with ``n = min(length, rows)``."""
    n = min(int(length), int(rows))
    return np.arange(n, dtype=np.int64) * (int(length) - 1) // max(n - 1, 1)


def batch_elements(per_element: int, budget: int = LOGIT_BUDGET) -> int:
    """How many elements of the first batch dimension an attention call's logits are made
    for: at least one, and as many as keep ``per_element`` (heads x query rows x keys)
    logits each within ``budget``."""
    return max(1, int(budget) // max(1, int(per_element)))


def attention_logit_max(q: np.ndarray, k: np.ndarray, keep: np.ndarray | None = None,
                        bias: np.ndarray | None = None, scale: float | None = None) -> float:
    """The largest |pre-softmax logit| ``scale * q·k (+ bias)`` of an attention call (the
    reference: float64). ``q``: ``(..., L, E)``, ``k``: ``(..., S, E)``; ``keep``: a boolean
    mask broadcastable to ``(..., L, S)`` (True: attended), ``bias``: an additive float
    mask (a value at or below ``MASKED`` excludes its position); ``scale``: default
    ``1 / sqrt(E)``. Over ``query_rows(L)``, every key and the first ``batch_elements``
    elements of the first axis; an excluded position counts 0."""
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    length, width = q.shape[-2:]
    keys = k.shape[-2]
    scale = 1.0 / np.sqrt(width) if scale is None else float(scale)
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    r = query_rows(length)
    logits = q @ np.swapaxes(k, -1, -2) * scale
    shape = (*lead, length, keys)
    logits = np.broadcast_to(logits, shape)
    kept = np.ones(shape, bool) if keep is None else np.broadcast_to(keep, shape)
    if bias is not None:
        bias = np.broadcast_to(np.asarray(bias, np.float64), shape)
        kept = kept & (bias > MASKED)
        logits = logits + np.where(bias > MASKED, bias, 0.0)
    a = np.where(kept, np.abs(logits), 0.0)
    a = a[..., r, :]
    if len(lead):
        a = a[:batch_elements(int(np.prod(lead[1:], dtype=np.int64)) * len(r) * keys)]
    return float(a.max()) if a.size else 0.0


def head_logits(logits: np.ndarray) -> tuple[float, float]:
    """The output head's ``(logit_max, logit_lse)``: its largest logit, and the mean over
    rows (every axis but the last) of the logsumexp over the last axis."""
    z = np.asarray(logits, dtype=np.float64)
    z = z.reshape(-1, z.shape[-1]) if z.ndim > 1 else z.reshape(1, -1)
    top = z.max(axis=1, keepdims=True)
    lse = top[:, 0] + np.log(np.exp(z - top).sum(axis=1))
    return float(z.max()), float(lse.mean())

