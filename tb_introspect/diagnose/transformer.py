"""Transformer signals: attention logit growth, output logit drift, massive activations, and
an update spike before a loss spike.

The first three read the run's probes (format 4, ``read.series.probes_of``: per layer output,
attention layer and output head, one value per logged point); the last the per-step loss
and the variable view's ``update_ratio``, so it applies to any run with those. The loss
spike itself is a loss rule (``loss.loss_spike``), whose spike score this one reads.
Thresholds: ``Thresholds`` (``attn_logit_*``, ``logit_*``, ``massive_*``, ``update_spike_*``,
``loss_spike_*``); why each: docs/findings.md, "Transformer signals".
"""

from __future__ import annotations

import numpy as np

from tb_introspect.diagnose.core import (
    Finding,
    RunView,
    first_sustained,
    fmt_num,
    fmt_times,
    nanmax,
    nanmedian,
    rule,
)
from tb_introspect.diagnose.loss import loss_fell_since, loss_spike_mask, loss_spike_scores
from tb_introspect.read.series import Probes, probes_of

#: Where the tab draws each probe: the Overview's Transformer section (frontend
#: views/transformer.js names its charts so).
CHARTS = {"attention": "probes-attn", "head": "probes-head", "massive": "probes-ratio",
          "kurtosis": "probes-kurtosis"}


def run_probes(rv: RunView) -> Probes | None:
    """The run's probes, read once per ``RunView``."""
    if "probes" not in rv.memo:
        rv.memo["probes"] = probes_of(rv.run)
    return rv.memo["probes"]


def _when(rv: RunView, p: Probes, j: int) -> tuple[int, int | None]:
    e = p.epochs[j]
    return int(p.steps[j]), (int(e) if np.isfinite(e) and not rv.step_based else None)


def _first_finite(x: np.ndarray) -> float:
    f = x[np.isfinite(x)]
    return float(f[0]) if f.size else np.nan


def _jump(chart: str) -> dict:
    return {"tab": "overview", "chart": CHARTS[chart]}


def _sustained_at(mask: np.ndarray, cols: np.ndarray, rv: RunView) -> int | None:
    """``first_sustained`` of ``mask`` over the points ``cols`` only (an index of all the
    points; the number of points sustained asks for counted over ``cols``). A paced run's
    probe points between its logged points (docs/options.md, "Probe points") hold the
    attention and head probes only: the layer outputs' probes, and the output view the
    rules compare them with, are at the logged points, and the probe points between two of
    them do not break a condition held at both."""
    if not cols.size:
        return None
    j = first_sustained(mask[cols], rv.sustain_points(cols.size))
    return None if j is None else int(cols[j])


# ---------------------------------------------------------------- attention logits


