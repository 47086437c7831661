"""Loss rules: not decreasing, rising (diverging), spiking.

Trends compare per-epoch medians (the logged per-epoch band, or the per-step
values grouped by epoch); a run with fewer than three epochs but many
per-step values is cut into ten equal segments instead. Medians, not means:
one bad batch must not decide a trend. Spikes are per-step: a loss far above
its trailing mean (in standard deviations) or its recent median.
"""

from __future__ import annotations

import numpy as np

from tb_introspect.diagnose.core import (
    Finding,
    RunView,
    first_sustained,
    fmt_num,
    fmt_sigmas,
    fmt_times,
    pow10,
    rule,
)
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


def loss_fell_since(rv: RunView, step: int) -> bool:
    """Whether the loss's latest epoch (or segment) median is ``loss_min_decrease`` below its
    median at ``step``: the model still learning. False without a loss."""
    name = rv.loss_name()
    seg = loss_segments(rv, name) if name else None
    if seg is None:
        return False
    steps, _, med = seg
    at = int(np.searchsorted(steps, step))
    if at >= med.size - 1:
        return False
    return bool(med[-1] < med[at] * (1 - rv.t.loss_min_decrease))


def loss_came_down(rv: RunView) -> bool | None:
    """Whether the loss has come most of the way down: its latest epoch (or segment) median
    at ``loss_floor_share`` of its starting level or below. The starting level is the first
    per-step loss, taken before any update (a fast learner's first epoch, or its first 20
    steps, already hold most of its progress; a rate 100x too high blows the loss up by
    two orders within its first 3 steps), else the first epoch's median.
    A run there has learned its task (a classifier at ~100% training accuracy, a language
    model at its data's entropy: 0.8 of ln 32 = 3.47); a loss stuck higher (a too-high rate
    holds an LSTM at 0.65 of its start) has not. None: no loss logged."""
    name = rv.loss_name()
    seg = loss_segments(rv, name) if name else None
    if seg is None:
        return None
    _, _, med = seg
    s = rv.run.metrics.get(name)
    v = s.field("value") if s is not None and len(s) else np.array([])
    v = v[np.isfinite(v)]
    start = float(v[0]) if v.size else float(med[0])
    if not med.size or not np.isfinite(start) or start <= 0:
        return None
    return bool(float(med[-1]) <= rv.t.loss_floor_share * start)


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
                   f" {fmt_times(med[-1] / med[best_j], 1)} its best ({fmt_num(med[best_j])})"),
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
    # ... and over loss_flat_min_steps optimizer steps after the first epoch (or segment):
    # a run of short epochs (4 steps each) under a warm-up has not moved in three of them,
    # and has not had the steps to. A digits epoch (45 steps at batch 32) is judged at its
    # third, as before.
    if int(steps[-1]) - int(steps[0]) < t.loss_flat_min_steps:
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


# ---------------------------------------------------------------- loss spikes

# Rows of trailing windows scored at once: bounds the memory of a long run's windows.
_CHUNK = 4096


