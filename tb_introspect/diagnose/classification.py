"""Rules for classifiers, which need the number of classes K (``task.infer_task``):

* ``loss_at_chance``: the loss sits at ln K (and the accuracy at 1/K): the model outputs the
  same distribution for every input, whatever it started from;
* ``early_instability``: the first epoch made the model worse than chance, with a jump far
  above the starting loss: the learning rate is too high from the first steps;
* ``rectified_output``: a rectifier on the logits (many outputs exactly zero, none negative).

None of them applies to regression: without an accuracy metric or a softmax output the run
is not known to be a classifier.
"""

from __future__ import annotations

import math

import numpy as np

from tb_introspect.diagnose import loss as loss_rules
from tb_introspect.diagnose.core import Finding, RunView, fmt_num, pct, rule, trailing_run
from tb_introspect.diagnose.task import (
    Task,
    at_chance,
    epoch_accuracy,
    infer_task,
    output_series,
)


def _epoch_of(e: float) -> int | None:
    return int(e) if np.isfinite(e) else None


@rule("loss_at_chance", needs=("loss",))
def loss_at_chance(rv: RunView) -> list[Finding]:
    """Loss median within 2% of ln K (accuracy at 1/K where logged) on the latest >= 2 epochs,
    after it came down from higher (a loss that never fell is ``loss_not_decreasing``)."""
    t = rv.t
    task = infer_task(rv)
    name = rv.loss_name()
    seg = loss_rules.loss_segments(rv, name) if (task and name) else None
    if seg is None:
        return []
    steps, epochs, med = seg
    if med.size < t.min_points or loss_rules.never_decreased(rv, med):
        return []
    mask = at_chance(rv, task, epochs, med)
    n = trailing_run(mask)
    if n < 2:
        return []
    j = med.size - n
    acc = _accuracy_at_end(rv, task, epochs)
    k = task.classes
    since = (f"epoch {_epoch_of(epochs[j])}" if _epoch_of(epochs[j]) is not None
             else f"step {int(steps[j])}")
    acc_text = f", accuracy {pct(acc)} (1/{max(k, 2)} = {pct(task.chance_accuracy)})" \
        if acc is not None else ""
    return [Finding(
        kind="loss_at_chance",
        severity="warning",
        title=(f"Loss at the chance level: median {fmt_num(med[-1])} since {since},"
               f" ln {max(k, 2)} = {task.chance_loss:.3f}{acc_text}"),
        first_step=int(steps[j]), first_epoch=_epoch_of(epochs[j]),
        metric=name,
        evidence={
            "loss_median_at_end": float(med[-1]),
            "loss_median_at_start": float(med[0]),
            "chance_loss": task.chance_loss,
            "classes": k,
            "accuracy_at_end": acc,
            "chance_accuracy": task.chance_accuracy,
            "points_at_chance": int(n),
            "classification_from": task.evidence,
            "threshold_tolerance": t.chance_tolerance,
            "threshold_accuracy_factor": t.chance_accuracy_factor,
        },
        explanation=(
            f"A {k}-class model that gives every class probability 1/{max(k, 2)} for every input"
            f" has a cross-entropy of exactly ln {max(k, 2)} = {task.chance_loss:.3f}. The loss"
            " came down to that value and stays there: the model's output no longer depends"
            " on its input. Usual causes: an L2 penalty or weight decay large enough to drive"
            " the weights to zero (the loss falls as the penalty shrinks, to chance), a layer"
            " that died or saturated so no signal reaches the output, a learning rate so high"
            " that training collapsed, or labels that do not match the inputs."
        ),
        suggestion=(
            "Look at the weight and unit findings (weight collapse, dead units); lower the"
            " L2 factor or weight decay (1e-4 to 1e-2 is usual); lower the learning rate;"
            " check that labels and inputs belong together (overfit one batch first)."
        ),
        jump={"tab": "overview", "metric": name, "chart": "metric"},
    )]


def _accuracy_at_end(rv: RunView, task: Task, epochs: np.ndarray) -> float | None:
    acc = epoch_accuracy(rv, task, epochs[-1:])
    return float(acc[0]) if np.isfinite(acc[0]) else None


