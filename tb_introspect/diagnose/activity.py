"""Unit-activity rules: dead or dying units, saturated tanh/sigmoid units.

Dead rates come from layer outputs (a channel dead = zero for every sample and
position of the logging window); without the output view, from the gradients
of the layers' kernels (a unit whose incoming weights got exactly zero
gradient over the window received no error signal at all).
"""

from __future__ import annotations

import numpy as np

from tb_introspect.diagnose.core import (
    Aligned,
    Finding,
    RunView,
    first_sustained,
    nanmax,
    nanmedian,
    nanmin,
    pct,
    rule,
    unique,
)
from tb_introspect.diagnose.loss import loss_came_down

_LEVELS = ("critical", "warning", "info")


def _first_trainable_depth(rv: RunView) -> int | None:
    """Depth of the first layer with weights (from the variable or gradient view)."""
    depths = [s.info.depth for v in ("variable", "gradient") for s in rv.run.tensors.get(v, [])]
    return min(depths) if depths else None


def model_rows(rv: RunView, a: Aligned) -> list[int]:
    """Output tensors of the model's hidden layers.

    Layers before the first weighted layer (Flatten, Rescaling, UpSampling of
    the input) show the data, not units; the output layer (softmax/sigmoid
    head) is saturated or "dead" when it is confident or diverged, which other
    rules report.
    """
    first = _first_trainable_depth(rv)
    last = max(s.info.depth for s in a.series)
    return [i for i, s in enumerate(a.series)
            if (first is None or s.info.depth >= first) and s.info.depth < last
            and not _fixed_output(a, i)]


def _fixed_output(a: Aligned, i: int) -> bool:
    """Whether output ``i`` is the same at every logged point (>= 2): a function of the
    positions only, not of the input or of anything trained (a rotary embedding's cos/sin,
    fixed sinusoidal position codes, a mask). It holds no units: its values at +-1 are
    cos 0, not saturation. An output that is exactly zero throughout (a dead layer) is a
    layer of units, and stays."""
    cols = [a.field(f)[i] for f in ("mean", "rms", "min", "max")]
    ok = np.isfinite(cols[1])
    if ok.sum() < 2 or not np.all(cols[1][ok] > 0):
        return False
    for c in cols:
        v = c[ok]
        if not (np.isfinite(v).all() and np.allclose(v, v[0], rtol=1e-6, atol=0.0)):
            return False
    return True


def _relu_like_rows(rv: RunView, a: Aligned) -> list[int]:
    """Output tensors that look rectified: never negative, with exact zeros."""
    q0 = a.field("min")
    zero = a.field("zero_fraction")
    rows = []
    for i in model_rows(rv, a):
        lo = nanmin(q0[i])
        if np.isfinite(lo) and lo >= 0 and np.nanmax(np.nan_to_num(zero[i], nan=0.0)) > 0:
            rows.append(i)
    return rows


def _sampled_activity(a: Aligned) -> np.ndarray:
    """[tensor, point]: True where the activity was counted on the statistics steps only
    (``activity_steps < steps``); False where exact or where the writer did not say."""
    act, steps = a.raw("activity_steps"), a.raw("steps")
    with np.errstate(invalid="ignore"):
        return np.nan_to_num(act, nan=np.inf) < np.nan_to_num(steps, nan=0.0)


def _kernel_rows(a: Aligned) -> list[int]:
    return [i for i, s in enumerate(a.series) if len(s.info.shape) >= 2]


