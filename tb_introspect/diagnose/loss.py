"""Loss rules: not decreasing, rising (diverging), spiking.

Trends compare per-epoch medians (the logged per-epoch band, or the per-step
values grouped by epoch); a run with fewer than three epochs but many
per-step values is cut into ten equal segments instead. Medians, not means:
one bad batch must not decide a trend.
"""

from __future__ import annotations

import numpy as np

from tb_introspect.diagnose.core import Finding, RunView, first_sustained, fmt_num, pow10, rule
from tb_introspect.diagnose.task import at_chance, infer_task

_SEGMENTS = 10
_MIN_STEPS_FOR_SEGMENTS = 30


def loss_segments(rv: RunView, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(last step, epoch or NaN, median loss) per epoch or per segment; None if too few."""
    band = rv.run.metric_epochs.get(name)
    if band is not None and len(band) >= rv.t.min_points:
        med = band.field("p50")
        keep = np.isfinite(med)
        return band.steps[keep], band.epochs[keep], med[keep]
    s = rv.run.metrics.get(name)
    if s is None or not len(s):
        return None
    v, e, st = s.field("value"), s.epochs, s.steps
    keep = np.isfinite(v)
    v, e, st = v[keep], e[keep], st[keep]
    if np.isfinite(e).all() and len(np.unique(e)) >= rv.t.min_points:
        groups = [np.flatnonzero(e == u) for u in np.unique(e)]
    elif v.size >= _MIN_STEPS_FOR_SEGMENTS:
        groups = np.array_split(np.arange(v.size), _SEGMENTS)
    else:
        return None
    return (np.array([st[g[-1]] for g in groups]),
            np.array([e[g[-1]] if np.isfinite(e[g[-1]]) else np.nan for g in groups]),
            np.array([np.median(v[g]) for g in groups]))


def never_decreased(rv: RunView, med: np.ndarray) -> bool:
    """No later median ``loss_min_decrease`` below the first (``loss_not_decreasing``)."""
    return bool(float(np.min(med[1:])) >= med[0] * (1 - rv.t.loss_min_decrease))


def _epoch_of(e: float) -> int | None:
    return int(e) if np.isfinite(e) else None


def _jump(name: str) -> dict:
    return {"tab": "overview", "metric": name, "chart": "metric"}


@rule("loss_trend", needs=("loss",))
def loss_trend(rv: RunView) -> list[Finding]:
    """Loss giving back half its progress (warning), or never 5% below its start (warning)."""
    t = rv.t
    name = rv.loss_name()
    seg = loss_segments(rv, name) if name else None
    if seg is None:
        return []
    steps, epochs, med = seg
    if med.size < t.min_points or not np.all(med > 0):
        return []
    k = rv.sustain_points(med.size)
    best_before = np.minimum.accumulate(np.concatenate([[np.inf], med[:-1]]))
    best_before[0] = med[0]
    # "Rising" = gave back half of the progress made so far (or, with no progress yet,
    # rose 1.5x): scale-free, and blind to the epoch-to-epoch noise of small losses.
    progress = np.maximum(med[0] - best_before, 0.0)
    allowance = np.maximum(t.loss_rise_progress * progress, (t.loss_rise_factor - 1) * best_before)
    rising = med >= best_before + allowance
    rising[0] = False
    j = first_sustained(rising, k)
    if j is not None:
        best_j = int(np.argmin(med[:j]))
        return [Finding(
            kind="loss_rising",
            severity="warning",
            title=(f"Loss rising: median {fmt_num(med[-1])} at the end,"
                   f" {med[-1] / med[best_j]:.1f}x its best ({fmt_num(med[best_j])})"),
            first_step=int(steps[j]), first_epoch=_epoch_of(epochs[j]),
            metric=name,
            evidence={
                "best_median": float(med[best_j]),
                "best_step": int(steps[best_j]),
                "median_at_first_flag": float(med[j]),
                "median_at_end": float(med[-1]),
                "rise_factor": float(med[-1] / med[best_j]),
                "progress_given_back": float((med[-1] - med[best_j]) / (med[0] - med[best_j]))
                if med[0] > med[best_j] else None,
                "threshold_factor": t.loss_rise_factor,
            },
            explanation=(
                "The training loss went down and then climbed back up and stayed up. Training"
                " loss should not rise on a fixed training set: something broke the model on"
                " the way - typically a learning rate that became too high (a warm-up overshoot,"
                " or a rate fine early but too large near the optimum), dying units, or"
                " numerical trouble."
            ),
            suggestion=(
                "Find what changed at the step shown (dead units, gradient spikes in the"
                " gradient view); lower the learning rate or cap the warm-up; keep the best"
                " checkpoint (early stopping)."
            ),
            jump=_jump(name),
        )]
    # Never more than loss_min_decrease below the start, at any later epoch/segment. The
    # earliest point this can be said is the third segment.
    if not never_decreased(rv, med):
        return []
    j = 2
    # A classifier stuck at ln K says more: its output does not depend on its input.
    task = infer_task(rv)
    chance = bool(task is not None and at_chance(rv, task, epochs, med)[-1])
    return [Finding(
        kind="loss_not_decreasing",
        severity="warning",
        title=(f"Loss not decreasing: median {fmt_num(med[0])} at the start,"
               f" {fmt_num(med[-1])} at the end"
               + (f", the chance level ln {task.classes} = {task.chance_loss:.3f}"
                  if chance else "")),
        first_step=int(steps[j]), first_epoch=_epoch_of(epochs[j]),
        metric=name,
        evidence={
            "median_at_start": float(med[0]),
            "median_at_end": float(med[-1]),
            "best_median": float(np.min(med)),
            "best_relative_change": float(np.min(med) / med[0] - 1),
            "segments": int(med.size),
            "at_chance_level": chance,
            "chance_loss": task.chance_loss if task is not None else None,
            "threshold_decrease": t.loss_min_decrease,
        },
        explanation=(
            f"The training loss never got even {100 * t.loss_min_decrease:g}% below its"
            " starting level: the model is not learning. The"
            " usual causes are gradients that do not reach the weights (vanishing gradients,"
            " dead or saturated units - see the other findings), a learning rate far too low"
            " or far too high, or a bug (labels shuffled apart from inputs, wrong loss for"
            " the output activation)."
        ),
        suggestion=(
            "Check the gradient findings first; try to overfit a single batch (if that fails,"
            " it is a bug); sweep the learning rate over a few orders of magnitude."
        ),
        jump=_jump(name),
    )]


@rule("loss_spikes", needs=("loss",))
def loss_spikes(rv: RunView) -> list[Finding]:
    """Per-step losses 10x above the recent median and above half the starting loss."""
    t = rv.t
    name = rv.loss_name()
    s = rv.run.metrics.get(name) if name else None
    if s is None:
        return []
    v = s.field("value")
    keep = np.isfinite(v)
    v, steps, epochs = v[keep], s.steps[keep], s.epochs[keep]
    w = t.loss_spike_window
    if v.size < w + t.min_points or not np.all(v > 0):
        return []
    logs = np.log10(v)
    # Median of the previous w values, for every point from w on.
    windows = np.lib.stride_tricks.sliding_window_view(logs[:-1], w)
    ref = np.median(windows, axis=1)
    cur = logs[w:]
    floor = np.log10(0.5 * np.median(v[:w]))
    spikes = np.flatnonzero((cur - ref >= np.log10(t.loss_spike_factor)) & (cur >= floor)) + w
    if spikes.size == 0:
        return []
    spike_epochs = {int(e) for e in epochs[spikes] if np.isfinite(e)}
    j = int(spikes[0])
    ratio = pow10(np.max(logs[spikes] - ref[spikes - w]))
    # A ratio to a median near zero says little: a hard batch late in a run is many times
    # the median and harmless. Repeated spikes are a warning when one went above the
    # loss's starting level, or when the run is worse for them (not recovered).
    start = float(np.median(v[:w]))
    above_start = bool(np.max(v[spikes]) >= start)
    recovery = _recovered(rv, name, epochs[j])
    severity = ("warning" if spikes.size >= 3
                and (above_start or recovery["recovered"] is False) else "info")
    return [Finding(
        kind="loss_spikes",
        severity=severity,
        title=(f"Loss spikes: {spikes.size} step(s) with the loss up to {ratio:.0f}x its"
               " recent median"),
        first_step=int(steps[j]), first_epoch=_epoch_of(epochs[j]),
        metric=name,
        evidence={
            "spikes": int(spikes.size),
            "epochs_with_spikes": len(spike_epochs),
            "largest_ratio_to_recent_median": ratio,
            "first_spike_value": float(v[j]),
            "recent_median_before_first": pow10(ref[j - w]),
            "starting_median": start,
            "largest_spike_above_start": above_start,
            **recovery,
            "threshold_factor": t.loss_spike_factor,
            "window_steps": w,
        },
        explanation=(
            "Single steps where the loss jumps an order of magnitude above its recent level mean"
            " an update threw the model off (a step too large for the local curvature, an"
            " outlier batch, or a numerical near-overflow). A few isolated spikes that recover"
            " are harmless; repeated spikes are an early sign of a too-high learning rate."
            + (" Here the run recovered: the loss's epoch median (and the validation loss,"
               " where logged) went on improving after them, and no spike went above the"
               " starting loss, so they are hard batches rather than damage."
               if severity == "info" and recovery["recovered"] else "")
        ),
        suggestion=(
            "Lower the learning rate or add gradient clipping; check the batches at the spike"
            " steps for corrupt or extreme inputs."
        ),
        jump=_jump(name),
    )]


def _recovered(rv: RunView, name: str, spike_epoch: float) -> dict:
    """Whether the run went on improving through the first spike's epoch: the latest epoch
    median of the loss (the spikes' own epoch included: a median shrugs off a few batches)
    below the median of the epoch before it, and the validation loss (where logged) at or
    below its best before it. None: not known yet (no epoch before, or none from the
    spike's epoch on)."""
    out: dict = {"recovered": None, "loss_median_before_spikes": None,
                 "loss_median_at_end": None, "val_loss_best_before_spikes": None,
                 "val_loss_at_end": None}
    seg = loss_segments(rv, name)
    if seg is None or not np.isfinite(spike_epoch):
        return out
    _, epochs, med = seg
    before = np.flatnonzero(epochs < spike_epoch)
    if not before.size or epochs[-1] < spike_epoch:
        return out
    out["loss_median_before_spikes"] = float(med[before[-1]])
    out["loss_median_at_end"] = float(med[-1])
    ok = bool(med[-1] < med[before[-1]])
    val = rv.run.metrics.get(f"val_{name}")
    if val is not None and len(val):
        vv, ve = val.field("value"), val.epochs
        keep = np.isfinite(vv) & np.isfinite(ve)
        vv, ve = vv[keep], ve[keep]
        pre = vv[ve < spike_epoch]
        if pre.size and vv.size:
            out["val_loss_best_before_spikes"] = float(np.min(pre))
            out["val_loss_at_end"] = float(vv[-1])
            ok = ok and bool(vv[-1] <= np.min(pre))
    out["recovered"] = ok
    return out
