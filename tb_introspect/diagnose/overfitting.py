"""Overfitting: the training loss keeps falling while the validation loss rises.

Both curves per epoch: the training loss as the epoch's mean of its per-step values
(what Keras reports as ``loss``; the logged band's ``mean``, else computed from the
per-step values), the validation loss as logged once per epoch (``val_loss``). The
epoch where the curves part is the validation loss's best epoch before the rise.

Decided on the epochs logged so far (a live run shows it while it trains): the parting must
hold at the latest two epochs, and the finding goes away when the validation loss comes
back. Graded: info for a mild rise; warning for a rise of 50%, for a rise of 25% while the
training loss fell 10x since the best epoch (and the validation accuracy, where logged,
fell 2 points), for a parting that has lasted 3 epochs,
reached 20% on the way and given back 10% of the validation loss's progress (from its
first epoch to its best), for a rise of a third that is still going on (the latest epoch
above the one before), and for memorisation (training gets better, validation never did
and its accuracy stays at chance). The title names the epoch of the best validation loss.
"""

from __future__ import annotations

import numpy as np

from tb_introspect.diagnose.core import Finding, RunView, fmt_num, pct, rule, trailing_run
from tb_introspect.diagnose.task import infer_task, per_epoch_mean


def _val_name(rv: RunView, train: str) -> str | None:
    names = sorted(set(rv.run.metrics) | set(rv.run.metric_epochs))
    if f"val_{train}" in names:
        return f"val_{train}"
    return next((n for n in names if n.startswith("val_") and "loss" in n.lower()), None)


def _per_epoch_val(rv: RunView, name: str) -> tuple[dict[int, float], dict[int, int]]:
    s = rv.run.metrics.get(name)
    if s is None:
        band = rv.run.metric_epochs.get(name)
        if band is None:
            return {}, {}
        values = band.field("mean")
        s_epochs, s_steps = band.epochs, band.steps
    else:
        values, s_epochs, s_steps = s.field("value"), s.epochs, s.steps
    vals: dict[int, float] = {}
    steps: dict[int, int] = {}
    for e, v, st in zip(s_epochs, values, s_steps, strict=True):
        if np.isfinite(e) and np.isfinite(v):
            vals[int(e)] = float(v)  # the last value logged in an epoch
            steps[int(e)] = int(st)
    return vals, steps


