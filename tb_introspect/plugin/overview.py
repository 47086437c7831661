"""The run overview, computed from a :class:`~tb_introspect.read.series.RunSeries`.

Everything is vectorised over the (tensors x steps) matrices of
:func:`tb_introspect.read.series.align`, so a run with hundreds of tensors and
thousands of steps takes milliseconds; the findings come from
``tb_introspect.diagnose``. The JSON shape is documented in
``docs/http_api.md`` (route ``./overview``); the whole path from the training
step to the chart in ``docs/design.md``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from tb_introspect import diagnose, slots, summary_pb
from tb_introspect.read.json_values import int_list, num_list
from tb_introspect.read.series import Aligned, RunSeries, Series, align

logger = logging.getLogger(__name__)

#: Percentiles (over tensors) of the per-tensor RMS drawn as model-level bands.
RMS_QUANTILES: tuple[float, ...] = slots.DEFAULT_QUANTILES
DEFAULT_MAX_POINTS = 2000
#: Percentiles (over layers) of the per-layer median implicit learning rate.
ILR_BAND_QUANTILES: tuple[float, ...] = (0.0, 25.0, 50.0, 75.0, 100.0)


def stack_rows(series: Sequence[Series]) -> list[int]:
    """One row per layer for the layer-scale stack plot, in depth order.

    The layer's largest tensor (most elements; the first one on a tie), as the
    training-instrumentation toolkit's ``_pick_layer_data_from_variables``
    does: a kernel rather than its bias or a norm layer's beta, and for the
    output views the layer's output itself.
    """
    best: dict[str, tuple[int, float]] = {}
    for i, s in enumerate(series):
        size = _tensor_size(s)
        if s.info.layer not in best or size > best[s.info.layer][1]:
            best[s.info.layer] = (i, size)
    rows = [i for i, _ in best.values()]
    return sorted(rows, key=lambda i: (series[i].info.depth, i))


def _tensor_size(s: Series) -> float:
    # The logged element count is exact for weights; an output's varies with the batch,
    # but a layer has one output, so any count ranks it.
    count = s.field("count") if len(s) and s.has("count") else np.empty(0)
    if np.isfinite(count).any():
        return float(np.nanmax(count))
    return float(np.prod([d for d in s.info.shape if d and d > 0]))


def stack_fractions(rms: np.ndarray) -> np.ndarray:
    """Layer-scale stack fractions of a (layers x steps) RMS matrix.

    The toolkit's ``_log_normalize``, per step: ``l = ln(rms)`` over layers
    with a finite positive RMS, ``s = l - (min(l) - 1)`` (the smallest becomes
    1), fraction ``s / sum(s)``. The natural log (not log10) is what gives the
    toolkit's contrast: RMS 1e-4 .. 1 over five layers gives a top/bottom band
    ratio of 10.2 (5.0 with log10). Layers without a finite positive RMS get
    0; a step with none is all 0.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.where(np.isfinite(rms) & (rms > 0), np.log(rms), np.nan)
    low = np.fmin.reduce(logs, axis=0, initial=np.inf)
    shifted = np.nan_to_num(logs - (low - 1.0), nan=0.0, posinf=0.0, neginf=0.0)
    total = shifted.sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(total > 0, shifted / np.where(total > 0, total, 1.0), 0.0)


def band_over_rows(m: np.ndarray, quantiles: Sequence[float]) -> np.ndarray:
    """Per column, the ``quantiles`` of the finite values (rows = quantiles); NaN if none.

    Same values as ``np.nanpercentile(..., method="linear")``, vectorised over
    columns: sort once with non-finite values pushed to the end, then
    interpolate between order statistics.
    """
    finite = np.isfinite(m)
    count = finite.sum(axis=0)
    ordered = np.sort(np.where(finite, m, np.inf), axis=0)
    pos = np.asarray(quantiles, dtype=np.float64)[:, None] / 100.0 * np.maximum(count - 1, 0)
    lo = np.floor(pos).astype(np.int64)
    hi = np.ceil(pos).astype(np.int64)
    if m.shape[0] == 0:
        return np.full(pos.shape, np.nan)
    below = np.take_along_axis(ordered, lo, axis=0)
    above = np.take_along_axis(ordered, hi, axis=0)
    with np.errstate(invalid="ignore"):
        band = below + (above - below) * (pos - lo)
    band[:, count == 0] = np.nan
    return band