@rule("attention_logit_growth", needs=("probes",))
def attention_logit_growth(rv: RunView) -> list[Finding]:
    """An attention layer's largest |logit| above 100, or grown 10x to above 30 (warning)."""
    t = rv.t
    p = run_probes(rv)
    if p is None:
        return []
    x = p.field("attn_logit_max")
    k = rv.sustain_points(p.n_points)
    flagged: list[tuple[int, int, bool]] = []  # (row, first column, above the reference)
    for i in p.rows_with("attn_logit_max"):
        start = _first_finite(x[i])
        with np.errstate(invalid="ignore", divide="ignore"):
            high = x[i] > t.attn_logit_high
            grown = (x[i] / start >= t.attn_logit_growth) & (x[i] >= t.attn_logit_watch)
        jh, jg = first_sustained(high, k), first_sustained(grown, k)
        js = [j for j in (jh, jg) if j is not None]
        if js:
            flagged.append((i, min(js), jh is not None))
    if not flagged:
        return []
    # The title names a layer past the reference if any, else the earliest to grow; the
    # finding starts where the first layer's did.
    pool = [r for r in flagged if r[2]] or flagged
    i, _, above = min(pool, key=lambda r: (r[1], -nanmax(x[r[0]])))
    start, peak, last = _first_finite(x[i]), float(nanmax(x[i])), float(x[i][-1])
    step, epoch = _when(rv, p, min(r[1] for r in flagged))
    name = p.rows[i]
    title = (f"Attention logits above {t.attn_logit_high:g}: '{name}' reached"
             f" {fmt_num(peak)} (QK-clip threshold {t.attn_logit_high:g})" if above else
             f"Attention logits growing: '{name}' grew from {fmt_num(start)} to {fmt_num(peak)}")
    return [Finding(
        kind="attention_logit_growth",
        severity="warning",
        title=title,
        first_step=step, first_epoch=epoch,
        layers=[p.rows[r] for r, _, _ in sorted(flagged, key=lambda r: r[1])],
        evidence={
            "layer": name,
            "attn_logit_max_first": start,
            "attn_logit_max_peak": peak,
            "attn_logit_max_last": last,
            "growth_factor": peak / start if start > 0 else None,
            "layers_flagged": len(flagged),
            "threshold": t.attn_logit_high,
            "growth_threshold": t.attn_logit_growth,
            "watch_level": t.attn_logit_watch,
        },
        explanation=(
            "The largest pre-softmax attention logit (q.k/sqrt(d)) of this layer keeps"
            " growing. Once logits reach the hundreds the softmax collapses onto one key"
            " (attention entropy collapse), its gradient vanishes for the other keys, and"
            " training becomes unstable: the loss spikes or diverges (Dehghani et al. 2023,"
            " Wortsman et al. 2023). Megatron-LM clips the query/key weights when this"
            " logit passes 100 (--qk-clip-threshold)."
        ),
        suggestion=(
            "Normalise queries and keys (QK-norm: a LayerNorm/RMSNorm on q and k before the"
            " dot product), or clip them (QK-clip); lower the learning rate of the attention"
            " projections or add warm-up; check the weight decay of the q/k weights."
        ),
        jump=_jump("attention"),
    )]


# ---------------------------------------------------------------- output logits


def _steady(x: np.ndarray, sign: float, share: float) -> bool:
    """Whether ``x`` moves in direction ``sign`` between at least ``share`` of its
    consecutive finite points."""
    d = np.diff(x[np.isfinite(x)])
    return bool(d.size and np.mean(np.sign(d) == sign) >= share)


def _head_output(rv: RunView, name: str):
    """The output view's series of the head ``name`` (its logits), or None."""
    a = rv.view("output")
    if a is None:
        return None
    return next((s for s in a.series if s.info.name == name), None) or next(
        (s for s in a.series if s.info.layer == name), None)


def _per_position(head) -> bool:
    """Whether the head gives logits per position (a language model's head, logits of shape
    [batch, sequence, vocabulary]) rather than one row per sample (a classifier's). A head
    whose output was not logged is taken as a language model's: the rule as it was."""
    return head is None or len(head.info.shape) >= 3


def _level_drift(rv: RunView, head, p: Probes) -> tuple[int | None, float | None]:
    """Where the logits' level (their mean over the vocabulary, the part of log Z the
    softmax cannot see) moved ``logit_lse_drift`` nats from its first point, sustained and
    steadily; and how far it moved by the latest point."""
    if head is None or not head.has("mean"):
        return None, None
    mean = np.full(p.n_points, np.nan)
    at = np.searchsorted(p.steps, head.steps)
    ok = (at < p.n_points)
    ok[ok] &= p.steps[at[ok]] == head.steps[ok]
    mean[at[ok]] = head.field("mean")[ok]
    d = mean - _first_finite(mean)
    last = d[np.isfinite(d)]
    if not last.size:
        return None, None
    logged = np.flatnonzero(np.isin(p.steps, head.steps))  # the points with the head's output
    with np.errstate(invalid="ignore"):
        j = _sustained_at(np.abs(d) >= rv.t.logit_lse_drift, logged, rv)
    if j is not None and not _steady(mean, np.sign(last[-1]), rv.t.logit_steady_share):
        j = None
    return j, float(last[-1])


