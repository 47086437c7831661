"""Gradient-flow rules: which parts of a layer's gradient are exactly zero, and why.

* ``no_gradient``: a layer whose gradient is exactly zero at every point from the first
  (a ``stop_gradient``, a non-differentiable op or a disconnected branch below a named
  layer); named by the boundary between the last layer without and the first with gradient.
* ``gradient_activity``: the article's gradient activation rate (share of non-zero gradient
  entries of a kernel) "should always be near 100%"; a sustained drop is flagged.
* ``zero_gradients``: most of a kernel's gradient exactly zero, explained as the
  training-instrumentation toolkit's ``explain_near_zero_gradients`` does, from the logged
  dead rates: dead inputs (rows of the kernel), zero output gradients or the layer's own dead
  units (columns).

Kernel gradients only (rank >= 2 tensors): a kernel entry (i, j) of a dense or conv layer
is zero when input channel i or output channel j carries nothing for every sample of the
logging window, which is what the dead rates measure.
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
    pct,
    rule,
)
from tb_introspect.diagnose.loss import loss_came_down


def _layer_rows(a: Aligned) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for i, s in enumerate(a.series):
        out.setdefault(s.info.layer, []).append(i)
    return out


def _layers_without_gradient(rv: RunView) -> list[str]:
    """Layers whose every gradient tensor is exactly zero at every logged point (>= min_points)."""
    if "no_gradient_layers" in rv.memo:
        return rv.memo["no_gradient_layers"]
    a = rv.view("gradient")
    out: list[str] = []
    if a is not None:
        rms = a.field("rms")
        for layer, rows in _layer_rows(a).items():
            r = rms[rows]
            seen = np.isfinite(r).any(axis=0)
            if seen.sum() >= rv.t.min_points and np.all(np.where(np.isfinite(r), r, 0.0) == 0):
                out.append(layer)
    rv.memo["no_gradient_layers"] = out
    return out


def _depths(a: Aligned) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in a.series:
        out.setdefault(s.info.layer, s.info.depth)
    return out


@rule("no_gradient", needs=("gradient",))
def no_gradient(rv: RunView) -> list[Finding]:
    """Layers whose gradient is exactly zero at every logged point, named by their boundary."""
    zero = _layers_without_gradient(rv)
    a = rv.view("gradient")
    if not zero or a is None:
        return []
    depth = _depths(a)
    zero = sorted(zero, key=lambda la: depth[la])
    live = sorted((la for la in depth if la not in zero), key=lambda la: depth[la])
    # One boundary per group of zero layers: the deepest layer of the group and the first
    # layer above it that does receive a gradient.
    boundaries: list[tuple[str, str | None]] = []
    for la in zero:
        above = next((g for g in live if depth[g] > depth[la]), None)
        if boundaries and boundaries[-1][1] == above:
            boundaries[-1] = (la, above)
        else:
            boundaries.append((la, above))
    lower, upper = boundaries[0]
    between = _layers_between(rv, depth[lower], depth[upper] if upper else None)
    via = f" (through {', '.join(repr(x) for x in between)})" if between else ""
    where = (f"between '{lower}' and '{upper}'{via}" if upper else
             f"above '{lower}': no layer above it receives a gradient")
    others = len(zero) - 1
    more = f" and {others} more layer{'s' if others > 1 else ''}" if others else ""
    step, epoch = rv.step_epoch(a, 0)
    rows = [i for la in zero for i in _layer_rows(a)[la]]
    dead = _dead_throughout(rv, lower)
    return [Finding(
        kind="no_gradient",
        severity="warning",
        title=f"No gradient reaches '{zero[-1]}'{more}: the gradient stops {where}",
        first_step=step, first_epoch=epoch,
        layers=zero[::-1],
        tags=a.tags(rows),
        view="gradient",
        evidence={
            "layers_without_gradient": len(zero),
            "layers_with_gradient": len(live),
            "boundary_below": lower,
            "boundary_above": upper,
            "boundaries": "; ".join(f"{lo} | {up or '-'}" for lo, up in boundaries),
            "points_all_zero": int(a.n_points),
            "cause": "dead units" if dead else "cut between the layers",
        },
        explanation=(
            "The gradient of these layers' weights is exactly zero at every logged point,"
            " from the first: no error signal reaches them, so they never learn and keep"
            " their initial weights. "
            + (f"Here every unit of '{lower}' is dead at every logged point (its output is"
               " zero for every sample): a rectifier below zero passes no gradient, so"
               " nothing reaches its weights or any layer below it (see dead_units)."
               if dead else
               "A gradient that is exactly zero everywhere (not just small) is cut by the"
               " graph, not weakened by it: a stop_gradient (or .detach()), a"
               " non-differentiable op (argmax, round, casting to an integer, a comparison)"
               " or a branch whose output does not reach the loss, between the two layers"
               " named.")
        ),
        suggestion=(
            "Bring the units back to life: an initialisation that centres the"
            " pre-activations (zero biases, He/Glorot weights), a lower learning rate, or a"
            " leaky activation (LeakyReLU, GELU)."
            if dead else
            "Look at what the model computes between the two layers named: remove the"
            " stop_gradient or replace the non-differentiable op with a differentiable"
            " surrogate (softmax for argmax, a straight-through estimator for rounding);"
            " if the layers are meant to be frozen, set trainable=False so that they are"
            " not monitored as trainable."
        ),
        jump={"tab": "layers", "view": "gradient", "tag": a.series[rows[-1]].info.tag,
              "chart": "rms"},
    )]


def _dead_throughout(rv: RunView, layer: str) -> bool:
    """Whether every unit of ``layer``'s output is dead (zero for every sample) at every
    logged point."""
    out = rv.view("output")
    if out is None:
        return False
    rates = [s.field("dead_rate") for s in out.series
             if s.info.layer == layer and s.has("dead_rate") and len(s)]
    return bool(rates) and all(np.all(r >= 1.0) for r in rates)


def _layers_between(rv: RunView, lo: int, hi: int | None) -> list[str]:
    """Names of the layers (output view) strictly between depths ``lo`` and ``hi``."""
    out = rv.view("output")
    if out is None or hi is None:
        return []
    names = {s.info.layer: s.info.depth for s in out.series if lo < s.info.depth < hi}
    return sorted(names, key=lambda la: names[la])


def _kernel_rows(rv: RunView, a: Aligned) -> list[int]:
    skip = set(_layers_without_gradient(rv))
    return [i for i, s in enumerate(a.series)
            if len(s.info.shape) >= 2 and s.info.layer not in skip
            and not _lookup_table(rv, s)]


def _lookup_table(rv: RunView, s) -> bool:
    """Whether gradient tensor ``s`` is a lookup table's (PyTorch ``nn.Embedding``, weight
    [entries, width]): its layer's output ends in the table's width, not in its first
    dimension as a ``Linear``'s [out, in] weight does. Only the rows looked up get a
    gradient, so rows of ids the data never uses (BERT's second token type in single-segment
    text, words absent from the batches) are exactly zero by design, not dead units. A
    Keras ``Dense`` kernel ([in, out]) has the same layout as a table and is not told apart:
    Keras's own embeddings are judged as before."""
    shape = s.info.shape
    if len(shape) != 2 or shape[0] == shape[1] or not s.info.name.endswith("/weight"):
        return False
    out = rv.view("output")
    o = next((x for x in out.series if x.info.layer == s.info.layer), None) if out else None
    return bool(o is not None and o.info.shape and o.info.shape[-1] == shape[1])