def _trailing_mean_std(v: np.ndarray, history: int, min_history: int
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation of the previous ``history`` values at each index, NaN
    with fewer than ``min_history``. Window by window rather than from running sums: a sum
    that once held a 1e10 spike has lost the digits of every loss after it, their variance
    comes out 0, and each later step would score as a spike."""
    n = v.size
    mean, std = np.full(n, np.nan), np.full(n, np.nan)
    with np.errstate(over="ignore", invalid="ignore"):
        for i in range(min_history, min(history, n)):
            mean[i], std[i] = np.mean(v[:i]), np.std(v[:i])
        if n > history >= min_history:
            win = np.lib.stride_tricks.sliding_window_view(v[:-1], history)
            for a in range(0, len(win), _CHUNK):
                w = win[a:a + _CHUNK]
                mean[history + a:history + a + len(w)] = w.mean(axis=1)
                std[history + a:history + a + len(w)] = w.std(axis=1)
    return mean, std


def loss_spike_scores(rv: RunView) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                             np.ndarray, np.ndarray] | None:
    """(steps, epochs, losses, trailing mean, trailing std) of the finite per-step losses;
    the trailing values are over the previous ``loss_spike_history`` losses (NaN where
    fewer than ``loss_spike_min_history``). None without a per-step loss. Read once per
    ``RunView`` (``update_spike`` reads them too)."""
    if "loss_spike_scores" in rv.memo:
        return rv.memo["loss_spike_scores"]
    t = rv.t
    name = rv.loss_name()
    s = rv.run.metrics.get(name) if name else None
    out = None
    if s is not None and len(s):
        v = s.field("value")
        keep = np.isfinite(v)
        v, steps, epochs = v[keep], s.steps[keep], s.epochs[keep]
        mean, std = _trailing_mean_std(v, t.loss_spike_history, t.loss_spike_min_history)
        out = steps, epochs, v, mean, std
    rv.memo["loss_spike_scores"] = out
    return out


def loss_spike_mask(rv: RunView, v: np.ndarray, mean: np.ndarray, std: np.ndarray
                    ) -> np.ndarray:
    """Losses ``loss_spike_sigmas`` standard deviations above their trailing mean, and at
    least ``loss_spike_min_rel`` of it above (a flat loss's tiny noise is no spike)."""
    t = rv.t
    with np.errstate(invalid="ignore"):
        return (v > mean + t.loss_spike_sigmas * std) & (
            v - mean >= t.loss_spike_min_rel * np.abs(mean))


def _recent_median_log(rv: RunView, v: np.ndarray) -> np.ndarray:
    """log10 of the median of the previous ``loss_spike_window`` losses at each index; NaN
    before that many, and everywhere unless every loss is positive (a ratio needs a scale
    that starts at zero)."""
    t = rv.t
    w = t.loss_spike_window
    out = np.full(v.size, np.nan)
    if v.size < w + t.min_points or not np.all(v > 0):
        return out
    windows = np.lib.stride_tricks.sliding_window_view(np.log10(v[:-1]), w)
    out[w:] = np.median(windows, axis=1)
    return out


@rule("loss_spike", needs=("loss",))
def loss_spike(rv: RunView) -> list[Finding]:
    """Per-step losses far above their recent level: more than 6 sigma above the trailing
    128-step mean, or 10x the median of the previous 20 steps and above half the starting
    loss. Warning when one went above the starting loss, or when there were >= 3 and the run
    did not recover; else info."""
    t = rv.t
    scored = loss_spike_scores(rv)
    if scored is None or not scored[2].size:
        return []
    steps, epochs, v, mean, std = scored
    # The score misses a jump where its trailing std is wide (a steep decay, an earlier
    # spike in the window); the ratio one below 10x (an LM's 3 -> 4) and any loss that is
    # not positive. A step either flags is a spike.
    by_score = loss_spike_mask(rv, v, mean, std)
    ref = _recent_median_log(rv, v)
    w = t.loss_spike_window
    start = float(np.median(v[:w]))
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio_log = np.log10(v) - ref
        by_ratio = (ratio_log >= np.log10(t.loss_spike_factor)) & (v >= 0.5 * start)
        z = (v - mean) / std
    spikes = np.flatnonzero(by_score | by_ratio)
    if not spikes.size:
        return []
    name = rv.loss_name()
    j = int(spikes[0])
    # NaN: a spread that overflowed (losses past 1e154), so the largest of all.
    zs = np.where(np.isnan(z[spikes]), np.inf, z[spikes])
    worst = int(spikes[np.argmax(zs)])
    ratios = ratio_log[spikes]
    ratio = pow10(float(np.nanmax(ratios))) if np.isfinite(ratios).any() else None
    # A ratio to a median near zero says little: a hard batch late in a run is many times
    # the median and harmless. A spike above the starting loss lost the run's progress;
    # repeated ones are a warning too when the run is worse for them (not recovered).
    above_start = _lost_progress(rv, v, spikes, start)
    recovery = _recovered(rv, name, epochs[j])
    severity = ("warning" if above_start
                or (spikes.size >= 3 and recovery["recovered"] is False) else "info")
    raw = rv.run.metrics[name]
    bad = np.flatnonzero(~np.isfinite(raw.field("value")) & (raw.steps >= steps[j]))
    nonfinite_step = int(raw.steps[bad[0]]) if bad.size else None
    spike_epochs = {int(e) for e in epochs[spikes] if np.isfinite(e)}
    # The title names only the criteria that flagged a step: "1x the recent median" or
    # "3 sigma" would read as the reason for the finding.
    title = f"Loss spike: {spikes.size} step(s) far above the recent loss"
    if by_score.any():
        title += (f", the largest {fmt_sigmas(float(z[worst]), t.loss_spike_sigmas)} above"
                  f" the trailing mean at step {int(steps[worst])}")
    if by_ratio.any() and ratio is not None:
        title += f", up to {fmt_times(ratio)} the recent median"
    if nonfinite_step is not None:
        title += f" (the loss went non-finite at step {nonfinite_step})"
    return [Finding(
        kind="loss_spike",
        severity=severity,
        title=title,
        first_step=int(steps[j]), first_epoch=_epoch_of(epochs[j]),
        metric=name,
        evidence={
            "spikes": int(spikes.size),
            "spikes_by_score": int(by_score[spikes].sum()),
            "spikes_by_ratio": int(by_ratio[spikes].sum()),
            "epochs_with_spikes": len(spike_epochs),
            "first_spike_step": int(steps[j]),
            "first_spike_loss": float(v[j]),
            "trailing_mean_before_first": float(mean[j]),
            "trailing_std_before_first": float(std[j]),
            "recent_median_before_first": pow10(float(ref[j])),
            "largest_score_sigmas": float(z[worst]),
            "largest_spike_step": int(steps[worst]),
            "largest_ratio_to_recent_median": ratio,
            "starting_loss": start,
            "above_starting_loss": above_start,
            "nonfinite_loss_step": nonfinite_step,
            **recovery,
            "threshold_sigmas": t.loss_spike_sigmas,
            "score_window_steps": t.loss_spike_history,
            "threshold_factor": t.loss_spike_factor,
            "ratio_window_steps": w,
        },
        explanation=(
            "Steps where the loss jumps far above its recent level: more than"
            f" {t.loss_spike_sigmas:g} standard deviations above the mean of the previous"
            f" {t.loss_spike_history} steps (OLMo-core's spike score), or"
            f" {t.loss_spike_factor:g}x the median of the previous {w} steps. An update threw"
            " the model off: a step too large for the local curvature (in transformers"
            " usually a sudden large update, see update_spike, or growing attention or"
            " output logits), an outlier batch, or a numerical near-overflow. A few isolated"
            " spikes that recover are harmless; repeated spikes are an early sign of a"
            " too-high learning rate, and a spike above the starting loss lost the run's"
            " progress."
            + (" Here the run recovered: the loss's epoch median (and the validation loss,"
               " where logged) went on improving after them, and no spike went above the"
               " starting loss, so they are hard batches rather than damage."
               if severity == "info" and recovery["recovered"] else "")
        ),
        suggestion=(
            "Lower the learning rate or lengthen warm-up, clip gradients; look at the"
            " update_spike and attention-logit findings for the cause (QK-norm or z-loss"
            " tame growing logits); check the batches at the spike steps for corrupt or"
            " extreme inputs."
        ),
        jump=_jump(name),
    )]


def _lost_progress(rv: RunView, v: np.ndarray, spikes: np.ndarray, start: float) -> bool:
    """Whether a spike went above the starting loss and the loss stayed up after it: the
    median of the next ``loss_spike_window`` steps at half the starting loss or more (the
    level a spike must reach by its ratio). One batch above the starting loss is not a lost
    run: with a batch of 2 a hard pair of samples is there while the loss falls (a
    healthy run's per-step losses, batch 2). Too few steps after it (fewer than 5): not
    known yet."""
    w = rv.t.loss_spike_window
    for s in spikes[v[spikes] >= start]:
        after = v[s + 1:s + 1 + w]
        after = after[np.isfinite(after)] if np.isfinite(v[s + 1:s + 1 + w]).all() else None
        if after is None:  # the loss went non-finite after it: the run is lost
            return True
        if after.size >= 5 and float(np.median(after)) >= 0.5 * start:
            return True
    return False


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
