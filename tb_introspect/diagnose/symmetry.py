"""Units that never differ: every unit of a layer computes the same function.

When every weight of a layer starts at one constant, its units get the same input, the same
output and the same gradient, so every update keeps them equal: a 64-unit layer works as
one unit, for the whole run. Two exact signals, read from the first point:

* **equal activity**: the activity map of a rectified layer gives every channel the same
  activation rate (within 1e-6), neither 0 (dead, ``dead_units``'s business) nor 1. Every
  channel always on counts only beside a constant kernel: a sigmoid's outputs are never
  zero either, and from the logged statistics alone (never negative) it looks rectified;
* **a constant kernel or bias**: a kernel (or the bias of a layer with a kernel) whose
  entries are all one non-zero value (min = max) after training steps: its inputs and its
  output gradients are the same for every unit. A tensor whose gradient was exactly zero at
  every point logged is left out: it stayed constant because no error signal reached it
  (dead units, ``dead_units``'s business), not because its units are alike.

A deliberately narrow model has units that differ from the first step (random init), so
it stays clean.
"""

from __future__ import annotations

import numpy as np

from tb_introspect.diagnose.core import Finding, RunView, rule
from tb_introspect.diagnose.task import output_series

#: Rates within this of each other count as equal (one sample in a million).
_RATE_TOLERANCE = 1e-6
#: Channels all active on every sample count as equal from this many channels.
_ALWAYS_ON_UNITS = 8


def _equal_activity(rv: RunView, always_on: bool) -> dict[str, tuple[int, float, object]]:
    """{layer: (channels, rate at the first point, series)} of the activity maps whose
    channels have equal rates in (0, 1) at every point logged (also at 1 with
    ``always_on``)."""
    out: dict[str, tuple[int, float, object]] = {}
    last = output_series(rv)
    # Hidden rectified layers only: outputs never negative (a linear output's channels
    # are all non-zero alike, and the output layer's units differ by their labels).
    rectified = {s.info.layer for s in rv.run.tensors.get("output", [])
                 if len(s) and np.all(s.field("min") >= 0)
                 and (last is None or s.info.depth < last.info.depth)}
    for s in rv.run.activity.values():
        chans = [f for f in s.info.fields if f.startswith("c") and f[1:].isdigit()]
        layer = s.info.layer or s.info.name
        if len(chans) < 2 or not len(s) or layer not in rectified:
            continue
        rates = np.stack([s.field(c) for c in chans], axis=1)  # [point, channel]
        if not np.isfinite(rates).all():
            continue
        lo, hi = rates.min(axis=1), rates.max(axis=1)
        # Every unit always on counts from 8 units (a few healthy units can all be).
        inside = (lo > 0) & ((hi < 1) | (always_on and len(chans) >= _ALWAYS_ON_UNITS))
        if np.all(hi - lo <= _RATE_TOLERANCE) and np.all(inside):
            out[layer] = (len(chans), float(rates[0, 0]), s)
    return out


def _constant_kernels(rv: RunView) -> dict[str, tuple[float, object]]:
    """{layer: (value, series)} of kernels (rank >= 2, >= 2 entries per unit and >= 2 units)
    whose entries are all one non-zero value at every point logged."""
    out: dict[str, tuple[float, object]] = {}
    series = rv.run.tensors.get("variable", [])
    with_kernel = {s.info.layer for s in series if len(s.info.shape) >= 2}
    never_reached = {g.info.name for g in rv.run.tensors.get("gradient", [])
                     if len(g) and g.has("zero_fraction")
                     and np.all(g.field("zero_fraction") == 1)}
    for s in series:
        shape = s.info.shape
        # kernels, and the biases of layers with a kernel (a norm's scale starts at 1)
        if not shape or min(shape) < 2 or not len(s) or s.info.name in never_reached or (
                len(shape) < 2 and s.info.layer not in with_kernel):
            continue
        lo, hi = s.field("min"), s.field("max")
        if np.isfinite(lo).all() and np.all(lo == hi) and np.all(lo != 0):
            out.setdefault(s.info.layer, (float(lo[0]), s))
    return out


@rule("identical_units", needs=("variable", "output"), needs_history=False)
def identical_units(rv: RunView) -> list[Finding]:
    """A layer whose units are identical at every point logged: equal activity across its
    channels, or a constant non-zero kernel."""
    const = _constant_kernels(rv)
    act = _equal_activity(rv, always_on=bool(const))
    if not act and not const:
        return []
    depth = {s.info.layer: s.info.depth for v in rv.run.tensors.values() for s in v}
    depth.update({la: s.info.depth for la, (_, _, s) in act.items()})
    layers = sorted(set(act) | set(const), key=lambda la: (depth.get(la, 0), la))
    first = [s for _, _, s in act.values()] + [s for _, s in const.values()]
    step = min(int(s.steps[0]) for s in first)
    ep = [s.epochs[0] for s in first if int(s.steps[0]) == step and np.isfinite(s.epochs[0])]
    worst = layers[0]
    signals = []
    if act:
        signals.append("equal activity")
    if const:
        signals.append("constant kernel")
    tags = [act[la][2].info.tag for la in layers if la in act] + \
        [const[la][1].info.tag for la in layers if la in const and la not in act]
    how = (f"all {act[worst][0]} channels of '{worst}' fire at the same rate"
           f" ({act[worst][1]:.1%})" if worst in act else
           f"every entry of a weight of '{worst}' is {const[worst][0]:.4g}")
    return [Finding(
        kind="identical_units",
        severity="warning",
        title=(f"Units that never differ: {how} at every point"
               + (f" (and {len(layers) - 1} more layer(s))" if len(layers) > 1 else "")
               + "; likely cause: constant initialisation (symmetric units)"),
        first_step=step, first_epoch=int(ep[0]) if ep and not rv.step_based else None,
        layers=layers, tags=tags,
        view="output" if worst in act else "variable",
        evidence={
            "signal": " and ".join(signals),
            "layers_equal_activity": len(act),
            "layers_constant_kernel": len(const),
            "worst_layer": worst,
            "channels": act[worst][0] if worst in act else None,
            "rate": act[worst][1] if worst in act else None,
            "kernel_value": const[worst][0] if worst in const else None,
            "points": int(max(len(s) for s in first)),
            "threshold_rate_spread": _RATE_TOLERANCE,
        },
        explanation=(
            "Every unit of these layers computes the same thing: the same activation rate"
            " in every channel, or one value in every weight. When the weights start equal"
            " (a constant initialiser, torch.nn.init.constant_, all ones), each unit gets the"
            " same input and the same gradient, so every update keeps them equal and a wide"
            " layer works as a single unit for the whole run; accuracy stays low, often near"
            " chance. Nothing in training breaks the symmetry."
        ),
        suggestion=(
            "Initialise weights randomly (Keras's default glorot_uniform or he_normal;"
            " PyTorch's default, or nn.init.kaiming_uniform_/xavier_uniform_); constant"
            " values are for biases only."
        ),
        jump=({"tab": "layers", "view": "output", "tag": tags[0], "chart": "activity"}
              if worst in act else
              {"tab": "layers", "view": "variable", "tag": tags[0], "chart": "distribution"}),
    )]