@rule("overfitting", needs=("loss",))
def overfitting(rv: RunView) -> list[Finding]:
    """Validation loss >= 10% above its best while the training loss is >= 5% below its
    value at that epoch, on the latest >= 2 epochs; graded by how far and how long, and
    memorisation (training improves, validation never does) as a warning."""
    t = rv.t
    train_name = rv.loss_name()
    val_name = _val_name(rv, train_name) if train_name else None
    if val_name is None or val_name == train_name:
        return []
    train = per_epoch_mean(rv, train_name)
    val, val_steps = _per_epoch_val(rv, val_name)
    epochs = sorted(set(train) & set(val))
    if len(epochs) < t.min_points:
        return []
    tr = np.array([train[e] for e in epochs])
    va = np.array([val[e] for e in epochs])
    if not (np.all(tr > 0) and np.all(va > 0)):
        return []
    best = np.minimum.accumulate(va)
    best_at = np.array([int(np.flatnonzero(va[: j + 1] == best[j])[-1]) for j in range(len(va))])
    train_at_best = tr[best_at]
    # Parting = validation well above its best so far while training went on improving.
    parted = ((va >= best * (1 + t.overfit_val_rise))
              & (tr <= train_at_best * (1 - t.overfit_train_drop)))
    # Decided on the points so far: the parting must hold at the latest two epochs. A
    # validation loss that comes back, or a training loss that turns up again (instability,
    # not memorising), ends the finding.
    trailing = trailing_run(parted)
    memo = _memorising(rv, epochs, tr, va)
    if trailing < 2 and memo is None:
        return []
    end = len(epochs) - 1
    j = len(parted) - trailing if trailing >= 2 else 0
    b = int(best_at[j]) if trailing >= 2 else 0
    part_epoch = epochs[b]
    rise = float(va[end] / va[b] - 1)
    if memo is not None:
        pattern, severity = "memorising", "warning"
    elif rise >= t.overfit_val_rise_warning:
        pattern, severity = "rising", "warning"
    elif (rise >= t.overfit_stop_rise
          and tr[end] <= t.overfit_stop_train_drop * tr[b]
          and _val_accuracy_drop(rv, part_epoch, epochs[end]) is not False):
        # Training still gets 10x better while validation is a quarter worse than its best
        # (and, where logged, less accurate): what the rest of training adds is memorised;
        # the time to stop was the best epoch.
        pattern, severity = "stop", "warning"
    elif (trailing >= t.overfit_climb_epochs
          and float(np.max(va[j:]) / va[b] - 1) >= t.overfit_climb_rise
          and va[0] > va[b]
          and float(np.max(va[j:]) - va[b]) >= t.overfit_climb_giveback * (va[0] - va[b])):
        pattern, severity = "climbing", "warning"
    elif rise >= t.overfit_keep_rise and end >= 1 and va[end] > va[end - 1]:
        # A third above its best and still going up: the harm grows with every epoch.
        pattern, severity = "still rising", "warning"
    else:
        pattern, severity = "rising", "info"
    # A validation loss that rises while the validation accuracy stays near its best is a
    # classifier growing confident on the few samples it gets wrong, not a worse model:
    # every healthy classifier trained to 100% training accuracy here shows it (the
    # loss of a confident mistake grows with the logits), with dips of up to 2.2 points (a
    # GELU MLP at AdamW 3e-3, which then set a new best). Where the accuracy is logged, the
    # warning needs it overfit_accuracy_drop below its best (memorising the noise of 128 or
    # 192 samples costs 4 to 12 points). The "stop" grade reads the accuracy its own way.
    # ("stop" has its own test: 2 points, with the training loss down 10x.)
    held = (_val_accuracy_held(rv, epochs[end]) if pattern not in ("memorising", "stop")
            else None)
    if held:
        severity = "info"
    if pattern == "memorising":
        title = (f"Memorising: the training loss fell from {fmt_num(tr[0])} to"
                 f" {fmt_num(tr[end])} while the validation loss never improved on epoch"
                 f" {epochs[0]} ({fmt_num(va[0])}, now {fmt_num(va[end])})")
        if memo.get("val_accuracy_max") is not None:
            title += f", validation accuracy at most {memo['val_accuracy_max']:.0%} (chance)"
    else:
        title = (f"Overfitting: the best validation loss was at epoch {part_epoch}; since"
                 f" then it rose from {fmt_num(va[b])} to {fmt_num(va[end])}"
                 f" ({rise:+.0%}) while the training loss fell from {fmt_num(tr[b])} to"
                 f" {fmt_num(tr[end])}")
        if pattern == "climbing":
            title += f", for {trailing} epochs"
        if pattern == "still rising":
            title += f", and still rising ({epochs[end] - part_epoch} epochs since the best)"
    expl = (
        "The training loss keeps falling while the loss on held-out data rises: from the"
        " epoch shown on, the model learns the training samples themselves (noise and"
        " details that do not generalise) instead of the pattern. Further training makes"
        " the model worse on new data, even though every training curve looks fine."
    )
    if pattern == "memorising":
        expl = (
            "The model gets better on its training samples while it never got better on"
            " held-out data than after its first epoch, and its validation accuracy stays at"
            " chance: it learns nothing that carries over, only the training samples"
            " themselves. That is what a network does with labels that do not belong to"
            " their inputs (shuffled or misaligned labels), with a validation set that"
            " comes from another distribution or another preprocessing, or with leakage"
            " between the features and the labels of the training set only."
        )
    suggestion = (
        f"Keep the weights of epoch {part_epoch} (early stopping with"
        " restore_best_weights); add regularisation (dropout, weight decay, data"
        " augmentation); use more training data or a smaller model."
    )
    if pattern == "memorising":
        suggestion = (
            "Check that labels and inputs are shuffled together and match (plot a few"
            " samples with their labels); check that training and validation data get the"
            " same preprocessing; look for features that encode the label in the training"
            " set only."
        )
    return [Finding(
        kind="overfitting",
        severity=severity,
        title=title,
        first_step=val_steps.get(part_epoch), first_epoch=part_epoch,
        metric=val_name,
        evidence={
            "pattern": pattern,
            "parting_epoch": part_epoch,
            "best_val_epoch": part_epoch,
            "first_flagged_epoch": epochs[j] if trailing >= 2 else memo["first_epoch"],
            "epochs_parted": int(trailing),
            "epochs_since_best": int(epochs[end] - part_epoch),
            "val_loss_best": float(va[b]),
            "val_loss_at_end": float(va[end]),
            "val_loss_max_after": float(np.max(va[b:])),
            "train_loss_at_parting": float(tr[b]),
            "train_loss_at_end": float(tr[end]),
            "epochs_compared": len(epochs),
            "val_loss_rise": rise,
            "val_accuracy_held": held,
            **(memo or {}),
            "threshold_val_rise": t.overfit_val_rise,
            "threshold_val_rise_warning": t.overfit_val_rise_warning,
            "threshold_climb_epochs": t.overfit_climb_epochs,
            "threshold_climb_rise": t.overfit_climb_rise,
            "threshold_climb_giveback": t.overfit_climb_giveback,
            "threshold_keep_rise": t.overfit_keep_rise,
            "threshold_train_drop": t.overfit_train_drop,
            "threshold_stop_rise": t.overfit_stop_rise,
            "threshold_stop_train_drop": t.overfit_stop_train_drop,
            "threshold_stop_accuracy_drop": t.overfit_stop_accuracy_drop,
        },
        explanation=expl,
        suggestion=suggestion,
        jump={"tab": "overview", "metric": val_name, "chart": "metric"},
    )]


