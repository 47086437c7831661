"""Builders of synthetic ``RunSeries`` for the findings unit tests (no TensorFlow, no disk)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tb_introspect import metadata, slots
from tb_introspect.read.provider import KIND_METRIC, KIND_METRIC_EPOCH, KIND_TENSOR_STATS
from tb_introspect.read.series import RunSeries, Series, TagInfo

Q = slots.DEFAULT_QUANTILES


def tensor(
    view: str,
    layer: str,
    depth: int,
    steps: Sequence[int],
    *,
    name: str | None = None,
    shape: Sequence[int] = (8, 8),
    cadence: str = "epoch",
    epochs: Sequence[float] | None = None,
    **fields,
) -> Series:
    """A TENSOR_STATS series; ``fields`` are scalars or per-point sequences.

    Unset fields are NaN except the non-finite counts (0), ``count`` and, for
    ``q<p>`` fields, nothing: pass ``quantile_values=[...]`` (9 values or a
    list of per-point 9-value rows) to set the percentile slots.
    """
    name = name or f"{layer}/kernel"
    names = slots.tensor_stats_fields(view, Q)
    n = len(steps)
    values = np.full((n, len(names)), np.nan)
    col = {f: i for i, f in enumerate(names)}
    values[:, col["epoch"]] = np.arange(n) if epochs is None else epochs
    for f in ("nan_count", "posinf_count", "neginf_count"):
        values[:, col[f]] = 0
    values[:, col["count"]] = float(np.prod(shape))
    qv = fields.pop("quantile_values", None)
    if qv is not None:
        qv = np.broadcast_to(np.asarray(qv, dtype=np.float64), (n, len(Q)))
        for k, q in enumerate(Q):
            values[:, col[slots.quantile_field(q)]] = qv[:, k]
        values[:, col["min"]] = qv[:, 0]
        values[:, col["max"]] = qv[:, -1]
    for f, v in fields.items():
        values[:, col[f]] = v
    info = TagInfo(
        tag=metadata.stats_tag(view, name), kind=KIND_TENSOR_STATS, version=1, name=name,
        fields=names, view=view, layer=layer, depth=depth, shape=tuple(shape),
        cadence=cadence, quantiles=Q,
    )
    return Series(info, np.asarray(steps, dtype=np.int64), np.zeros(n), values)


def metric(name: str, steps: Sequence[int], values: Sequence[float],
           epochs: Sequence[float] | None = None) -> Series:
    """A per-step METRIC series."""
    n = len(steps)
    v = np.column_stack([np.zeros(n) if epochs is None else epochs, values]).astype(np.float64)
    info = TagInfo(tag=metadata.metric_tag(name), kind=KIND_METRIC, version=1, name=name,
                   fields=slots.METRIC_FIELDS)
    return Series(info, np.asarray(steps, dtype=np.int64), np.zeros(n), v)


def metric_epoch(name: str, steps: Sequence[int], medians: Sequence[float],
                 loss: str = "") -> Series:
    """A METRIC_EPOCH band whose quartiles sit +-10% around ``medians``; ``loss``: the
    loss's description (``loss_field.loss_json``) its metadata carries."""
    m = np.asarray(medians, dtype=np.float64)
    n = m.size
    v = np.column_stack([np.arange(n), 0.5 * m, 0.9 * m, m, 1.1 * m, 2 * m, m, np.full(n, 10)])
    info = TagInfo(tag=metadata.metric_tag(name, per_epoch=True), kind=KIND_METRIC_EPOCH,
                   version=1, name=name, fields=slots.METRIC_EPOCH_FIELDS, loss=loss)
    return Series(info, np.asarray(steps, dtype=np.int64), np.zeros(n), v)


def run(*series: Series, name: str = "run") -> RunSeries:
    """Assemble series into a RunSeries (tensors by view in depth order, metrics by name)."""
    r = RunSeries(run=name, format_version=1)
    for s in series:
        if s.info.kind == KIND_TENSOR_STATS:
            r.tensors.setdefault(s.info.view, []).append(s)
        elif s.info.kind == KIND_METRIC:
            r.metrics[s.info.name] = s
        else:
            r.metric_epochs[s.info.name] = s
    for v in r.tensors.values():
        v.sort(key=lambda s: s.info.sort_key())
    return r


def epochs_steps(n: int, per_epoch: int = 10) -> list[int]:
    """Logged steps of ``n`` per-epoch points with ``per_epoch`` steps each."""
    return [per_epoch * (i + 1) for i in range(n)]


def kinds(findings) -> dict[str, str]:
    """``{kind: severity}`` of a findings list."""
    return {f.kind: f.severity for f in findings}
