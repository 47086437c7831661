"""Weight- and scale-level rules: weights that collapse, and a poor initialisation seen in
the layer outputs' scale across depth.

* ``weight_collapse``: the RMS of most kernels falls by an order of magnitude or more from
  its start. The start is not logged (the first variable point is the end of the first
  window), but the first ``update_ratio`` is measured against the weights at the start of
  training, so by the triangle inequality ||w_start|| >= ||w_first|| x (ratio - 1).
* ``poor_initialization``: at the first point, the output RMS of the hidden layers spreads
  over orders of magnitude: each layer scales its input by a factor far from 1, so the
  signal grows or shrinks geometrically with depth (SageMaker Debugger's
  PoorWeightInitialization compares the activations' variance across layers the same way).
"""

from __future__ import annotations

import numpy as np

from tb_introspect.diagnose.activity import model_rows
from tb_introspect.diagnose.core import (
    Finding,
    RunView,
    fmt_num,
    fmt_orders,
    log10_pos,
    pct,
    pow10,
    rule,
    trailing_run,
)


@rule("weight_collapse", needs=("variable",))
def weight_collapse(rv: RunView) -> list[Finding]:
    """Most kernels' RMS >= 10x below their start, on the latest >= 2 points."""
    t = rv.t
    a = rv.view("variable")
    if a is None or a.n_points < t.min_points:
        return []
    rows = [i for i, s in enumerate(a.series) if len(s.info.shape) >= 2]
    if not rows:
        return []
    sub = a.subset(rows)
    rms = sub.field("rms")
    ratio = sub.field("update_ratio")
    first = rms[:, 0]
    r0 = np.where(np.isfinite(ratio[:, 0]), ratio[:, 0], 0.0)
    start = np.maximum(first, first * (r0 - 1))
    have = np.isfinite(start) & (start > 0)
    if not have.any():
        return []
    # Orders below the start; a kernel that reached exactly zero has collapsed all the way.
    shrink = log10_pos(start)[:, None] - log10_pos(rms)
    shrink = np.where(rms == 0, np.inf, shrink)
    collapsed = (np.nan_to_num(shrink, nan=-np.inf) >= t.collapse_orders) & have[:, None]
    share = collapsed.sum(axis=0) / have.sum()
    n = trailing_run(share >= t.collapse_share)
    if n < 2:
        return []
    j = a.n_points - n
    step, epoch = rv.step_epoch(a, j)
    end = np.where(have, np.nan_to_num(shrink[:, -1], nan=-np.inf), -np.inf)
    order = [int(i) for i in np.argsort(-end, kind="stable")]
    worst = order[0]
    flagged = [i for i in order if collapsed[i, -1]]
    median_orders = float(np.median(np.minimum(end[have], 99.0)))
    return [Finding(
        kind="weight_collapse",
        severity="warning",
        title=(f"Weights collapsing: {pct(float(share[-1]))} of the kernels are 10x or more"
               f" below their starting scale; '{sub.series[worst].info.name}' RMS"
               f" {fmt_num(float(rms[worst, -1]))}, from about {fmt_num(float(start[worst]))}"),
        first_step=step, first_epoch=epoch,
        layers=sub.layers(flagged), tags=sub.tags(flagged), view="variable",
        evidence={
            "kernels_collapsed": int(collapsed[:, -1].sum()),
            "kernels_checked": int(have.sum()),
            "share_collapsed": float(share[-1]),
            "median_orders_below_start": median_orders,
            "worst_tensor": sub.series[worst].info.name,
            "worst_rms_at_end": float(rms[worst, -1]),
            "worst_rms_start_estimate": float(start[worst]),
            "threshold_orders": t.collapse_orders,
            "threshold_share": t.collapse_share,
        },
        explanation=(
            "The weights of most layers shrank by an order of magnitude or more since training"
            " started. Gradients of the data loss cannot do that on their own; a penalty that"
            " pulls every weight to zero can: an L2 regulariser or weight decay far too large"
            " for the learning rate (each step multiplies the weights by 1 - lr x decay)."
            " With weights near zero the model's output no longer depends on its input."
        ),
        suggestion=(
            "Lower the L2 factor or weight decay by orders of magnitude (1e-4 to 1e-2 is"
            " usual; with AdamW, decay is multiplied by the learning rate); check that the"
            " regulariser is not applied twice (kernel_regularizer and optimizer decay)."
        ),
        jump={"tab": "layers", "view": "variable", "tag": sub.series[worst].info.tag,
              "chart": "rms"},
    )]


def _softmax_like(s) -> bool:
    width = s.info.shape[-1] if s.info.shape else 0
    if width < 2:
        return False
    lo, hi, mean = s.field("min"), s.field("max"), s.field("mean")
    ok = np.isfinite(mean)
    return bool(ok.any() and np.all(lo[ok] >= 0) and np.all(hi[ok] <= 1 + 1e-6)
                and np.all(np.abs(mean[ok] * width - 1) <= 0.01))