def summarise_rows(m: np.ndarray) -> dict[str, np.ndarray]:
    """Per column: mean, min, max of the finite values and ``worst`` = argmax row (-1 if none)."""
    finite = np.isfinite(m)
    count = finite.sum(axis=0)
    has = count > 0
    high = np.where(finite, m, -np.inf)
    low = np.where(finite, m, np.inf).min(axis=0, initial=np.inf)
    worst = high.argmax(axis=0) if m.shape[0] else np.zeros(m.shape[1], dtype=np.int64)
    return {
        "mean": np.where(has, np.where(finite, m, 0.0).sum(axis=0) / np.maximum(count, 1), np.nan),
        "min": np.where(has, low, np.nan),
        "max": np.where(has, high.max(axis=0, initial=-np.inf), np.nan),
        "worst": np.where(has, worst, -1),
    }


def column_subset(n: int, max_points: int) -> np.ndarray:
    """Indices of at most ``max_points`` evenly strided columns, the last one kept."""
    if max_points <= 0 or n <= max_points:
        return np.arange(n)
    idx = np.unique(np.linspace(0, n - 1, max_points).round().astype(np.int64))
    return idx


def median_fields(s: Series) -> tuple[str, str, float] | None:
    """How to read the median implicit learning rate of ``s``: ``(lo, hi, w)`` with the
    median = ``(1 - w) * lo + w * hi`` (``lo == hi``, ``w == 0`` when ``ilr_q50`` is
    logged); ``None`` when the tag's layout has no ``ilr_q<p>`` slot.

    A layout whose percentile points skip 50 is interpolated linearly between the two
    logged points around it, as numpy interpolates between order statistics.
    """
    how = slots.median_weights([q for q in s.info.quantiles if s.has(_ilr_field(q))])
    if how is None:
        return None
    lo, hi, w = how
    return _ilr_field(lo), _ilr_field(hi), w


def _ilr_field(q: float) -> str:
    return slots.ILR_PREFIX + slots.quantile_field(q)


def ilr_overview(a: Aligned, rows: Sequence[int], cols: np.ndarray) -> dict[str, Any] | None:
    """The Overview's implicit-learning-rate row of the variable view (docs/http_api.md).

    Per layer (``rows``: the layers' largest variables, as the stack plot picks them), the
    median over its elements of the implicit learning rate at each step of ``cols``, and the
    ``ILR_BAND_QUANTILES`` percentiles of those medians over layers. ``None`` when no layer
    has a finite value: format-version-1 data, or a run without the gradient view.
    """
    how = {i: median_fields(a.series[i]) for i in rows}
    if not any(how.values()):
        return None
    m = a.raws(sorted({f for h in how.values() if h for f in h[:2]}))
    median = np.full((len(rows), len(cols)), np.nan)
    for k, i in enumerate(rows):
        if how[i]:
            lo, hi, w = how[i]
            median[k] = (1.0 - w) * m[lo][i, cols] + w * m[hi][i, cols]
    if not np.isfinite(median).any():
        return None
    return {
        "layers": [{"layer": a.series[i].info.layer, "tag": a.series[i].info.tag, "tensor": i}
                   for i in rows],
        "median": num_list(median),
        "band_quantiles": list(ILR_BAND_QUANTILES),
        "band": num_list(band_over_rows(median, ILR_BAND_QUANTILES)),
    }


def view_overview(series: Sequence[Series], max_points: int = DEFAULT_MAX_POINTS) -> dict[str, Any]:
    """The overview of one view (see docs/http_api.md) as a JSON-ready dict."""
    a = align("", series)
    a.raws(("rms", *slots.ACTIVITY_FIELDS, *slots.NONFINITE_FIELDS))  # in one pass
    steps, epochs, rms = a.steps, a.epochs, a.raw("rms")
    nonfinite_m = a.nonfinite_counts()
    first_nonfinite = None
    hits = np.argwhere(nonfinite_m.T > 0)  # (step column, tensor) in step-major order
    if hits.size:
        col, row = hits[0]
        first_nonfinite = {"tag": series[row].info.tag, "step": int(steps[col])}

    cols = column_subset(len(steps), max_points)
    rms_c = rms[:, cols]
    stack = stack_rows(series)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_rms = np.where(np.isfinite(rms_c) & (rms_c > 0), np.log10(rms_c), np.nan)
    activity = {}
    for name in slots.ACTIVITY_FIELDS:
        summary = summarise_rows(a.raw(name)[:, cols])
        entry = {k: num_list(summary[k]) for k in ("mean", "min", "max")}
        if name != "activation_rate":
            entry["worst"] = [None if w < 0 else w for w in summary["worst"].tolist()]
        activity[name] = entry
    doc = {
        "tensors": [
            {"tag": s.info.tag, "name": s.info.name, "layer": s.info.layer, "depth": s.info.depth}
            for s in series
        ],
        "steps": steps[cols].tolist(),
        "epochs": int_list(epochs[cols]),
        "rms_quantiles": list(RMS_QUANTILES),
        "rms_bands": num_list(band_over_rows(rms_c, RMS_QUANTILES)),
        "log10_rms": num_list(log_rms, decimals=4),
        "stack_layers": [
            {"layer": series[i].info.layer, "tag": series[i].info.tag, "tensor": i}
            for i in stack
        ],
        "stack": num_list(stack_fractions(rms_c[stack]), decimals=5),
        "activity": activity,
        "nonfinite": int_list(nonfinite_m.sum(axis=0)[cols]),
        "first_nonfinite": first_nonfinite,
    }
    if series and series[0].info.view == "variable":
        doc["ilr"] = ilr_overview(a, stack, cols)
    return doc


