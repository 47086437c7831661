"""NaN/Inf anywhere: tensor statistics' non-finite counts and non-finite metric values."""

from __future__ import annotations

import numpy as np

from tb_introspect import slots
from tb_introspect.diagnose.core import Finding, RunView, rule


@rule("nonfinite", needs=(*slots.VIEWS, "loss"), needs_history=False)
def nonfinite(rv: RunView) -> list[Finding]:
    """The first step where any tensor or metric holds NaN/Inf (critical; one point suffices)."""
    # Per view: the first non-finite column, and (step, view order, depth, tag, view, layer,
    # nan, inf) of the tensors non-finite there. Vectorised: a broken run is all NaN.
    hits: list[tuple[int, int, int, str, str, str, float, float]] = []
    epochs: dict[int, int | None] = {}
    ever: set[str] = set()
    for order, view in enumerate(slots.VIEWS):
        a = rv.view(view)
        if a is None:
            continue
        nan = np.nan_to_num(a.field("nan_count"), nan=0.0)
        inf = np.nan_to_num(a.field("posinf_count"), nan=0.0) + np.nan_to_num(
            a.field("neginf_count"), nan=0.0)
        bad = (nan + inf) > 0
        if not bad.any():
            continue
        ever.update(a.series[i].info.tag for i in np.flatnonzero(bad.any(axis=1)))
        j = int(np.flatnonzero(bad.any(axis=0))[0])
        step, epoch = rv.step_epoch(a, j)
        epochs.setdefault(step, epoch)
        for i in np.flatnonzero(bad[:, j]):
            s = a.series[i]
            hits.append((step, order, s.info.depth, s.info.tag, view, s.info.layer,
                         float(nan[i, j]), float(inf[i, j])))
    metric_hits: list[tuple[int, str]] = []
    for name, s in rv.run.metrics.items():
        v = s.field("value")
        bad = np.flatnonzero(~np.isfinite(v))
        if bad.size:
            j = int(bad[0])
            step = int(s.steps[j])
            e = s.epochs[j]
            epochs.setdefault(step, int(e) if np.isfinite(e) else None)
            metric_hits.append((step, name))
    if not hits and not metric_hits:
        return []
    first_tensor_step = min((h[0] for h in hits), default=None)
    first_metric_step = min((m[0] for m in metric_hits), default=None)
    first = min(x for x in (first_tensor_step, first_metric_step) if x is not None)
    evidence: dict = {"first_step": first}
    layers: list[str] = []
    tags: list[str] = []
    view = None
    metric = None
    where = ""
    if hits:
        hits.sort()
        at_first = [h for h in hits if h[0] == first_tensor_step]
        h0 = at_first[0]
        view = h0[4]
        tags = list(dict.fromkeys(h[3] for h in at_first))
        layers = list(dict.fromkeys(h[5] for h in at_first))
        evidence.update(
            first_tensor=h0[3],
            first_tensor_step=first_tensor_step,
            tensors_nonfinite_at_that_step=len(tags),
            nan_values=_count(sum(h[6] for h in at_first)),
            inf_values=_count(sum(h[7] for h in at_first)),
            tensors_ever_nonfinite=len(ever),
        )
        where = f" in {h0[4].replace('_', ' ')} '{h0[3].split('/', 2)[-1]}'"
    if metric_hits:
        metric_hits.sort()
        metric = metric_hits[0][1]
        evidence.update(first_metric=metric, first_metric_step=metric_hits[0][0])
        if first_metric_step is not None and (first_tensor_step is None
                                              or first_metric_step < first_tensor_step):
            where = f" in metric '{metric}'"
    jump = ({"tab": "layers", "view": view, "tag": tags[0], "chart": "distribution"} if tags
            else {"tab": "overview", "metric": metric, "chart": "metric"})
    return [Finding(
        kind="nonfinite",
        severity="critical",
        title=f"NaN/Inf values from step {first}{where}",
        first_step=first, first_epoch=epochs.get(first),
        layers=layers, tags=tags, view=view, metric=metric,
        evidence=evidence,
        explanation=(
            "Non-finite numbers appeared. Once a NaN or Inf enters the weights, every later"
            " step is garbage, and the statistics after that point mean nothing. The first"
            " tensor and step where it appeared point at the cause: an overflow from exploding"
            " activations or gradients (often a too-high learning rate), a log or division of"
            " zero in the loss, or bad input data."
        ),
        suggestion=(
            "Look at the steps just before the first NaN: growing gradients or outputs point to"
            " a too-high learning rate (lower it, clip gradients); otherwise check the loss for"
            " log(0) or division by zero (use from_logits=True, add epsilons) and the inputs for"
            " NaN. tf.debugging.enable_check_numerics() finds the exact op."
        ),
        jump=jump,
    )]


def _count(total: float) -> int | None:
    """A summed count as an int; None when a damaged file's counts sum to Inf."""
    return int(total) if np.isfinite(total) else None