@rule("dead_units", needs=("output", "gradient"))
def dead_units(rv: RunView) -> list[Finding]:
    """Share of dead channels per layer above 25% / 50% / 99%, sustained."""
    t = rv.t
    a = rv.view("output")
    source = "output"
    rows = _relu_like_rows(rv, a) if a is not None else []
    if a is None:
        a = rv.view("gradient")
        source = "gradient"
        rows = _kernel_rows(a) if a is not None else []
    if a is None or not rows or a.n_points < t.min_points:
        return []
    dead = a.field("dead_rate")
    sampled = _sampled_activity(a) if source == "output" else np.zeros(dead.shape, bool)
    k = rv.sustain_points(a.n_points)
    levels = {"critical": t.dead_critical, "warning": t.dead_warning, "info": t.dead_info}
    flagged: list[tuple[int, int, int]] = []  # (level rank, row, first column)
    for i in rows:
        for rank, lv in enumerate(_LEVELS):
            j = first_sustained(dead[i] >= levels[lv], k)
            if j is not None:
                # A dead rate counted on some steps only (not a rectifier's output) can
                # call a unit dead that fires on the other steps: one level lower.
                low = bool(sampled[i, j])
                flagged.append((min(rank + low, len(_LEVELS) - 1), i, j))
                break
    if not flagged:
        return []
    # Most severe first, then the layer nearest the input (where the death starts to matter).
    flagged.sort(key=lambda f: (f[0], a.series[f[1]].info.depth))
    top_rank = flagged[0][0]
    level = _LEVELS[top_rank]
    at_level = [f for f in flagged if f[0] == top_rank]
    worst = max(at_level, key=lambda f: (nanmax(dead[f[1]]), -a.series[f[1]].info.depth))[1]
    j0 = min(f[2] for f in at_level)
    step, epoch = rv.step_epoch(a, j0)
    name = a.series[worst].info.layer
    others = [f for f in flagged if f[1] != worst]
    over_warning = sum(1 for f in others if f[0] <= 1)
    more = ""
    if over_warning:
        more = (f" (and {over_warning} more layer{'s' if over_warning > 1 else ''} over"
                f" {pct(t.dead_warning)})")
    zero_grad = _zero_gradient_layers(rv)
    what = "channels" if source == "output" else "units"
    expl = (
        "A ReLU unit whose input is negative for every sample outputs 0 and passes no"
        " gradient, so it cannot recover: it is dead. Some dead units are common; when a large"
        " share of a layer dies the layer loses capacity, and when a whole layer dies no"
        " gradient reaches the layers below it. Dying usually follows a learning rate that is"
        " too high (a large update pushes the units' biases far negative) or a bad"
        " initialisation."
    )
    if source == "gradient":
        expl += (" (Measured on the gradients: these units' incoming weights received exactly"
                 " zero gradient over the logging window; log the output view for channel"
                 " dead rates.)")
    if zero_grad:
        expl += (f" Here {len(zero_grad)} layer(s) receive exactly zero gradient"
                 f" ({', '.join(zero_grad[:4])}).")
    ordered = [worst] + [f[1] for f in others]
    # On the points so far: when no layer of that level is still there at the latest point
    # (units came back, as in a healthy CNN's early epochs), one level lower.
    threshold = levels[level]
    recovered = not any(np.nan_to_num(dead[f[1], -1], nan=1.0) >= threshold for f in at_level)
    severity = _LEVELS[min(top_rank + 1, len(_LEVELS) - 1)] if recovered else level
    # Half a layer dead while the loss came most of the way down: the units left carry the
    # task (a PyTorch CNN's dense layer at Adam 3e-3, 100% training accuracy). A whole
    # layer dead stays critical: nothing passes it.
    learned = severity == "warning" and bool(loss_came_down(rv))
    if learned:
        severity = "info"
        expl += (" Here the loss still came most of the way down: the units left alive carry"
                 " the task, and the dead ones are capacity the run did not need.")
    now = f" (now {pct(float(dead[worst, -1]))})" if recovered else ""
    if recovered:
        expl += (" The dead share has since fallen below that level again, so the layer"
                 " recovered at least in part.")
    return [Finding(
        kind="dead_units",
        severity=severity,
        title=(f"Dead units: {pct(nanmax(dead[worst]))} of the {what} of '{name}' were"
               f" dead{more}{now}" if recovered else
               f"Dead units: {pct(nanmax(dead[worst]))} of the {what} of '{name}' are"
               f" dead{more}"),
        first_step=step, first_epoch=epoch,
        layers=unique(a.series[i].info.layer for i in ordered),
        tags=[a.series[i].info.tag for i in ordered],
        view=source,
        evidence={
            "worst_layer": name,
            "worst_dead_rate": nanmax(dead[worst]),
            "worst_dead_rate_at_end": float(dead[worst, -1]),
            "layers_flagged": len(flagged),
            "loss_came_down": learned,
            "layers_over_warning": sum(1 for f in flagged if f[0] <= 1),
            "layers_checked": len(rows),
            "layers_without_gradient": len(zero_grad),
            "source": source,
            "recovered": recovered,
            "threshold": threshold,
            "dead_rate_sampled": bool(sampled[worst].any()),
        },
        explanation=expl,
        suggestion=(
            "Lower the learning rate or use warm-up; use LeakyReLU/ELU/GELU instead of ReLU;"
            " use He initialisation and zero (not negative) biases; add batch normalisation"
            " before the activation; if the layer is simply oversized, it may be pruned."
        ),
        jump={"tab": "layers", "view": source, "tag": a.series[worst].info.tag,
              "chart": "activity"},
    )]


