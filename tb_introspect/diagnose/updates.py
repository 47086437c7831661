"""Update-to-weight ratio: ||w_t - w_prev|| / ||w_t|| per step, against Karpathy's ~1e-3.

A logged ratio spans every training step since the previous logged point (n
steps). By the triangle inequality, ratio / n is a lower bound of the mean
per-step ratio, so "too high" is judged on it; for "too low" the larger
random-walk estimate ratio / sqrt(n) is used, so neither test fires because
of how many steps a point spans.
"""

from __future__ import annotations

import numpy as np

from tb_introspect.diagnose.core import (
    Finding,
    RunView,
    first_sustained,
    fmt_num,
    nanmax,
    nanmedian,
    nanmin,
    rule,
)
from tb_introspect.diagnose.loss import loss_fell_since


@rule("update_ratio", needs=("variable",))
def update_ratio(rv: RunView) -> list[Finding]:
    """Per-step update ratio of a weight tensor 100x above 1e-3 (warning) or far below it (info)."""
    t = rv.t
    a = rv.view("variable")
    if a is None or a.n_points < t.min_points:
        return []
    # Kernels only: biases and norm parameters often start at 0 (ratio 1 at the first
    # point, meaningless) and follow their own scale.
    rows = [i for i, s in enumerate(a.series) if len(s.info.shape) >= 2 and s.has("update_ratio")]
    if not rows:
        return []
    sub = a.subset(rows)
    ratio = sub.field("update_ratio")
    if np.isfinite(ratio).sum(axis=1).max(initial=0) < t.min_points:
        return []
    span = a.span
    low_bound = ratio / span  # lower bound of the per-step ratio
    walk = ratio / np.sqrt(span)  # per-step ratio if the steps were random directions
    k = rv.sustain_points(a.n_points)
    out: list[Finding] = []

    high = [(i, first_sustained(low_bound[i] > t.update_ratio_high, k)) for i in range(len(rows))]
    high = [(i, j) for i, j in high if j is not None]
    if high:
        j0 = min(j for _, j in high)
        worst = max(high, key=lambda ij: nanmax(low_bound[ij[0]]))[0]
        step, epoch = rv.step_epoch(a, j0)
        name = sub.series[worst].info.name
        # Large steps the loss is paying off are the first steps of an adaptive optimizer
        # (Adam moves every weight by about the rate, whatever its scale: a full batch at
        # 1e-2 gives 0.1-0.2 of a freshly initialised kernel per step while its loss falls
        # fastest); the warning is for large steps that do not buy a lower loss.
        paying = loss_fell_since(rv, step)
        out.append(Finding(
            kind="update_ratio_high",
            severity="info" if paying else "warning",
            title=(f"Updates too large: each step changes '{name}' by at least"
                   f" {fmt_num(float(nanmax(low_bound[worst])))} of its norm (rule of thumb"
                   f" ~{t.update_ratio_target:g})"),
            first_step=step, first_epoch=epoch,
            layers=sub.layers([worst] + [i for i, _ in high if i != worst]),
            tags=sub.tags([worst] + [i for i, _ in high if i != worst]),
            view="variable",
            evidence={
                "worst_tensor": name,
                "per_step_ratio_max": float(nanmax(low_bound[worst])),
                "per_step_ratio_median": float(nanmedian(low_bound[worst])),
                "median_tensor_per_step_ratio": float(nanmedian(low_bound)),
                "tensors_flagged": len(high),
                "loss_fell_since": paying,
                "steps_per_point": float(np.median(span)),
                "threshold": t.update_ratio_high,
                "rule_of_thumb": t.update_ratio_target,
            },
            explanation=(
                "The size of a weight update relative to the weights themselves should be"
                " around 1e-3 per step (Karpathy, CS231n). Steps 100x larger rewrite a large"
                " part of the weights every step: training is unstable, units die or saturate,"
                " and the loss turns noisy or diverges."
            ),
            suggestion=(
                "Lower the learning rate (by about the factor shown), or add warm-up and decay;"
                " with Adam-type optimisers check epsilon and weight decay; clip gradients."
            ),
            jump={"tab": "layers", "view": "variable", "tag": sub.series[worst].info.tag,
                  "chart": "update_ratio"},
        ))

    # "Frozen": even the generous estimate stays below 1e-6 over the second half.
    half = a.n_points // 2
    frozen = []
    for i in range(len(rows)):
        tail = walk[i, half:]
        tail = tail[np.isfinite(tail)]
        if tail.size >= max(2, t.min_points - 1) and float(np.max(tail)) < t.update_ratio_low:
            frozen.append(i)
    if frozen:
        first_col = half
        step, epoch = rv.step_epoch(a, first_col)
        worst = min(frozen, key=lambda i: nanmax(walk[i, half:]))
        out.append(Finding(
            kind="update_ratio_low",
            severity="info",
            title=(f"Weights barely move: '{sub.series[worst].info.name}' changes by less than"
                   f" {t.update_ratio_low:g} of its norm per step"),
            first_step=step, first_epoch=epoch,
            layers=sub.layers(frozen), tags=sub.tags(frozen), view="variable",
            evidence={
                "tensors_flagged": len(frozen),
                "per_step_ratio_max_second_half": float(nanmax(walk[worst, half:])),
                "per_step_ratio_min": float(nanmin(walk[worst])),
                "threshold": t.update_ratio_low,
                "rule_of_thumb": t.update_ratio_target,
            },
            explanation=(
                "These weights change by less than a millionth of their size per step, 1000x"
                " below the ~1e-3 rule of thumb: they are effectively frozen. Either the"
                " learning rate is far too low (or decayed to nothing), or no gradient reaches"
                " them (vanishing gradients, dead units above them)."
            ),
            suggestion=(
                "Check the gradient view for vanishing or zero gradients in these layers; if"
                " the gradients are healthy, raise the learning rate or slow its decay."
            ),
            jump={"tab": "layers", "view": "variable", "tag": sub.series[worst].info.tag,
                  "chart": "update_ratio"},
        ))
    return out