def epoch_band_from_steps(values: np.ndarray, epochs: np.ndarray, steps: np.ndarray) -> dict:
    """Per-epoch ``summary_pb.metric_epoch_band`` of per-step values, grouped by epoch."""
    keep = np.isfinite(epochs)
    epochs, values, steps = epochs[keep], values[keep], steps[keep]
    groups = np.unique(epochs)
    bands = np.array([summary_pb.metric_epoch_band(values[epochs == e], e) for e in groups])
    bands = bands.reshape(len(groups), len(slots.METRIC_EPOCH_FIELDS))
    out: dict[str, list] = {
        "steps": [int(steps[epochs == e].max()) for e in groups],
        "epochs": int_list(groups),
    }
    for i, key in enumerate(slots.METRIC_EPOCH_FIELDS[1:], start=1):
        out[key] = int_list(bands[:, i]) if key == "count" else num_list(bands[:, i])
    return out


def metric_overview(step: Series | None, per_epoch: Series | None) -> dict[str, Any]:
    """Per-step values and per-epoch band of one metric (see docs/http_api.md)."""
    entry: dict[str, Any] = {
        "tag": step.info.tag if step is not None else None,
        "steps": step.steps.tolist() if step is not None else [],
        "epochs": int_list(step.epochs) if step is not None else [],
        "values": num_list(step.field("value")) if step is not None else [],
    }
    if per_epoch is not None:
        epochs = per_epoch.epochs[np.isfinite(per_epoch.epochs)]
        # A window run logs a band per window: several of them in one epoch.
        per = "window" if len(np.unique(epochs)) < len(epochs) else "epoch"
        band = {"source": "logged", "per": per, "steps": per_epoch.steps.tolist(),
                "epochs": int_list(per_epoch.epochs)}
        for key in ("min", "p25", "p50", "p75", "max", "mean"):
            band[key] = num_list(per_epoch.field(key))
        band["count"] = int_list(per_epoch.field("count"))
        entry["epoch_band"] = band
    elif step is not None and np.isfinite(step.epochs).any():
        entry["epoch_band"] = {
            "source": "computed", "per": "epoch",
            **epoch_band_from_steps(step.field("value"), step.epochs, step.steps),
        }
    else:
        entry["epoch_band"] = None
    return entry


def findings_of(run: RunSeries) -> tuple[list[dict], str | None]:
    """``(findings as JSON, error)``: a failing rule is reported, never raised.

    The rest of the overview is still worth serving when a rule breaks on an odd run.
    """
    try:
        return diagnose.findings_json(diagnose.find_issues(run)), None
    except Exception as e:
        logger.exception("tb-introspect: findings rules failed on run %s", run.run)
        return [], f"findings failed: {e}"


def compute_overview(run: RunSeries, max_points: int = DEFAULT_MAX_POINTS,
                     findings: bool = True) -> dict[str, Any]:
    """The whole ``./overview`` document of a run (JSON-ready). ``findings=False``: a run
    read from view summaries, which hold too few slots for the rules; ``findings`` is then
    null and ``./findings`` serves them."""
    names = sorted(set(run.metrics) | set(run.metric_epochs))
    found, error = findings_of(run) if findings else (None, None)
    doc: dict[str, Any] = {
        "run": run.run,
        "views": {v: view_overview(s, max_points) for v, s in run.tensors.items() if s},
        "metrics": {n: metric_overview(run.metrics.get(n), run.metric_epochs.get(n))
                    for n in names},
        "findings": found,
    }
    if error is not None:
        doc["findings_error"] = error
    return doc