def _memorising(rv: RunView, epochs: list[int], tr: np.ndarray,
                va: np.ndarray) -> dict | None:
    """Evidence that the model memorises, on the latest two epochs, or ``None``.

    Training improved (loss at most half its first epoch's, or training accuracy at least
    ``memorise_train_accuracy`` x chance), the validation loss never got below its first
    epoch's, and the validation accuracy (when logged) never left chance.
    """
    t = rv.t
    task = infer_task(rv)
    chance = task.chance_accuracy if task else None
    acc = per_epoch_mean(rv, task.accuracy) if task and task.accuracy else {}
    vacc = per_epoch_mean(rv, task.val_accuracy) if task and task.val_accuracy else {}
    n = len(epochs)
    ok = np.zeros(n, dtype=bool)
    for j in range(1, n):
        improved = tr[j] <= t.memorise_train_drop * tr[0]
        val_never = bool(np.min(va[1: j + 1]) >= va[0])
        if vacc:
            # With accuracies: a training accuracy well above chance also counts.
            if epochs[j] in acc:
                improved |= acc[epochs[j]] >= t.memorise_train_accuracy * chance
            seen = [vacc[e] for e in epochs[: j + 1] if e in vacc]
            val_never &= bool(seen) and max(seen) <= t.memorise_val_accuracy * chance
        ok[j] = improved and val_never
    if not (ok[-1] and ok[-2]):
        return None
    first = int(np.flatnonzero(~ok)[-1]) + 1
    seen = [vacc[e] for e in epochs if e in vacc]
    return {
        "first_epoch": epochs[first],
        "train_loss_ratio": float(tr[-1] / tr[0]),
        "train_accuracy_at_end": acc.get(epochs[-1]),
        "val_accuracy_max": max(seen) if seen else None,
        "chance_accuracy": chance,
        "threshold_memorise_train_drop": t.memorise_train_drop,
        "threshold_memorise_train_accuracy": t.memorise_train_accuracy,
        "threshold_memorise_val_accuracy": t.memorise_val_accuracy,
    }