@rule("output_logit_drift", needs=("probes",))
def output_logit_drift(rv: RunView) -> list[Finding]:
    """The head's logsumexp drifting 10 nats from its start: a warning where that means a
    failure (a language model's head whose loss stopped improving, or any head whose logits'
    level itself moved 10 nats), else info; or its largest logit growing steadily 3x to
    above 30 (info)."""
    t = rv.t
    p = run_probes(rv)
    if p is None:
        return []
    lse, lmax = p.field("logit_lse"), p.field("logit_max")
    k = rv.sustain_points(p.n_points)
    out: list[Finding] = []
    for i in sorted(set(p.rows_with("logit_lse")) | set(p.rows_with("logit_max"))):
        d = lse[i] - _first_finite(lse[i])
        last = d[np.isfinite(d)]
        with np.errstate(invalid="ignore"):
            drift = np.abs(d) >= t.logit_lse_drift
        j_lse = first_sustained(drift, k)
        if j_lse is not None and not (last.size and _steady(lse[i], np.sign(last[-1]),
                                                              t.logit_steady_share)):
            j_lse = None
        m0 = _first_finite(lmax[i])
        with np.errstate(invalid="ignore", divide="ignore"):
            grown = ((lmax[i] >= t.logit_max_watch) & (m0 > 0)
                     & (lmax[i] / m0 >= t.logit_max_growth))
        j_max = first_sustained(grown, k)
        if j_max is not None and not _steady(lmax[i], 1.0, t.logit_steady_share):
            j_max = None
        if j_lse is None and j_max is None:
            continue
        j = min(c for c in (j_lse, j_max) if c is not None)
        step, epoch = _when(rv, p, j)
        name = p.rows[i]
        lse_end = float(last[-1]) + _first_finite(lse[i]) if last.size else np.nan
        head = _head_output(rv, name)
        per_position = _per_position(head)
        j_level, level_moved = _level_drift(rv, head, p)
        # log Z = the logits' level (their mean) + the spread the loss needs. A classifier
        # growing confident raises log Z through its spread, with its top logit, while the
        # softmax's gradient (p - y, summing to 0 over the classes) leaves the level alone:
        # that is learning, at any loss. What nothing in the loss holds is the level: a
        # level that moved 10 nats is the drift z-loss is for, in any head. A language
        # model's log Z drifting while its loss stopped improving is the drift that preceded
        # divergence in large models; while its loss still falls it is learning.
        learning = j_lse is not None and loss_fell_since(rv, step)
        failure = j_lse is not None and (j_level is not None or (per_position and not learning))
        if j_lse is not None:
            title = (f"Output logits drifting: the logsumexp of '{name}' moved"
                     f" {float(last[-1]):+.1f} nats to {fmt_num(lse_end)}")
        else:
            top = float(nanmax(lmax[i]))
            title = (f"Output logits growing: the largest logit of '{name}' grew"
                     f" {fmt_times(top / m0)} to {fmt_num(top)}")
        confident = j_lse is not None and not failure and not per_position
        out.append(Finding(
            kind="output_logit_drift",
            severity="warning" if failure else "info",
            title=title,
            first_step=step, first_epoch=epoch,
            layers=[name],
            evidence={
                "head": name,
                "per_position": per_position,
                "loss_fell_since": learning,
                "logit_level_drift": level_moved,
                "logit_lse_first": _first_finite(lse[i]),
                "logit_lse_last": lse_end,
                "logit_lse_drift": float(last[-1]) if last.size else None,
                "logit_max_first": m0,
                "logit_max_peak": float(nanmax(lmax[i])) if np.isfinite(lmax[i]).any() else None,
                "drift_threshold_nats": t.logit_lse_drift,
                "logit_max_growth_threshold": t.logit_max_growth,
                "logit_max_watch": t.logit_max_watch,
            },
            explanation=(
                "The softmax does not depend on a constant added to every logit, so nothing"
                " in the loss holds the logits' level: here it moves steadily away (the"
                " logsumexp log Z, which z-loss keeps near 0, or the largest logit). Large"
                " logits lose precision in bf16/fp16 and make the output softmax saturate;"
                " PaLM and OLMo 2 add a z-loss against this drift, which preceded loss spikes"
                " and divergence. A classifier trained to ever more confident outputs shows"
                " the same growth of its largest logit."
                + (" Here the loss went on falling after the drift began: most likely that"
                   " confidence, worth watching rather than fixing." if learning else "")
                + (" Here the head classifies whole samples and the logits' level (their"
                   " mean) held: log Z rose with the model's confidence, which is learning."
                   if confident and not learning else "")
            ),
            suggestion=(
                "Add a z-loss (1e-4 x (log Z)^2, as PaLM), or cap the logits (soft-capping,"
                " Gemma 2); lower the learning rate of the output head; check weight decay"
                " on the head and the final norm."
            ),
            jump=_jump("head"),
        ))
    return out


