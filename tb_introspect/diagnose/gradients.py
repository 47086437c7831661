"""Gradient-scale rules: vanishing gradients, exploding gradients, gradient oscillation,
gradients that pile up (never zeroed).

Scales are per-layer gradient RMS (one representative tensor per layer, see
:func:`~tb_introspect.diagnose.core.representative_rows`). A per-epoch
gradient is the sum of the epoch's per-step gradients (docs/design.md), so its
RMS is between sqrt(n) and n times a typical per-step RMS (n steps): "too
large" tests divide by n (a lower bound of the per-step scale, by the
triangle inequality), so they never fire on an aggregate alone.
"""

from __future__ import annotations

import numpy as np

from tb_introspect.diagnose import config
from tb_introspect.diagnose.core import (
    Finding,
    RunView,
    first_sustained,
    fmt_num,
    fmt_orders,
    log10_pos,
    nanmedian,
    pow10,
    representative_rows,
    rule,
    trailing_run,
)
from tb_introspect.diagnose.loss import loss_came_down
from tb_introspect.metadata import AGGREGATED_CADENCES


def _gradient_scales(rv: RunView):
    """(aligned gradient view of one tensor per layer, log10 RMS matrix) or ``None``."""
    if "gradient_scales" not in rv.memo:
        a = rv.view("gradient")
        rows = representative_rows(a) if a is not None else []
        sub = a.subset(rows) if rows else None
        rv.memo["gradient_scales"] = (sub, log10_pos(sub.field("rms"))) if sub else None
    return rv.memo["gradient_scales"]


@rule("vanishing_gradients", needs=("gradient",))
def vanishing_gradients(rv: RunView) -> list[Finding]:
    """First layer's gradient RMS orders of magnitude below the last layer's, sustained."""
    got = _gradient_scales(rv)
    if got is None:
        return []
    a, logs = got
    if logs.shape[0] < 2:
        return []
    # Layers whose gradient is exactly zero are the dead-units rule's business.
    gap = logs[-1] - logs[0]
    t = rv.t
    if np.isfinite(gap).sum() < t.min_points:
        return []
    k = rv.sustain_points(int(np.isfinite(gap).sum()))
    severity, threshold = "warning", t.vanishing_orders
    j0 = first_sustained(np.isfinite(gap) & (gap >= t.vanishing_orders), k)
    if j0 is None:
        # The article: the first layer's gradient scale should not be smaller than the last
        # layer's. 10-99x is worth a look, not yet the starvation of >= 100x.
        severity, threshold = "info", t.vanishing_info_orders
        j0 = first_sustained(np.isfinite(gap) & (gap >= t.vanishing_info_orders), k)
    if j0 is None:
        return []
    last = int(np.flatnonzero(np.isfinite(gap))[-1])
    # On the points so far: a gap that has closed below the level at the latest point is
    # one level lower (a warning becomes info; weakening that closed is not reported).
    if gap[last] < threshold:
        if severity == "info":
            return []
        severity = "info"
    step, epoch = rv.step_epoch(a, j0)
    # Layers at least one order below the last layer at the last point: the starved ones.
    rel = logs[:, last] - logs[-1, last]
    starved = [i for i in range(logs.shape[0] - 1) if np.isfinite(rel[i]) and rel[i] <= -1.0]
    first_layer, last_layer = a.series[0].info.layer, a.series[-1].info.layer
    worst = float(np.nanmax(gap))
    return [Finding(
        kind="vanishing_gradients",
        severity=severity,
        title=(f"{'Vanishing' if severity == 'warning' else 'Weakening'} gradients:"
               f" '{first_layer}' gets {fmt_orders(-gap[j0])} of the"
               f" gradient RMS of '{last_layer}'"),
        first_step=step, first_epoch=epoch,
        layers=a.layers(starved or [0]),
        tags=a.tags(starved or [0]),
        view="gradient",
        evidence={
            "first_layer_rms": pow10(logs[0, j0]),
            "last_layer_rms": pow10(logs[-1, j0]),
            "orders_below_last": float(gap[j0]),
            "orders_below_last_at_end": float(gap[last]),
            "worst_orders": worst,
            "closed_since": bool(gap[last] < threshold),
            "layers_compared": int(logs.shape[0]),
            "threshold_orders": threshold,
        },
        explanation=(
            "Backpropagation multiplies the error signal by each layer's local derivative on"
            " its way down. When those factors are small (saturating sigmoid/tanh units, poor"
            " initialisation, very deep plain stacks), the layers nearest the input receive a"
            f" gradient {fmt_orders(gap[j0])} times smaller than the output layer's and barely"
            " learn, while the top layers do all the fitting."
            + ("" if severity == "warning" else
               f" The gap has since closed to {fmt_orders(gap[last])} at the latest point."
               if gap[last] < threshold else
               " Here the gap is 10-99x: the first layers still learn, more slowly. The"
               " first layer's gradient scale should not be smaller than the last layer's;"
               " watch whether the gap grows (thinning bottom bands in the gradient stack).")
        ),
        suggestion=(
            "Use ReLU-family activations (or GELU/SiLU) instead of sigmoid/tanh in hidden layers;"
            " use He/Glorot initialisation matched to the activation; add batch or layer"
            " normalisation or residual connections; reduce depth."
        ),
        jump={"tab": "overview", "view": "gradient", "chart": "stack"},
    )]