@rule("train_eval_gap", needs=("loss",))
def train_eval_gap(rv: RunView) -> list[Finding]:
    """Training accuracy >= 2x chance while the validation accuracy is <= 0.6x the training
    accuracy and >= 0.3 below it, on the latest >= 2 epochs (memorisation left to
    ``overfitting``)."""
    t = rv.t
    task = infer_task(rv)
    if task is None or not task.accuracy or not task.val_accuracy:
        return []
    acc = per_epoch_mean(rv, task.accuracy)
    vacc, _ = _per_epoch_val(rv, task.val_accuracy)
    epochs = sorted(set(acc) & set(vacc))
    if len(epochs) < 2:
        return []
    tr = np.array([acc[e] for e in epochs])
    va = np.array([vacc[e] for e in epochs])
    gap = ((tr >= t.gap_train_accuracy * task.chance_accuracy) & (va <= t.gap_ratio * tr)
           & (tr - va >= t.gap_points))
    n = trailing_run(gap)
    if n < 2:
        return []
    # Memorisation (validation never better than chance) is the overfitting finding's.
    train_name = rv.loss_name()
    val_name = _val_name(rv, train_name) if train_name else None
    if val_name:
        train = per_epoch_mean(rv, train_name)
        val, _ = _per_epoch_val(rv, val_name)
        both = sorted(set(train) & set(val))
        if len(both) >= 2 and _memorising(rv, both, np.array([train[e] for e in both]),
                                          np.array([val[e] for e in both])) is not None:
            return []
    j = len(epochs) - n
    _, steps = _per_epoch_val(rv, task.val_accuracy)
    return [Finding(
        kind="train_eval_gap",
        severity="warning",
        title=(f"Validation far behind training since epoch {epochs[j]}: training accuracy"
               f" {pct(float(tr[-1]))}, validation {pct(float(va[-1]))}"),
        first_step=steps.get(epochs[j]), first_epoch=epochs[j],
        metric=task.val_accuracy,
        evidence={
            "train_accuracy_at_end": float(tr[-1]),
            "val_accuracy_at_end": float(va[-1]),
            "val_accuracy_max": float(np.max(va)),
            "gap_at_end": float(tr[-1] - va[-1]),
            "epochs_apart": int(n),
            "chance_accuracy": task.chance_accuracy,
            "threshold_ratio": t.gap_ratio,
            "threshold_points": t.gap_points,
            "threshold_train_accuracy": t.gap_train_accuracy,
        },
        explanation=(
            "The model does well on the batches it trains on and far worse on held-out data,"
            " from early on, long before it could have memorised anything: the model"
            " computes something else in evaluation than in training, or the validation"
            " data differ. The usual cause is BatchNormalization, whose moving statistics"
            " (used in evaluation) lag the batch statistics (used in training) in a short run"
            " with the default momentum (Keras 0.99, i.e. PyTorch momentum 0.01), or on"
            " inputs far from zero mean and unit scale; also preprocessing applied to one"
            " split only, a train/eval switch that changes the model (model.eval() missing"
            " or misplaced, a layer that behaves differently at inference), or a validation"
            " set from another distribution."
        ),
        suggestion=(
            "Evaluate the training data in inference mode: if it is as bad as the validation"
            " data, the model differs between modes (lower BatchNormalization's momentum:"
            " Keras momentum=0.9, PyTorch momentum=0.1; normalise the inputs; train longer);"
            " if it is fine, compare the preprocessing and distribution of the two splits."
        ),
        jump={"tab": "overview", "metric": task.val_accuracy, "chart": "metric"},
    )]


def _val_accuracy_held(rv: RunView, end: int) -> bool | None:
    """Whether the validation accuracy at epoch ``end`` is less than
    ``overfit_accuracy_drop`` below its best so far (None: no validation accuracy)."""
    task = infer_task(rv)
    if task is None or not task.val_accuracy:
        return None
    vacc, _ = _per_epoch_val(rv, task.val_accuracy)
    upto = [v for e, v in vacc.items() if e <= end]
    if end not in vacc or not upto:
        return None
    return bool(vacc[end] > max(upto) - rv.t.overfit_accuracy_drop)


def _val_accuracy_drop(rv: RunView, best: int, end: int) -> bool | None:
    """Whether the validation accuracy fell >= ``overfit_stop_accuracy_drop`` from epoch
    ``best`` to ``end`` (None: no validation accuracy logged). A validation loss that rises
    while the accuracy holds is confidence on a few samples, not a worse classifier."""
    task = infer_task(rv)
    if task is None or not task.val_accuracy:
        return None
    vacc, _ = _per_epoch_val(rv, task.val_accuracy)
    if best not in vacc or end not in vacc:
        return None
    return bool(vacc[best] - vacc[end] >= rv.t.overfit_stop_accuracy_drop)