@rule("gradient_activity", needs=("gradient",))
def gradient_activity(rv: RunView) -> list[Finding]:
    """A kernel's gradient activation rate below 50% and 25 points below its start, sustained."""
    t = rv.t
    a = rv.view("gradient")
    if a is None or a.n_points < t.min_points:
        return []
    rate = a.field("activation_rate")
    k = rv.sustain_points(a.n_points)
    flagged = []
    for i in _kernel_rows(rv, a):
        have = np.flatnonzero(np.isfinite(rate[i]))
        if have.size < t.min_points:
            continue
        start = float(np.median(rate[i, have[: max(1, min(3, have.size // 4))]]))
        mask = (rate[i] < t.grad_active_low) & (rate[i] <= start - t.grad_active_drop)
        j = first_sustained(mask, k)
        if j is not None:
            flagged.append((i, j, start))
    if not flagged:
        return []
    # The layer nearest the input first: below it nothing learns either.
    flagged.sort(key=lambda f: (f[1], a.series[f[0]].info.depth))
    i, j0, start = flagged[0]
    step, epoch = rv.step_epoch(a, j0)
    name = a.series[i].info.layer
    low = float(np.nanmin(rate[i]))
    learned = bool(loss_came_down(rv))
    return [Finding(
        kind="gradient_activity",
        # A rate that fell while the loss came most of the way down: units died that the
        # task did without (a PyTorch CNN's dense layer at Adam 3e-3): info.
        severity="info" if learned else "warning",
        title=(f"Gradient activation rate of '{name}' fell from {pct(start)} to {pct(low)}"
               " (should stay near 100%)"),
        first_step=step, first_epoch=epoch,
        layers=[a.series[f[0]].info.layer for f in flagged],
        tags=[a.series[f[0]].info.tag for f in flagged],
        view="gradient",
        evidence={
            "activation_rate_start": start,
            "loss_came_down": learned,
            "activation_rate_min": low,
            "activation_rate_at_end": float(rate[i, -1]),
            "tensors_flagged": len(flagged),
            "threshold_rate": t.grad_active_low,
            "threshold_drop": t.grad_active_drop,
        },
        explanation=(
            "The gradient activation rate is the share of a weight tensor's gradient entries"
            " that are non-zero. It should always be near 100%: every weight should receive"
            " some error signal from some sample. A sustained drop means part of the layer"
            " has stopped learning: the units feeding it output zero for every sample (dead"
            " inputs), or the units it feeds pass no gradient back (dead or saturated units,"
            " zero output gradients). Unlike a small gradient, a zero gradient cannot be"
            " helped by a larger learning rate. The zero_gradients finding, when present,"
            " names the cause."
        ),
        suggestion=(
            "Find the dead units (Activity tab, dead rate) in this layer and the one below"
            " it; lower the learning rate or use warm-up; use LeakyReLU/ELU/GELU; add"
            " normalisation before the activation."
        ),
        jump={"tab": "layers", "view": "gradient", "tag": a.series[i].info.tag,
              "chart": "activity"},
    )]


def _input_layer(out: Aligned, depth: int) -> int | None:
    """Row of the output view feeding a layer at ``depth``: the deepest layer below it."""
    below = [i for i, s in enumerate(out.series) if s.info.depth < depth]
    return max(below, key=lambda i: out.series[i].info.depth) if below else None


def _row_of_layer(a: Aligned | None, layer: str) -> int | None:
    if a is None:
        return None
    return next((i for i, s in enumerate(a.series) if s.info.layer == layer), None)


def _at(a: Aligned | None, name: str, row: int | None, step: int) -> float:
    """Field ``name`` of ``row`` of ``a`` at ``step`` (NaN when absent)."""
    if a is None or row is None:
        return float("nan")
    j = np.searchsorted(a.steps, step)
    if j >= a.n_points or a.steps[j] != step:
        return float("nan")
    return float(a.field(name)[row, j])


@rule("zero_gradients", needs=("gradient",))
def zero_gradients(rv: RunView) -> list[Finding]:
    """Most of a kernel's gradient exactly zero, sustained; the cause from the dead rates."""
    t = rv.t
    a = rv.view("gradient")
    if a is None or a.n_points < t.min_points:
        return []
    zf = a.field("zero_fraction")
    k = rv.sustain_points(a.n_points)
    flagged = []
    for i in _kernel_rows(rv, a):
        j = first_sustained(zf[i] >= t.zero_grad_share, k)
        if j is not None:
            flagged.append((i, j))
    if not flagged:
        return []
    out, og = rv.view("output"), rv.view("output_gradient")
    explained = [(i, j, _explain(rv, a, i, out, og)) for i, j in flagged]
    i, j0, (causes, ev) = max(explained, key=lambda f: (nanmax(zf[f[0]]),
                                                       -a.series[f[0]].info.depth))
    j0 = min(j for _, j, _ in explained)
    step, epoch = rv.step_epoch(a, j0)
    s = a.series[i]
    # Zeros that came with training (units that died on the way: below the share at every
    # flagged kernel's first point) while the loss came most of the way down cost nothing
    # the run needed: info. Zeros there from the first point are the model's structure (a
    # cut, outputs no loss reads, inputs dead by their initialisation): the warning.
    grew = all(np.nan_to_num(zf[f[0], 0], nan=1.0) < t.zero_grad_share for f in flagged)
    died = grew and bool(loss_came_down(rv))
    why = " and ".join(c[0] for c in causes) if causes else "cause not in the logged views"
    detail = " ".join(c[1] for c in causes)
    if not causes:
        detail = ("Neither the layer's inputs nor its output gradients (if logged) are zero"
                  " often enough to account for it; log the output and output-gradient views"
                  " to see the dead rates, or look for inputs that are constant zero in the"
                  " data (e.g. always-blank pixels).")
    return [Finding(
        kind="zero_gradients",
        severity="info" if died else "warning",
        title=(f"Zero gradients: {pct(float(nanmax(zf[i])))} of the gradient of '{s.info.name}'"
               f" is exactly zero: {why}"),
        first_step=step, first_epoch=epoch,
        layers=[s.info.layer] + [a.series[f[0]].info.layer for f in explained
                                 if a.series[f[0]].info.layer != s.info.layer],
        tags=[s.info.tag] + [a.series[f[0]].info.tag for f in explained if f[0] != i],
        view="gradient",
        evidence={
            "zero_fraction_max": float(nanmax(zf[i])),
            "zero_fraction_median": float(nanmedian(zf[i])),
            "causes": ", ".join(c[0] for c in causes) or "unexplained",
            "died_while_learning": died,
            **ev,
            "tensors_flagged": len(flagged),
            "threshold_share": t.zero_grad_share,
        },
        explanation=(
            "Most of this weight gradient is exactly zero over the logging window. An entry"
            " (i, j) of a dense or convolution kernel's gradient is the sum over samples of"
            " input channel i times the gradient arriving at output channel j, so it is zero"
            " when input i is zero for every sample (dead inputs: the layer below has dead"
            " units), when output j receives no gradient (zero output gradients: nothing"
            " above uses it, or the units above are dead), or when this layer's own unit j"
            f" never fires (a dead ReLU passes no gradient). Here: {detail}"
        ),
        suggestion=(
            "Dead inputs or own dead units: lower the learning rate, use LeakyReLU/ELU/GELU,"
            " He initialisation and zero biases, or normalisation before the activation."
            " Zero output gradients: check that the layer's outputs are used (a slice or"
            " branch that drops channels) and that the layer above is alive."
        ),
        jump={"tab": "layers", "view": "gradient", "tag": s.info.tag, "chart": "activity"},
    )]


def _explain(rv: RunView, a: Aligned, i: int, out: Aligned | None,
             og: Aligned | None) -> tuple[list[tuple[str, str]], dict]:
    """Causes ``[(short, sentence)]`` of the zero share of kernel ``i`` at its worst point."""
    t = rv.t
    zf = a.field("zero_fraction")[i]
    j = int(np.nanargmax(np.where(np.isfinite(zf), zf, -1.0)))
    step = int(a.steps[j])
    s = a.series[i]
    share = float(zf[j])
    in_row = _input_layer(out, s.info.depth) if out is not None else None
    dead_in = _at(out, "dead_rate", in_row, step)
    own_dead = _at(out, "dead_rate", _row_of_layer(out, s.info.layer), step)
    zero_out = _at(og, "dead_rate", _row_of_layer(og, s.info.layer), step)
    enough = t.zero_cause_share * share
    causes: list[tuple[str, str]] = []
    in_name = out.series[in_row].info.layer if in_row is not None else None
    if np.isfinite(dead_in) and dead_in >= enough:
        causes.append(("dead inputs", f"{pct(dead_in)} of the channels of '{in_name}' (its"
                       " input) are zero for every sample."))
    if np.isfinite(zero_out) and zero_out >= enough:
        causes.append(("zero output gradients", f"{pct(zero_out)} of its output channels"
                       " receive exactly zero gradient from the layers above."))
    if np.isfinite(own_dead) and own_dead >= enough and not (
            np.isfinite(zero_out) and zero_out >= own_dead):
        causes.append(("dead units", f"{pct(own_dead)} of its own units never fire."))
    ev = {"zero_fraction_at_worst": share, "worst_step": step,
          "input_layer": in_name, "input_dead_rate": dead_in,
          "output_gradient_dead_rate": zero_out, "own_dead_rate": own_dead}
    return causes, ev