@rule("exploding_gradients", needs=("gradient",))
def exploding_gradients(rv: RunView) -> list[Finding]:
    """Per-step gradient RMS far above 1, or growing by orders of magnitude, sustained."""
    got = _gradient_scales(rv)
    if got is None:
        return []
    a, logs = got
    t = rv.t
    per_step = np.log10(a.span) if a.cadence in AGGREGATED_CADENCES else np.zeros(a.n_points)
    low = logs - per_step  # log10 of a lower bound of the per-step RMS
    med = nanmedian(low, axis=0)
    have = np.isfinite(med)
    if have.sum() < t.min_points:
        return []
    idx = np.flatnonzero(have)
    base_n = max(1, min(3, len(idx) // 4))
    base = float(np.median(med[idx[:base_n]]))
    growth = med - base
    too_big = have & (med > np.log10(t.exploding_rms))
    grew = have & (growth >= t.exploding_growth_orders)
    k = rv.sustain_points(int(have.sum()))
    j_big = first_sustained(too_big, k)
    j_grew = first_sustained(grew, k)
    if j_big is None and j_grew is None:
        return []
    j0 = min(j for j in (j_big, j_grew) if j is not None)
    step, epoch = rv.step_epoch(a, j0)
    peak = int(idx[np.argmax(med[idx])])
    worst_row = int(np.nanargmax(low[:, peak])) if np.isfinite(low[:, peak]).any() else 0
    why = []
    if j_big is not None:
        why.append(f"the median layer's per-step gradient RMS reached {fmt_num(pow10(med[peak]))}")
    if j_grew is not None:
        why.append(f"it grew {fmt_orders(float(np.nanmax(growth)))}x from the start")
    return [Finding(
        kind="exploding_gradients",
        severity="warning",
        title="Exploding gradients: " + " and ".join(why),
        first_step=step, first_epoch=epoch,
        layers=a.layers([worst_row]) + [la for la in a.layers() if la not in a.layers([worst_row])],
        tags=a.tags([worst_row]),
        view="gradient",
        evidence={
            "median_layer_rms_per_step": pow10(med[j0]),
            "peak_median_layer_rms_per_step": pow10(med[peak]),
            "start_median_layer_rms_per_step": pow10(base),
            "growth_orders": float(np.nanmax(growth)),
            "largest_layer_rms_per_step": pow10(np.nanmax(low[:, peak])),
            "per_step_scale": "lower bound (window sums divided by steps)"
            if a.cadence in AGGREGATED_CADENCES else "logged step",
            "threshold_rms": t.exploding_rms,
            "threshold_growth_orders": t.exploding_growth_orders,
        },
        explanation=(
            "Gradients far above 1 per element, or growing by orders of magnitude, mean each"
            " update moves the weights much more than the loss surface allows: the loss jumps"
            " around or diverges, and the next step is often NaN. Typical causes are a learning"
            " rate that is too high, no normalisation in a deep or recurrent net, or a loss"
            " that grows without bound (e.g. unclipped regression targets)."
        ),
        suggestion=(
            "Lower the learning rate (try 3-10x lower) or add warm-up; clip gradients by global"
            " norm (e.g. clipnorm=1.0); add normalisation layers; check the loss and the input"
            " scaling."
        ),
        jump={"tab": "overview", "view": "gradient", "chart": "rms"},
    )]


@rule("gradient_oscillation", needs=("gradient",))
def gradient_oscillation(rv: RunView) -> list[Finding]:
    """Consecutive gradient aggregates persistently anti-aligned while the loss stalls,
    or a jagged layer-scale stack."""
    got = _gradient_scales(rv)
    if got is None:
        return []
    a, logs = got
    t = rv.t
    cos_found = _anti_aligned(rv, a)
    rough, j_rough = _roughness(rv, logs)
    if cos_found is None and j_rough is None:
        return []
    j_cos, window, share, med, stalled = cos_found or (None, None, float("nan"),
                                                       float("nan"), None)
    j0 = min(j for j in (j_cos, j_rough) if j is not None)
    step, epoch = rv.step_epoch(a, j0)
    signs = []
    if j_cos is not None:
        signs.append(f"consecutive gradients point against each other (median cosine {med:.2f}"
                     f" over the last {window} points)")
    if j_rough is not None:
        signs.append("the layer-scale stack is jagged")
    # Anti-aligned gradients while the loss still falls fast are a passing phase (seen in
    # healthy runs); without a logged loss that cannot be told apart, hence "info". A loss
    # that stopped falling because it reached its floor is not a stall either: there the
    # window sums are the minibatches' noise around the minimum, and an optimizer at a
    # constant rate bounces across it (every healthy small language model here).
    floor = loss_came_down(rv) if j_cos is not None else None
    severity = "warning" if (j_rough is not None or (stalled and not floor)) else "info"
    return [Finding(
        kind="gradient_oscillation",
        severity=severity,
        title="Gradient oscillation: " + " and ".join(signs),
        first_step=step, first_epoch=epoch,
        layers=a.layers(),
        tags=[],
        view="gradient",
        evidence={
            "median_cos_prev": med,
            "share_negative_cos": share,
            "points_judged": window,
            "loss_stalled": stalled,
            "loss_at_floor": floor,
            "stack_roughness_orders": rough,
            "threshold_cos": t.oscillation_cos,
            "threshold_share": t.oscillation_share,
            "threshold_roughness_orders": t.jagged_roughness,
        },
        explanation=(
            "When each gradient aggregate points roughly opposite to the previous one, the"
            " optimiser is bouncing across a valley instead of descending it: the steps are"
            " too large for the local curvature. The loss then stalls or turns noisy, often"
            " only after the first epochs looked fine, because the valley narrows near the"
            " optimum."
            + (" Here the loss kept falling fast over the same stretch, so this may be a"
               " passing phase (healthy runs show it too); watch whether it persists."
               if severity == "info" and not floor else "")
            + (" Here the loss had already come most of the way down and sits at its floor:"
               " near a minimum the summed gradients are mostly the minibatches' noise, and"
               " they point against each other without harm. Decaying the learning rate"
               " would still lower the floor a little." if severity == "info" and floor
               else "")
        ),
        suggestion=(
            "Lower the learning rate or decay it (the article's slightly-too-high rate is the"
            " classic cause); reduce momentum; increase the batch size; add gradient clipping."
        ),
        jump={"tab": "overview", "view": "gradient", "chart": "stack"},
    )]


def _anti_aligned(rv: RunView, a) -> tuple[int, int, float, float, bool | None] | None:
    """Persistent negative ``cos_prev`` over the second half of the run.

    Returns ``(first column, points judged, share negative, median cosine, loss
    stalled)`` or ``None``. Judged on the second half because healthy runs can
    pass through a stretch of anti-aligned epochs and then settle (measured on
    the demo's healthy CNN); a too-high learning rate keeps them anti-aligned.
    """
    t = rv.t
    med_cos = nanmedian(a.field("cos_prev"), axis=0)
    idx = np.flatnonzero(np.isfinite(med_cos))
    # Decided on the points so far: from three cosines on (the second half is then the
    # latest two), so a live run shows it within two epochs of the first anti-aligned one.
    if idx.size < t.min_points:
        return None
    tail = idx[idx.size // 2:]
    c = med_cos[tail]
    share = float(np.mean(c < 0))
    med = float(np.median(c))
    if share < t.oscillation_share or med > t.oscillation_cos:
        return None
    # Start of the final stretch that is still mostly anti-aligned.
    j = int(tail[0])
    for start in idx:
        rest = med_cos[idx[idx >= start]]
        if med_cos[start] < 0 and np.mean(rest < 0) >= t.oscillation_share:
            j = int(start)
            break
    return j, int(tail.size), share, med, _loss_stalled(rv, int(a.steps[tail[0]]))


def _loss_stalled(rv: RunView, from_step: int) -> bool | None:
    """Whether the loss failed to halve from ``from_step`` to the end (None: no loss)."""
    name = rv.loss_name()
    if name is None:
        return None
    band = rv.run.metric_epochs.get(name)
    if band is not None and len(band):
        keep = np.isfinite(band.field("p50")) & (band.steps >= from_step)
        med = band.field("p50")[keep]
        if med.size < 2:
            return None
        # Epoch medians: did any epoch since get to half the stretch's first one?
        return bool(float(np.min(med[1:])) > 0.5 * float(med[0]))
    s = rv.run.metrics[name]
    steps, med = s.steps, s.field("value")
    keep = np.isfinite(med) & (steps >= from_step)
    if keep.sum() < 2:
        return None
    med = med[keep]
    m = max(2, med.size // 10)  # per-step values are noisy: compare the ends' medians
    start = float(np.median(med[:m]))
    end = float(np.median(med[-m:]))
    return bool(end > 0.5 * start)


def _roughness(rv: RunView, logs: np.ndarray) -> tuple[float | None, int | None]:
    """Jaggedness of the layer-scale stack and the first point where it is sustained.

    Per layer, the log10 RMS minus the across-layer mean (the stack plot's
    relative scale), then |second difference| / 2: a zigzag of +-x orders
    scores x, a straight trend 0. Median over layers.
    """
    t = rv.t
    if logs.shape[0] < 2 or logs.shape[1] < t.min_points:
        return None, None
    rel = logs - nanmedian(logs, axis=0)
    d2 = np.abs(rel[:, 2:] - 2 * rel[:, 1:-1] + rel[:, :-2]) / 2
    per_point = nanmedian(d2, axis=0)
    have = np.isfinite(per_point)
    if not have.any():
        return None, None
    rough = float(np.nanmean(per_point))
    mask = np.concatenate([[False], have & (per_point >= t.jagged_roughness), [False]])
    j = first_sustained(mask, rv.sustain_points(int(have.sum())))
    return rough, j


@rule("gradient_pileup", needs=("gradient",))
def gradient_pileup(rv: RunView) -> list[Finding]:
    """The median layer's per-step gradient RMS rising at every one of the latest >= 3
    points, >= 10^0.5 (3.2x) above its lowest before, while the loss median fell."""
    got = _gradient_scales(rv)
    if got is None:
        return []
    a, logs = got
    t = rv.t
    per_step = np.log10(a.span) if a.cadence in AGGREGATED_CADENCES else np.zeros(a.n_points)
    med = nanmedian(logs - per_step, axis=0)
    if not np.isfinite(med).all() or med.size < t.min_points:
        return []
    rising = np.concatenate([[False], np.diff(med) > t.pileup_step_orders])
    n = trailing_run(rising)
    if n < t.min_points - 1:  # >= 3 points in a row, each above the one before
        return []
    j = med.size - 1 - n  # the last point before the rise
    growth = float(med[-1] - np.min(med[: j + 1]))
    if growth < t.pileup_orders:
        return []
    # Sums never zeroed grow with every optimizer step they hold, for as long as training
    # runs; a healthy gradient rises for a few steps only (a full batch's first steps, the
    # end of a warm-up: both measured here). The rise must span pileup_min_steps steps.
    if int(a.steps[-1]) - int(a.steps[j]) < t.pileup_min_steps:
        return []
    falling = _loss_fell(rv, int(a.steps[j]))
    if not falling:
        return []
    step, epoch = rv.step_epoch(a, j + 1)
    # Parameters in no optimizer group (recorded by the front-end): zero_grad() never clears
    # their gradients. When the layers the optimizer holds do not pile up, that is the cause.
    outside = set(config.untrained_layers(rv))
    held = np.array([s.info.layer not in outside for s in a.series])
    cause = "zero_grad missing"
    if outside and not held.all():
        med_held = nanmedian((logs - per_step)[held], axis=0) if held.any() else None
        if med_held is None or not np.isfinite(med_held).all() or \
                med_held[-1] - np.min(med_held[: j + 1]) < t.pileup_orders:
            cause = "not in the optimizer"
    if cause == "not in the optimizer":
        shown = ", ".join(f"'{la}'" for la in sorted(outside)[:4])
        title = (f"Gradients pile up in parameters no optimizer group holds ({shown}):"
                 f" grew {fmt_orders(growth)}x over the last {n} points; zero_grad() and"
                 " step() only touch the optimizer's own parameters")
    else:
        title = (f"Gradients pile up: the median layer's gradient RMS grew"
                 f" {fmt_orders(growth)}x over the last {n} points, rising at every one, while"
                 f" the loss fell")
    return [Finding(
        kind="gradient_pileup",
        severity="warning",
        title=title,
        first_step=step, first_epoch=epoch,
        layers=a.layers(), tags=a.tags(),
        view="gradient",
        evidence={
            "growth_orders": growth,
            "points_rising": int(n),
            "steps_rising": int(a.steps[-1]) - int(a.steps[j]),
            "median_layer_rms_per_step_at_start": pow10(med[j]),
            "median_layer_rms_per_step_at_end": pow10(med[-1]),
            "per_step_scale": "lower bound (window sums divided by steps)"
            if a.cadence in AGGREGATED_CADENCES else "logged step",
            "threshold_orders": t.pileup_orders,
            "threshold_step_orders": t.pileup_step_orders,
            "cause": cause,
            "layers_outside_optimizer": len(outside),
        },
        explanation=(
            ("The gradients that grow are those of parameters the optimizer was not given:"
             " optimizer.zero_grad() and optimizer.step() act on the optimizer's parameter"
             " groups only, so these gradients are never cleared (they add up at every"
             " backward()) and never applied (the layers stay at their initial values)."
             " Calling zero_grad() does not help them. ")
            if cause == "not in the optimizer" else ""
        ) + (
            "While the loss falls, the gradients normally shrink or hold their scale. Here"
            " they grow at every logged point: each step's gradient is the sum of all the"
            " steps before it. In PyTorch that is a loop that never calls"
            " optimizer.zero_grad() (or model.zero_grad()): backward() adds to .grad, so"
            " the update applies every past gradient again and the effective step keeps"
            " growing; training loss races to zero while the model generalises badly, or"
            " training becomes unstable. The same happens with a hand-written accumulation"
            " whose buffer is never reset."
        ),
        suggestion=(
            "Build the optimizer over every parameter that should learn"
            " (model.parameters(), or add_param_group), or freeze the others with"
            " requires_grad_(False)." if cause == "not in the optimizer" else
            "Call optimizer.zero_grad() before each backward() (or set_to_none); with"
            " gradient accumulation, zero the gradients after each optimizer step, not"
            " only at the start of the epoch; reset any accumulation buffer after it is"
            " applied."
        ),
        jump={"tab": "overview", "view": "gradient", "chart": "rms"},
    )]


def _loss_fell(rv: RunView, from_step: int) -> bool:
    """Whether the loss's latest epoch median (or the latest per-step values' median) is
    below its value at ``from_step``."""
    name = rv.loss_name()
    if name is None:
        return False
    band = rv.run.metric_epochs.get(name)
    if band is not None and len(band):
        keep = np.isfinite(band.field("p50")) & (band.steps >= from_step)
        med = band.field("p50")[keep]
        return bool(med.size >= 2 and med[-1] < med[0])
    s = rv.run.metrics[name]
    keep = np.isfinite(s.field("value")) & (s.steps >= from_step)
    v = s.field("value")[keep]
    if v.size < 4:
        return False
    m = max(2, v.size // 10)
    return bool(np.median(v[-m:]) < np.median(v[:m]))