@rule("early_instability", needs=("loss",), needs_history=False)
def early_instability(rv: RunView) -> list[Finding]:
    """The first epoch's mean loss above ln K, with a step 1.5x above both ln K and the first
    step's loss; info once the loss has since fallen steadily to half the first epoch's."""
    t = rv.t
    task = infer_task(rv)
    name = rv.loss_name()
    s = rv.run.metrics.get(name) if (task and name) else None
    if s is None or not len(s):
        return []
    v, e, st = s.field("value"), s.epochs, s.steps
    keep = np.isfinite(v) & np.isfinite(e)
    v, e, st = v[keep], e[keep], st[keep]
    if v.size < t.min_points:
        return []
    e0 = float(np.min(e))
    first = e == e0
    v0 = v[first]
    chance = task.chance_loss
    peak = int(np.argmax(v0))
    jump = float(v0[peak] / max(chance, float(v0[0])))
    mean0 = float(np.mean(v0))
    if mean0 < chance or jump < t.early_jump_factor:
        return []
    epochs = np.unique(e)
    meds = np.array([np.median(v[e == u]) for u in epochs])
    # Later points that no longer support it: every epoch since lower than the one before,
    # down to half the first epoch's median.
    settled = (meds.size >= t.min_points and bool(np.all(np.diff(meds) < 0))
               and meds[-1] <= 0.5 * meds[0])
    rises = int(np.sum(np.diff(meds) > 0))
    return [Finding(
        kind="early_instability",
        severity="info" if settled else "warning",
        title=(f"Unstable from the start: the loss jumped to {fmt_num(v0[peak])}"
               f" ({jump:.1f}x its start) in epoch {int(e0)}, whose mean {fmt_num(mean0)}"
               f" is above chance (ln {max(task.classes, 2)} = {chance:.3f})"
               + (", and has fallen steadily since" if settled else "")),
        first_step=int(st[first][peak]), first_epoch=int(e0),
        metric=name,
        evidence={
            "first_epoch_mean_loss": mean0,
            "first_step_loss": float(v0[0]),
            "peak_loss": float(v0[peak]),
            "jump_factor": jump,
            "chance_loss": chance,
            "epoch_medians_rising": rises,
            "settled": settled,
            "classification_from": task.evidence,
            "threshold_jump_factor": t.early_jump_factor,
        },
        explanation=(
            "A model starts near the chance level and a working training takes it below that"
            " within its first epoch. Here the first updates threw the model far above its"
            " starting loss and the whole first epoch was worse than guessing: the steps are"
            " too large for the model from the very start (attention and normalisation-free"
            " deep nets are the most sensitive). Such runs oscillate and end well below what"
            " the same model reaches at a lower rate."
            + (" The loss has since fallen every epoch, so the run may have recovered."
               if settled else "")
        ),
        suggestion=(
            "Lower the learning rate 3-10x, or add a warm-up of a few hundred steps (the"
            " usual remedy for attention blocks); clip gradients by global norm; check the"
            " initialisation and the input scale."
        ),
        jump={"tab": "overview", "metric": name, "chart": "metric"},
    )]


@rule("rectified_output", needs=("output",), needs_history=False)
def rectified_output(rv: RunView) -> list[Finding]:
    """A classifier's output layer never negative with >= 25% exact zeros, not a softmax,
    on the latest >= 2 points."""
    t = rv.t
    task = infer_task(rv)
    out = output_series(rv)
    if task is None or out is None or len(out) < 2 or task.classes < 2:
        return []
    lo = out.field("min")
    zero = out.field("zero_fraction")
    mean = out.field("mean")
    softmax_like = np.isfinite(mean) & (np.abs(mean * task.classes - 1) <= 0.01)
    mask = (lo >= 0) & (zero >= t.rectified_output_zero) & ~softmax_like
    n = trailing_run(mask)
    if n < 2:
        return []
    j = len(out) - n
    ep = out.epochs[j]
    return [Finding(
        kind="rectified_output",
        severity="warning",
        title=(f"Rectified output layer: {pct(float(zero[-1]))} of the outputs of"
               f" '{out.info.layer}' are exactly zero and none is negative"),
        first_step=int(out.steps[j]), first_epoch=int(ep) if math.isfinite(ep) else None,
        layers=[out.info.layer], tags=[out.info.tag], view="output",
        evidence={
            "output_layer": out.info.layer,
            "zero_fraction_at_end": float(zero[-1]),
            "zero_fraction_max": float(np.nanmax(zero)),
            "min_value": float(np.nanmin(lo)),
            "classes": task.classes,
            "classification_from": task.evidence,
            "threshold_zero_fraction": t.rectified_output_zero,
        },
        explanation=(
            "The output layer of this classifier is never negative and a large share of its"
            " values is exactly 0: a rectifier (e.g. Dense(K, activation=\"relu\")) sits on"
            " the logits. A from-logits loss then reads 0 for those classes, and no gradient"
            " passes back through a zeroed output, so the model cannot push the wrong classes"
            " down: training limps to well below the accuracy the same model reaches with"
            " linear logits."
        ),
        suggestion=(
            "Remove the activation of the last layer (activation=None with"
            " from_logits=True), or use softmax with a loss on probabilities."
        ),
        jump={"tab": "layers", "view": "output", "tag": out.info.tag, "chart": "distribution"},
    )]
