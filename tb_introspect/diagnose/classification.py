"""Rules for classifiers, which need the number of classes K (``task.infer_task``):

* ``loss_at_chance``: the loss sits at ln K (and the accuracy at 1/K): the model outputs the
  same distribution for every input, whatever it started from;
* ``early_instability``: the first epoch made the model worse than chance, with a jump far
  above the starting loss: the learning rate is too high from the first steps;
* ``rectified_output``: a rectifier on the logits (many outputs exactly zero, none negative);
* ``loss_floor``: probabilities fed to a loss that expects logits (the output is a softmax,
  or the loss stalls far above 0 at a high accuracy), where the loss is declared from logits;
* ``loss_without_learning``: the loss falls while the accuracy stays at chance (a penalty
  term's progress, not the data's).

None of them applies to regression: without an accuracy metric or a softmax output the run
is not known to be a classifier.
"""

from __future__ import annotations

import math

import numpy as np

from tb_introspect.diagnose import loss as loss_rules
from tb_introspect.diagnose.core import (
    Finding,
    RunView,
    fmt_num,
    fmt_times,
    pct,
    rule,
    trailing_run,
)
from tb_introspect.diagnose.task import (
    Task,
    at_chance,
    declared_loss,
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
    since = rv.when(steps[j], epochs[j])
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
               f" ({fmt_times(jump, 1)} its start) in {rv.when(st[first][peak], e0)}, whose mean"
               f" {fmt_num(mean0)}"
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


def softmax_floor(classes: int) -> float:
    """The lowest cross-entropy a from-logits loss reaches when fed probabilities: a
    one-hot vector read as logits, ln(1 + (K - 1) / e) (1.46 for 10 classes)."""
    return math.log(1 + (max(classes, 2) - 1) / math.e)


@rule("loss_floor", needs=("loss", "output"))
def loss_floor(rv: RunView) -> list[Finding]:
    """A loss declared from logits (without label smoothing for the plateau) fed with
    probabilities: the output layer is a softmax (values in [0, 1], mean 1/K) on the latest
    >= 2 points with the loss at or above its floor ln(1 + (K-1)/e), or the loss median
    stalls (< 10% down an epoch) at or above that floor while the training accuracy is
    >= 75%, on the latest >= 2 epochs."""
    t = rv.t
    info = declared_loss(rv)
    task = infer_task(rv)
    if task is None or task.classes < 2:
        return []
    # Without a declared loss, the framework's word that the model ends in a softmax (the
    # last module of a PyTorch Sequential) stands in for it; the loss must then sit on the
    # floor at a high accuracy too (a softmax before a loss on its log goes below it).
    undeclared = (info is None or info["task"] is None) and \
        (info or {}).get("output_module") == "Softmax"
    if undeclared:
        info = {**(info or {}), "name": "", "label_smoothing": 0.0}
    elif (info is None or info["task"] != "classification"
          or info["from_logits"] is not True):
        return []
    k = task.classes
    floor = softmax_floor(k)
    out = output_series(rv)
    n_soft = 0
    if out is not None and len(out) >= 2:
        lo, hi, mean = out.field("min"), out.field("max"), out.field("mean")
        n_soft = trailing_run((lo >= 0) & (hi <= 1 + 1e-6) & (np.abs(mean * k - 1) <= 0.01))
    name = rv.loss_name()
    seg = loss_rules.loss_segments(rv, name) if name else None
    if n_soft >= 2 and seg is not None:
        # Fed probabilities, the loss never goes below the floor: a loss below it (Keras on
        # TensorFlow takes a Softmax op's input as the logits) is not this bug.
        n_soft = min(n_soft, trailing_run(_at_points(seg, out.steps) >= floor))
    n_flat, acc_end = 0, None
    # The plateau is judged on whole epochs (segments of a first epoch are still learning).
    by_epoch = seg is not None and np.isfinite(seg[1]).all() and np.unique(seg[1]).size == \
        seg[1].size >= t.min_points
    if by_epoch and info["label_smoothing"] == 0:
        steps, epochs, med = seg
        acc = epoch_accuracy(rv, task, epochs)
        drop = np.concatenate([[0.0], 1 - med[1:] / med[:-1]])
        flat = (acc >= t.floor_accuracy) & (med >= t.floor_share * floor) & (drop < t.floor_stall)
        flat[0] = False
        n_flat = trailing_run(flat)
        acc_end = float(acc[-1]) if np.isfinite(acc[-1]) else None
    if undeclared:
        # The loss at or above the floor while the accuracy is high: what only a loss
        # applying its own softmax to probabilities does.
        n_high = 0
        if by_epoch:
            steps_e, epochs_e, med_e = seg
            acc_e = epoch_accuracy(rv, task, epochs_e)
            n_high = trailing_run((acc_e >= t.floor_accuracy) & (med_e >= t.floor_share * floor))
            acc_end = float(acc_e[-1]) if np.isfinite(acc_e[-1]) else None
        if n_high < 2:
            return []
        n_flat = 0
    if n_soft < 2 and n_flat < 2:
        return []
    loss_end = float(seg[2][-1]) if seg is not None else None
    if n_soft >= 2:
        j = len(out) - n_soft
        step, ep = int(out.steps[j]), out.epochs[j]
        title = (f"Probabilities into a from-logits loss: the output layer '{out.info.layer}'"
                 f" is a softmax (values in [0, 1], mean 1/{k}) and the loss"
                 f" ({info['name'] or 'cross-entropy'}) applies its own softmax; its floor is"
                 f" ln(1 + {k - 1}/e) = {floor:.2f}")
        if undeclared:
            title = (f"Softmax fed to a loss that wants logits: the model ends in nn.Softmax"
                     f" ('{out.info.layer}') and the loss stays at or above ln(1 + {k - 1}/e)"
                     f" = {floor:.2f}, the floor of a cross-entropy fed probabilities, at"
                     f" {pct(acc_end or 0)} training accuracy")
    else:
        steps, epochs, med = seg
        j = med.size - n_flat
        step, ep = int(steps[j]), epochs[j]
        title = (f"Loss stuck at a floor: median {fmt_num(med[-1])} at"
                 f" {pct(acc_end or 0)} training accuracy; a from-logits loss fed with"
                 f" probabilities cannot go below ln(1 + {k - 1}/e) = {floor:.2f}")
    return [Finding(
        kind="loss_floor",
        severity="warning",
        title=title,
        first_step=step, first_epoch=int(ep) if math.isfinite(ep) else None,
        layers=[out.info.layer] if n_soft >= 2 else [],
        tags=[out.info.tag] if n_soft >= 2 else [],
        view="output" if n_soft >= 2 else None,
        metric=name,
        evidence={
            "signal": "softmax output" if n_soft >= 2 else "loss plateau",
            "loss": info["name"],
            "from_logits": None if undeclared else True,
            "loss_declared": not undeclared,
            "output_module": (info or {}).get("output_module") or None,
            "label_smoothing": info["label_smoothing"],
            "classes": k,
            "floor_loss": floor,
            "loss_median_at_end": loss_end,
            "accuracy_at_end": acc_end,
            "output_mean_times_classes": float(out.field("mean")[-1] * k)
            if out is not None and len(out) else None,
            "threshold_accuracy": t.floor_accuracy,
            "threshold_floor_share": t.floor_share,
            "threshold_stall": t.floor_stall,
        },
        explanation=(
            ("The loss was not declared (criterion=), but the model's last module is"
             " nn.Softmax and the loss stays on the floor of a from-logits loss fed"
             " probabilities while the accuracy is high: a loss on probabilities (NLLLoss on"
             " their log) would have gone below it. " if undeclared else "") +
            "The loss is declared as taking logits (it applies the softmax itself:"
            " PyTorch's CrossEntropyLoss, Keras's from_logits=True), but it is fed"
            " probabilities: a softmax already sits at the end of the model. A softmax of"
            f" values in [0, 1] can never be confident: even a perfect one-hot input gives"
            f" a loss of ln(1 + (K-1)/e) = {floor:.2f} for K = {k}, and its gradients are"
            " small, so training is slow and stalls on that floor while the accuracy can"
            " still look fine. (Label smoothing also gives a floor, by design: it is"
            " declared with the loss and not flagged.)"
        ),
        suggestion=(
            "Remove the softmax at the end of the model (nn.Softmax, F.softmax in forward,"
            " activation=\"softmax\") and keep the from-logits loss; apply the softmax only"
            " at inference. Or keep the softmax and use a loss on probabilities (Keras:"
            " from_logits=False; PyTorch: NLLLoss on log-probabilities)."
        ),
        jump=({"tab": "layers", "view": "output", "tag": out.info.tag, "chart": "distribution"}
              if n_soft >= 2 else {"tab": "overview", "metric": name, "chart": "metric"}),
    )]


@rule("loss_without_learning", needs=("loss",))
def loss_without_learning(rv: RunView) -> list[Finding]:
    """A classifier's loss median at most half of where it stood when the training accuracy
    sat at chance (<= 1.5/K), with the accuracy still there: on the latest >= 2 epochs."""
    t = rv.t
    task = infer_task(rv)
    name = rv.loss_name()
    seg = loss_rules.loss_segments(rv, name) if (task and task.accuracy and name) else None
    if seg is None or seg[2].size < 2:
        return []
    steps, epochs, med = seg
    acc = epoch_accuracy(rv, task, epochs)
    chance = acc <= t.chance_accuracy_factor * task.chance_accuracy
    n = trailing_run(chance)
    if n < 2 or not np.all(med > 0):
        return []
    j = med.size - n  # the first epoch of the stretch at chance
    if med[-1] > t.penalty_loss_drop * med[j]:
        return []
    # The first epoch of the stretch where the loss stood at half its value at the start.
    first = j + int(np.flatnonzero(med[j:] <= t.penalty_loss_drop * med[j])[0])
    return [Finding(
        kind="loss_without_learning",
        severity="warning",
        title=(f"Loss falls, nothing is learned: the loss median fell {fmt_times(med[j] / med[-1])}"
               f" ({fmt_num(med[j])} -> {fmt_num(med[-1])}) while the training accuracy"
               f" stayed at chance ({pct(float(acc[-1]))}, 1/{max(task.classes, 2)} ="
               f" {pct(task.chance_accuracy)})"),
        first_step=int(steps[first]), first_epoch=_epoch_of(epochs[first]),
        metric=name,
        evidence={
            "loss_median_at_start": float(med[j]),
            "loss_median_at_end": float(med[-1]),
            "loss_fall_factor": float(med[j] / med[-1]),
            "accuracy_at_end": float(acc[-1]),
            "accuracy_max": float(np.nanmax(acc[j:])),
            "chance_accuracy": task.chance_accuracy,
            "chance_loss": task.chance_loss,
            "epochs_at_chance": int(n),
            "threshold_loss_drop": t.penalty_loss_drop,
            "threshold_accuracy_factor": t.chance_accuracy_factor,
        },
        explanation=(
            "The loss goes down, but the model's predictions are no better than guessing:"
            " the progress comes from a term that does not depend on the labels. Usually an"
            " L2 penalty or weight decay strong enough to drown the data term (the loss falls"
            " as the weights shrink, towards the chance level ln K), or an auxiliary loss"
            " (a regulariser, a reconstruction or KL term) that dominates the sum. Also seen"
            " when the labels do not belong to the inputs."
        ),
        suggestion=(
            "Log the data term and the penalty separately; lower the L2 factor or weight"
            " decay (1e-4 to 1e-2 is usual) or the auxiliary loss's weight; check that"
            " labels and inputs belong together (overfit one batch first)."
        ),
        jump={"tab": "overview", "metric": name, "chart": "metric"},
    )]


def _at_points(seg: tuple, steps: np.ndarray) -> np.ndarray:
    """The loss median of the epoch or segment each of ``steps`` closes (NaN: none)."""
    seg_steps, _, med = seg
    out = np.full(len(steps), np.nan)
    for i, st in enumerate(steps):
        k = int(np.searchsorted(seg_steps, st))  # the first segment ending at or after st
        if k < len(med):
            out[i] = med[k]
    return out