def _zero_gradient_layers(rv: RunView) -> list[str]:
    """Layers whose every gradient tensor is exactly zero at the last logged point."""
    g = rv.view("gradient")
    if g is None:
        return []
    rms = g.field("rms")[:, -1]
    by_layer: dict[str, list[float]] = {}
    for i, s in enumerate(g.series):
        by_layer.setdefault(s.info.layer, []).append(float(rms[i]))
    return [layer for layer, v in by_layer.items() if v and all(x == 0 for x in v)]


@rule("dying_units", needs=("output",))
def dying_units(rv: RunView) -> list[Finding]:
    """Activation rate of a rectified layer collapsing: below 5% and 4x below its start."""
    t = rv.t
    a = rv.view("output")
    if a is None or a.n_points < t.min_points:
        return []
    rows = _relu_like_rows(rv, a)
    if not rows:
        return []
    rate = a.field("activation_rate")
    dead = a.field("dead_rate")
    k = rv.sustain_points(a.n_points)
    flagged = []
    for i in rows:
        have = np.flatnonzero(np.isfinite(rate[i]))
        if have.size < t.min_points:
            continue
        start = float(np.median(rate[i, have[: max(1, min(3, have.size // 4))]]))
        # Dead units already explain a collapse of the rate; "dying" is about live units
        # that fire ever more rarely.
        if nanmax(dead[i]) >= t.dead_warning:
            continue
        mask = (rate[i] < t.dying_activation_rate) & (rate[i] * t.dying_drop_factor < start)
        j = first_sustained(mask, k)
        if j is not None:
            flagged.append((i, j, start))
    if not flagged:
        return []
    i, j0, start = min(flagged, key=lambda f: f[1])
    step, epoch = rv.step_epoch(a, j0)
    name = a.series[i].info.layer
    return [Finding(
        kind="dying_units",
        severity="warning",
        title=(f"Dying units: the activation rate of '{name}' fell from {pct(start)} to"
               f" {pct(float(nanmin(rate[i])))}"),
        first_step=step, first_epoch=epoch,
        layers=[a.series[f[0]].info.layer for f in flagged],
        tags=[a.series[f[0]].info.tag for f in flagged],
        view="output",
        evidence={
            "activation_rate_start": start,
            "activation_rate_min": float(nanmin(rate[i])),
            "activation_rate_at_end": float(rate[i, -1]),
            "dead_rate_at_end": float(dead[i, -1]),
            "layers_flagged": len(flagged),
            "threshold_rate": t.dying_activation_rate,
        },
        explanation=(
            "The units of this layer fire for an ever smaller share of the inputs. They are"
            " not dead yet (each still fires for some sample), but the layer is heading there:"
            " its outputs and the gradients through it become sparse and the layer learns"
            " slowly."
        ),
        suggestion=(
            "Lower the learning rate; use LeakyReLU/ELU/GELU; add normalisation before the"
            " activation; check that biases are not drifting negative (variable view)."
        ),
        jump={"tab": "layers", "view": "output", "tag": a.series[i].info.tag,
              "chart": "activity"},
    )]


def quantile_cdf(values: np.ndarray, quantiles: np.ndarray, x: float) -> np.ndarray:
    """Share of values <= ``x`` at each point, from its percentile values (linear interpolation).

    ``values`` is (points x percentile points), ``quantiles`` the percentile points (0..100).
    """
    v = np.maximum.accumulate(np.atleast_2d(np.asarray(values, dtype=np.float64)), axis=1)
    q = np.asarray(quantiles, dtype=np.float64) / 100.0
    hi = (v <= x).sum(axis=1)  # first percentile point above x
    inside = (hi > 0) & (hi < v.shape[1])
    h = np.clip(hi, 1, v.shape[1] - 1)
    lo_v = np.take_along_axis(v, (h - 1)[:, None], axis=1)[:, 0]
    hi_v = np.take_along_axis(v, h[:, None], axis=1)[:, 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = (x - lo_v) / (hi_v - lo_v)
    mid = q[h - 1] + frac * (q[h] - q[h - 1])
    return np.where(inside, mid, np.where(hi == 0, 0.0, 1.0))


def _saturated_share(s, kind: str, margin: float) -> np.ndarray:
    """Per point of series ``s``: share of values within ``margin`` of the function's bounds."""
    qs = np.asarray(s.info.quantiles, dtype=np.float64)
    if qs.size < 2 or not all(s.has(f"q{q:g}") for q in qs):
        return np.full(len(s), np.nan)
    vals = np.column_stack([s.field(f"q{q:g}") for q in qs])
    lo, hi = (-1.0 + margin, 1.0 - margin) if kind == "tanh" else (margin, 1.0 - margin)
    # Values strictly inside (lo, hi) are unsaturated.
    share = quantile_cdf(vals, qs, lo) + (1.0 - quantile_cdf(vals, qs, np.nextafter(hi, -1)))
    return np.where(np.isfinite(vals).all(axis=1), share, np.nan)


def _squashing_kind(s) -> str | None:
    """"tanh" or "sigmoid" when a tensor's values stay in that function's range, else None."""
    lo, hi = nanmin(s.field("min")), nanmax(s.field("max"))
    zero = nanmax(s.field("zero_fraction"))
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return None
    eps = 1e-6
    # Rectified outputs have many exact zeros; squashing functions almost never give 0.
    if not np.isfinite(zero) or zero > 0.01:
        return None
    if lo >= -eps and hi <= 1 + eps:
        return "sigmoid"
    if lo >= -1 - eps and hi <= 1 + eps and lo < 0:
        return "tanh"
    return None


@rule("saturated_units", needs=("output",))
def saturated_units(rv: RunView) -> list[Finding]:
    """Share of tanh/sigmoid-range outputs within 1% of the bounds, sustained."""
    t = rv.t
    a = rv.view("output")
    if a is None or a.n_points < t.min_points:
        return []
    k = rv.sustain_points(a.n_points)
    flagged = []
    for i in model_rows(rv, a):
        s = a.series[i]
        kind = _squashing_kind(s)
        if kind is None:
            continue
        share = np.full(a.n_points, np.nan)
        share[np.searchsorted(a.steps, s.steps)] = _saturated_share(s, kind, t.saturation_margin)
        share[a.nonfinite_mask()[i]] = np.nan
        for level, thr in (("warning", t.saturation_warning), ("info", t.saturation_info)):
            j = first_sustained(share >= thr, k)
            if j is not None:
                flagged.append((level, i, j, kind, share))
                break
    if not flagged:
        return []
    level = "warning" if any(f[0] == "warning" for f in flagged) else "info"
    chosen = [f for f in flagged if f[0] == level]
    worst = max(chosen, key=lambda f: nanmax(f[4]))
    _, i, _, kind, share = worst
    j0 = min(f[2] for f in chosen)
    step, epoch = rv.step_epoch(a, j0)
    name = a.series[i].info.layer
    bounds = "-1 or 1" if kind == "tanh" else "0 or 1"
    threshold = t.saturation_warning if level == "warning" else t.saturation_info
    # On the points so far: no layer of that level still saturated at the latest point.
    recovered = not any(np.nan_to_num(f[4][-1], nan=1.0) >= threshold for f in chosen)
    return [Finding(
        kind="saturated_units",
        severity="info" if recovered else level,
        title=(f"Saturated {kind} units: {pct(float(nanmax(share)))} of the outputs of"
               f" '{name}' are within {t.saturation_margin:g} of {bounds}"),
        first_step=step, first_epoch=epoch,
        layers=[a.series[f[1]].info.layer for f in chosen],
        tags=[a.series[i].info.tag] + [a.series[f[1]].info.tag for f in chosen if f[1] != i],
        view="output",
        evidence={
            "worst_layer": name,
            "activation": kind,
            "saturated_share_max": float(nanmax(share)),
            "saturated_share_at_end": float(share[-1]),
            "saturated_share_median": float(nanmedian(share)),
            "layers_flagged": len(chosen),
            "recovered": recovered,
            "threshold_share": threshold,
        },
        explanation=(
            f"A {kind} unit near {bounds} has a derivative close to zero (below"
            f" {'2%' if kind == 'tanh' else '4%'} of its maximum at this margin), so almost no"
            " gradient passes through it: the unit and the layers below it stop learning."
            " Glorot & Bengio (2010) showed sigmoid layers saturating early in training this way;"
            " large inputs or weights, or a too-high learning rate, push units into saturation."
        ),
        suggestion=(
            "Standardise the inputs; use Glorot/Xavier initialisation (or smaller weights); add"
            " normalisation before the activation; prefer ReLU-family activations in hidden"
            " layers; lower the learning rate."
        ),
        jump={"tab": "layers", "view": "output", "tag": a.series[i].info.tag,
              "chart": "distribution"},
    )]
