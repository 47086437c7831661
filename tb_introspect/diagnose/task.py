"""What the model is trained for, inferred from what was logged: classification into K
classes (and so the chance-level loss ln K), or not known (regression, or too little logged).

Nothing in the format says which loss was used; the run says enough to tell in most cases:

* **K** is the output layer's width: the last dimension of the deepest output-view tensor
  (its tag metadata records the static shape), else of the deepest kernel;
* **classification** is recognised from an accuracy metric of training or validation (Keras
  logs ``accuracy``, ``sparse_categorical_accuracy``, ...), or from a softmax output: values
  in [0, 1] whose mean is 1/K (the K probabilities of every sample sum to 1, so their mean
  is exactly 1/K).

Without either, the run is treated as not classification, and no chance-level rule applies:
an MSE loss of 2.30 says nothing about 10 outputs. Where the front-end recorded what the loss
is (``RunSeries.loss_info``: the Keras compiled loss, the PyTorch ``criterion``), that
decides: a declared regression loss is never classification, a declared cross-entropy is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tb_introspect.diagnose.core import RunView, nanmax, nanmin

#: A softmax's mean over its K outputs is 1/K up to float rounding; 1% leaves room for
#: percentile sampling (the mean is exact) and float32 sums.
_SOFTMAX_MEAN_TOLERANCE = 0.01


@dataclass(frozen=True)
class Task:
    """A classification task as the run shows it."""

    classes: int
    #: loss of a model that predicts 1/K for every class (ln K; ln 2 for one sigmoid unit)
    chance_loss: float
    #: the per-step training accuracy metric, and the per-epoch validation one (or None)
    accuracy: str | None
    val_accuracy: str | None
    #: how classification was recognised: "accuracy metric", "declared loss" or
    #: "softmax output"
    evidence: str
    #: tag of the output layer's output-view series (None: not logged)
    output_tag: str | None

    @property
    def chance_accuracy(self) -> float:
        return 1.0 / max(self.classes, 2)


def _accuracy_names(rv: RunView) -> tuple[str | None, str | None]:
    names = sorted(set(rv.run.metrics) | set(rv.run.metric_epochs))
    train = next((n for n in names if "acc" in n.lower() and not n.startswith("val_")), None)
    val = f"val_{train}" if train and f"val_{train}" in names else next(
        (n for n in names if n.startswith("val_") and "acc" in n.lower()), None)
    return train, val


def output_series(rv: RunView):
    """The output-view series of the output layer (the deepest one), or ``None``.

    ``None`` also when a layer with weights lies deeper than every logged output: the
    output layer's own output was not logged (a subset of the layers monitored, as under
    ``jit_compile``), and the deepest logged one is a hidden layer.
    """
    a = rv.view("output")
    if a is None or not a.series:
        return None
    deepest = max(s.info.depth for s in a.series)
    weighted = [s.info.depth for v in ("variable", "gradient") for s in rv.run.tensors.get(v, [])]
    if weighted and max(weighted) > deepest:
        return None
    return next(s for s in a.series if s.info.depth == deepest)


def _width(rv: RunView) -> int | None:
    out = output_series(rv)
    if out is not None and out.info.shape and out.info.shape[-1] > 0:
        return int(out.info.shape[-1])
    for view in ("variable", "gradient"):
        kernels = [s for s in rv.run.tensors.get(view, []) if len(s.info.shape) >= 2]
        if kernels:
            last = max(kernels, key=lambda s: s.info.depth)
            return int(last.info.shape[-1]) if last.info.shape[-1] > 0 else None
    return None


def infer_task(rv: RunView) -> Task | None:
    """The classification task of the run, or ``None`` when it is not one (or unknown)."""
    if "task" in rv.memo:
        return rv.memo["task"]
    rv.memo["task"] = task = _infer(rv)
    return task


def declared_loss(rv: RunView) -> dict | None:
    """What the loss is as the front-end recorded it (``loss_field.parse_loss``), or None."""
    return rv.run.loss_info


def _infer(rv: RunView) -> Task | None:
    k = _width(rv)
    if k is None:
        return None
    declared = (declared_loss(rv) or {}).get("task")
    if declared == "regression":
        return None
    acc, val_acc = _accuracy_names(rv)
    out = output_series(rv)
    # A validation accuracy alone says it too (a trainer that evaluates accuracy but logs
    # only the training loss, as the Hugging Face Trainer does).
    how = "accuracy metric" if acc or val_acc else None
    if how is None and declared == "classification":
        how = "declared loss"
    if how is None and out is not None and k >= 2:
        lo, hi = nanmin(out.field("min")), nanmax(out.field("max"))
        mean = out.field("mean")
        mean = mean[np.isfinite(mean)]
        if (np.isfinite(lo) and lo >= 0 and hi <= 1 + 1e-6 and mean.size
                and np.all(np.abs(mean * k - 1) <= _SOFTMAX_MEAN_TOLERANCE)):
            how = "softmax output"
    if how is None:
        return None
    return Task(classes=k, chance_loss=math.log(max(k, 2)), accuracy=acc, val_accuracy=val_acc,
                evidence=how, output_tag=out.info.tag if out is not None else None)


def per_epoch_mean(rv: RunView, name: str) -> dict[int, float]:
    """Per-epoch mean of metric ``name``: its logged band, else its per-step values (or the
    one value logged per epoch, as for ``val_*``)."""
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


def epoch_accuracy(rv: RunView, task: Task, epochs: np.ndarray) -> np.ndarray:
    """Training accuracy (per-epoch mean) at each of ``epochs`` (NaN where unknown)."""
    acc = per_epoch_mean(rv, task.accuracy) if task.accuracy else {}
    return np.array([acc.get(int(e), np.nan) if np.isfinite(e) else np.nan for e in epochs])


def at_chance(rv: RunView, task: Task, epochs: np.ndarray, medians: np.ndarray) -> np.ndarray:
    """Per epoch: the loss median within ``chance_tolerance`` of ln K and, where the training
    accuracy was logged, the accuracy below ``chance_accuracy_factor`` x 1/K."""
    t = rv.t
    near = np.abs(medians - task.chance_loss) <= t.chance_tolerance * task.chance_loss
    acc = epoch_accuracy(rv, task, epochs)
    return near & ~(acc > t.chance_accuracy_factor * task.chance_accuracy)