def _normalised(rv: RunView, a, i: int, col: int) -> bool:
    """Whether output ``s`` is a normalisation's (LayerNorm, RMSNorm, BatchNorm): a layer
    without a kernel (at most a gain and a bias) whose output has RMS 1 and mean 0 (within
    ``init_norm_tolerance``) at the first point (column ``col`` of row ``i``)."""
    s = a.series[i]
    kernels = rv.memo.get("kernel_layers")
    if kernels is None:
        kernels = {v.info.layer for view in ("variable", "gradient")
                   for v in rv.run.tensors.get(view, []) if len(v.info.shape) >= 2}
        rv.memo["kernel_layers"] = kernels
    if s.info.layer in kernels:
        return False
    rms, mean = float(a.field("rms")[i, col]), float(a.field("mean")[i, col])
    tol = rv.t.init_norm_tolerance
    return bool(np.isfinite(rms) and np.isfinite(mean) and abs(rms - 1) <= tol
                and abs(mean) <= tol)


@rule("poor_initialization", needs=("output",), needs_history=False)
def poor_initialization(rv: RunView) -> list[Finding]:
    """Hidden layers' output RMS at the first point spread over >= 2 orders of magnitude."""
    t = rv.t
    a = rv.view("output")
    if a is None or a.n_points < 1:
        return []
    # A hidden softmax (attention weights built from layers, a gate over experts) has the
    # scale 1/width by construction, not by its initialisation.
    rows = [i for i in model_rows(rv, a) if not _softmax_like(a.series[i])]
    if len(rows) < 2:
        return []
    logs_all = log10_pos(a.field("rms")[rows])
    col = int(np.argmax(np.isfinite(logs_all).sum(axis=0) >= 2)) if logs_all.size else 0
    # Judged per stretch between normalisations. A normalisation's output has RMS 1 by
    # construction, whatever came before it, and in a residual network each block's branch
    # starts from one (pre-norm: x + f(norm(x))): the branch's last projection is small by
    # design (GPT-2 and Llama scale it down), and comparing it with a norm's output, or with
    # another block's branch, measures the architecture, not the initialisation. Within a
    # stretch the signal goes through one chain of layers, where a scale that shrinks or
    # grows layer after layer is what a poor initialisation does.
    segments: list[list[int]] = [[]]
    norms = 0
    for r in rows:
        if _normalised(rv, a, r, col):
            norms += 1
            segments.append([])
        else:
            segments[-1].append(r)
    best: tuple[float, list[int], np.ndarray] | None = None
    for seg in segments:
        if len(seg) < 2:
            continue
        first_seg = log10_pos(a.field("rms")[seg])[:, col]
        if np.isfinite(first_seg).sum() < 2:
            continue
        spread_seg = float(np.nanmax(first_seg) - np.nanmin(first_seg))
        if best is None or spread_seg > best[0]:
            best = (spread_seg, seg, first_seg)
    if best is None:
        return []
    spread, rows, first = best
    if spread < t.init_scale_orders:
        return []
    logs = log10_pos(a.field("rms")[rows])
    ok = np.isfinite(first)
    idx = np.flatnonzero(ok)
    hi, lo = int(idx[np.argmax(first[ok])]), int(idx[np.argmin(first[ok])])
    shrinking = a.series[rows[lo]].info.depth > a.series[rows[hi]].info.depth
    last = logs[:, -1]
    spread_end = float(np.nanmax(last) - np.nanmin(last)) if np.isfinite(last).sum() >= 2 else None
    evened = spread_end is not None and a.n_points > 1 and spread_end < t.init_scale_orders
    big, small = a.series[rows[hi]].info.layer, a.series[rows[lo]].info.layer
    way = "shrinks" if shrinking else "grows"
    step, epoch = rv.step_epoch(a, col)
    return [Finding(
        kind="poor_initialization",
        severity="info" if evened else "warning",
        title=(f"Poor initialisation: the layer-output scale {way} {fmt_orders(spread)}x with"
               f" depth at the first point ('{big}' RMS {fmt_num(pow10(first[hi]))},"
               f" '{small}' {fmt_num(pow10(first[lo]))})"),
        first_step=step, first_epoch=epoch,
        layers=[small if shrinking else big, big if shrinking else small],
        tags=[a.series[rows[lo]].info.tag, a.series[rows[hi]].info.tag], view="output",
        evidence={
            "direction": "shrinking" if shrinking else "growing",
            "orders_spread": spread,
            "orders_spread_at_end": spread_end,
            "largest_layer": big,
            "largest_rms": pow10(first[hi]),
            "smallest_layer": small,
            "smallest_rms": pow10(first[lo]),
            "layers_compared": int(ok.sum()),
            "normalisations": norms,
            "threshold_orders": t.init_scale_orders,
        },
        explanation=(
            "At the start of training the scale of the hidden layers' outputs differs by"
            f" {fmt_orders(spread)} across depth: each layer multiplies its input's scale by a"
            " factor far from 1, so the signal " + ("vanishes" if shrinking else "explodes")
            + " geometrically on the way up, and the gradients on the way down do the same."
            " Initialisers keep this factor near 1 for their activation (He for ReLU, Glorot"
            " for tanh/sigmoid); weights set by hand, or a stddev that ignores the fan-in,"
            " break it."
            + (" The scales have since evened out (training or normalisation fixed it)."
               if evened else "")
        ),
        suggestion=(
            "Use the initialiser matched to the activation (he_normal for ReLU, glorot_uniform"
            " for tanh/sigmoid) instead of a fixed stddev; add normalisation (BatchNorm,"
            " LayerNorm) between layers; or use residual connections."
        ),
        jump={"tab": "overview", "view": "output", "chart": "stack"},
    )]