# ---------------------------------------------------------------- massive activations


@rule("massive_activations", needs=("probes",))
def massive_activations(rv: RunView) -> list[Finding]:
    """A layer output with max|a| > 100 and > 1000x its median |a| (warning), else a
    kurtosis far above 3 in a mostly non-zero output (info)."""
    t = rv.t
    p = run_probes(rv)
    if p is None:
        return []
    max_abs, ratio = p.field("max_abs"), p.field("massive_ratio")
    kurt, med = p.field("kurtosis"), p.field("abs_median")
    # the points that hold layer outputs' probes (not a paced run's probe points)
    measured = np.flatnonzero((np.isfinite(med) | np.isfinite(kurt)).any(axis=0))
    with np.errstate(invalid="ignore"):
        massive = (max_abs > t.massive_abs) & (ratio > t.massive_ratio)
        # A median |a| of 0 is an output more than half zeros (a rectifier): its kurtosis
        # measures sparsity, not outliers.
        heavy = (kurt > t.massive_kurtosis) & (med > 0)
    hits = [(i, j) for i in range(len(p.rows))
            if (j := _sustained_at(massive[i], measured, rv)) is not None]
    severity = "warning"
    if not hits:
        hits = [(i, j) for i in range(len(p.rows))
                if (j := _sustained_at(heavy[i], measured, rv)) is not None]
        severity = "info"
    if not hits:
        return []
    hits.sort(key=lambda ij: ij[1])
    measure = ratio if severity == "warning" else kurt
    i = max(hits, key=lambda ij: nanmax(measure[ij[0]]))[0]
    j0 = hits[0][1]
    step, epoch = _when(rv, p, j0)
    name = p.rows[i]
    peak_ratio = float(nanmax(ratio[i])) if np.isfinite(ratio[i]).any() else None
    peak_kurt = float(nanmax(kurt[i])) if np.isfinite(kurt[i]).any() else None
    if severity == "warning":
        title = (f"Massive activations: '{name}' has values up to {fmt_num(nanmax(max_abs[i]))},"
                 f" {fmt_num(peak_ratio)}x its median |a|")
    else:
        title = (f"Heavy-tailed outputs: the kurtosis of '{name}' reached"
                 f" {fmt_num(peak_kurt)} (3 for a Gaussian)")
    return [Finding(
        kind="massive_activations",
        severity=severity,
        title=title,
        first_step=step, first_epoch=epoch,
        layers=[p.rows[r] for r, _ in hits],
        evidence={
            "layer": name,
            "max_abs_peak": float(nanmax(max_abs[i])) if np.isfinite(max_abs[i]).any() else None,
            "abs_median_at_peak": float(med[i][int(np.nanargmax(ratio[i]))])
            if peak_ratio is not None else None,
            "max_to_median_ratio_peak": peak_ratio,
            "kurtosis_peak": peak_kurt,
            "layers_flagged": len(hits),
            "threshold_abs": t.massive_abs,
            "threshold_ratio": t.massive_ratio,
            "threshold_kurtosis": t.massive_kurtosis,
        },
        explanation=(
            "A few values of this layer's output are orders of magnitude larger than the"
            " rest (Sun et al. 2024, 'Massive activations in large language models'; the"
            " outlier features of Dettmers et al. 2022 and Bondarenko et al. 2023 show as a"
            " kurtosis far above the 3 of a Gaussian). They usually sit in a few fixed"
            " channels, act as attention sinks, dominate the layer's norm statistics, break"
            " int8/fp8 quantisation and low-precision training, and can grow until training"
            " diverges."
        ),
        suggestion=(
            "Check which channels hold them (the Activity view); gated or clipped attention"
            " (a softmax that may attend to nothing), QK-norm, a smaller learning rate or"
            " stronger weight decay on the residual stream's projections reduce them; keep"
            " the layer in higher precision if it must be quantised."
        ),
        jump=_jump("massive" if severity == "warning" else "kurtosis"),
    )]


# ---------------------------------------------------------------- update spike


