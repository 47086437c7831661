"""Overfitting: the training loss keeps falling while the validation loss rises.

Both curves per epoch: the training loss as the epoch's mean of its per-step values
(what Keras reports as ``loss``; the logged band's ``mean``, else computed from the
per-step values), the validation loss as logged once per epoch (``val_loss``). The
epoch where the curves part is the validation loss's best epoch before the rise.
"""

from __future__ import annotations

import numpy as np

from tb_introspect.diagnose.core import Finding, RunView, fmt_num, rule


def _val_name(rv: RunView, train: str) -> str | None:
    names = sorted(set(rv.run.metrics) | set(rv.run.metric_epochs))
    if f"val_{train}" in names:
        return f"val_{train}"
    return next((n for n in names if n.startswith("val_") and "loss" in n.lower()), None)


def _per_epoch_train(rv: RunView, name: str) -> dict[int, float]:
    band = rv.run.metric_epochs.get(name)
    if band is not None and len(band):
        return {int(e): float(v) for e, v in zip(band.epochs, band.field("mean"), strict=True)
                if np.isfinite(e) and np.isfinite(v)}
    s = rv.run.metrics.get(name)
    if s is None:
        return {}
    v, e = s.field("value"), s.epochs
    keep = np.isfinite(v) & np.isfinite(e)
    return {int(u): float(np.mean(v[keep & (e == u)])) for u in np.unique(e[keep])}


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
    value at that epoch, from a sustained stretch to the end; warning from a 50% rise."""
    t = rv.t
    train_name = rv.loss_name()
    val_name = _val_name(rv, train_name) if train_name else None
    if val_name is None or val_name == train_name:
        return []
    train = _per_epoch_train(rv, train_name)
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
    # Only a parting that lasts to the end of the run: a noisy validation loss that comes
    # back, or a training loss that turns up again (instability, not memorising), is not it.
    trailing = len(parted) - (int(np.flatnonzero(~parted)[-1]) + 1 if (~parted).any() else 0)
    if trailing < rv.sustain_points(len(epochs)):
        return []
    j = len(parted) - trailing
    b = int(best_at[j])
    part_epoch = epochs[b]
    end = len(epochs) - 1
    rise = float(va[end] / va[b] - 1)
    return [Finding(
        kind="overfitting",
        severity="warning" if rise >= t.overfit_val_rise_warning else "info",
        title=(f"Overfitting: after epoch {part_epoch} the validation loss rose from"
               f" {fmt_num(va[b])} to {fmt_num(va[end])} while the training loss fell from"
               f" {fmt_num(tr[b])} to {fmt_num(tr[end])}"),
        first_step=val_steps.get(part_epoch), first_epoch=part_epoch,
        metric=val_name,
        evidence={
            "parting_epoch": part_epoch,
            "first_flagged_epoch": epochs[j],
            "val_loss_best": float(va[b]),
            "val_loss_at_end": float(va[end]),
            "val_loss_max_after": float(np.max(va[b:])),
            "train_loss_at_parting": float(tr[b]),
            "train_loss_at_end": float(tr[end]),
            "epochs_compared": len(epochs),
            "val_loss_rise": rise,
            "threshold_val_rise": t.overfit_val_rise,
            "threshold_val_rise_warning": t.overfit_val_rise_warning,
            "threshold_train_drop": t.overfit_train_drop,
        },
        explanation=(
            "The training loss keeps falling while the loss on held-out data rises: from the"
            " epoch shown on, the model learns the training samples themselves (noise and"
            " details that do not generalise) instead of the pattern. Further training makes"
            " the model worse on new data, even though every training curve looks fine."
        ),
        suggestion=(
            f"Keep the weights of epoch {part_epoch} (early stopping with"
            " restore_best_weights); add regularisation (dropout, weight decay, data"
            " augmentation); use more training data or a smaller model."
        ),
        jump={"tab": "overview", "metric": val_name, "chart": "metric"},
    )]