# Needs the variable view too: the rule returns nothing without it (a rule applies when
# any one of its needs was logged, and a run without a loss has no spike to explain).
@rule("update_spike", needs=("loss",))
def update_spike(rv: RunView) -> list[Finding]:
    """A kernel's update ratio 10x above its own recent median in the points up to a loss
    spike (warning): names the layer that moved first and how many steps before."""
    t = rv.t
    a = rv.view("variable")
    scored = loss_spike_scores(rv)
    if a is None or scored is None or a.n_points < t.min_points:
        return []
    lsteps, _, v, mean, std = scored
    scored_spikes = np.flatnonzero(loss_spike_mask(rv, v, mean, std))
    if not scored_spikes.size:
        return []
    rows = [i for i, s in enumerate(a.series) if len(s.info.shape) >= 2 and s.has("update_ratio")]
    if not rows:
        return []
    sub = a.subset(rows)
    raw = sub.field("update_ratio")
    r = raw / a.span  # per-step lower bound: points may span different numbers of steps
    w = t.update_spike_window
    factor = np.full(r.shape, np.nan)
    for j in range(1, r.shape[1]):
        hist = r[:, max(0, j - w):j]
        enough = np.isfinite(hist).sum(axis=1) >= 3
        ref = nanmedian(hist, axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            factor[:, j] = np.where(enough & (ref > 0), r[:, j] / ref, np.nan)
    with np.errstate(invalid="ignore"):
        spiked = (factor >= t.update_spike_factor) & (raw >= t.update_ratio_target)
    steps = a.steps
    for ls in scored_spikes:
        s = int(lsteps[ls])
        # The point whose window holds the loss spike, and the points before it.
        js = int(np.searchsorted(steps, s))
        cols = [j for j in range(max(0, js - t.update_spike_lead_points + 1),
                                 min(js, len(steps) - 1) + 1) if j == 0 or steps[j - 1] < s]
        cand = [(j, i) for j in cols for i in range(len(rows)) if spiked[i, j]]
        if not cand:
            continue
        j, i = min(cand, key=lambda ji: (ji[0], -factor[ji[1], ji[0]]))
        # In the order they moved: first spiking point, then the larger jump.
        order = sorted(cand, key=lambda ji: (ji[0], -factor[ji[1], ji[0]]))
        layers = sub.layers([i2 for _, i2 in order])
        first = sub.series[i].info
        lead = s - int(steps[j])
        window_start = int(steps[j - 1]) + 1 if j > 0 else 0
        when = (f"{lead} steps before the loss spike at step {s}" if lead > 0 else
                f"in the logged window of steps {window_start}-{int(steps[j])}, which holds"
                f" the loss spike at step {s}")
        step, epoch = rv.step_epoch(a, j)
        return [Finding(
            kind="update_spike",
            severity="warning",
            title=(f"Update spike before a loss spike: '{first.layer}' moved first, its update"
                   f" {fmt_times(float(factor[i, j]))} its recent median, {when}"),
            first_step=step, first_epoch=epoch,
            layers=layers,
            tags=[first.tag],
            view="variable",
            evidence={
                "first_layer": first.layer,
                "first_tensor": first.name,
                "update_spike_step": int(steps[j]),
                "loss_spike_step": s,
                "steps_before_loss": max(lead, 0),
                "same_window": lead <= 0,
                "update_factor": float(factor[i, j]),
                "update_ratio": float(raw[i, j]),
                "layers_spiking": len(layers),
                "threshold_factor": t.update_spike_factor,
                "window_points": w,
            },
            explanation=(
                "The size of this layer's weight update jumped far above its own recent"
                " updates just before (or in the same logged window as) a loss spike; the"
                " layers listed spiked too, in the order they moved. A sudden large update"
                " is the usual trigger of a transformer loss spike: Adam's second-moment"
                " estimate of a parameter that had seen tiny gradients is stale, and the next"
                " large gradient gives a step far larger than the learning rate intends"
                " (Molybog et al. 2023; Wortsman et al. 2023)."
            ),
            suggestion=(
                "Clip gradients or updates; lower the learning rate of the named layer or"
                " lengthen warm-up; lower Adam's beta2 (e.g. 0.95) or raise epsilon so the"
                " second moment follows gradients faster; check the batch at the spike."
            ),
            jump={"tab": "layers", "view": "variable", "tag": first.tag, "chart": "update_ratio"},
        )]
    return []
