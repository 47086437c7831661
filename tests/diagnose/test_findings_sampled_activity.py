"""A dead rate counted on the statistics steps only weighs one level less than an exact one."""

from __future__ import annotations

import numpy as np

from tb_introspect.diagnose import find_issues
from tests.diagnose.findings_synth import epochs_steps, run, tensor

STEPS = epochs_steps(8)


def out(layer: str, depth: int, dead: float, activity_steps: float) -> object:
    s = tensor("output", layer, depth, STEPS, name=layer, shape=(-1, 8, 8, 16), min=0.0,
               zero_fraction=0.5, dead_rate=[0.0, 0.0] + [dead] * 6,
               activity_steps=activity_steps, stats_steps=1.0)
    s.values[:, list(s.info.fields).index("steps")] = 10.0  # a window of 10 steps
    return s


def grads() -> list:
    return [tensor("gradient", layer, d, STEPS, rms=1e-2, l2=1.0, cos_prev=0.5)
            for d, layer in enumerate(("conv1", "conv2"))]


def dead_finding(activity_steps: float):
    r = run(out("conv1", 0, 1.0, activity_steps), out("conv2", 1, 0.0, activity_steps),
            *grads())
    return next(f for f in find_issues(r) if f.kind == "dead_units")


def test_a_sampled_dead_rate_is_one_level_lower_than_an_exact_one() -> None:
    exact = dead_finding(10.0)
    sampled = dead_finding(1.0)
    assert exact.severity == "critical" and not exact.evidence["dead_rate_sampled"]
    assert sampled.severity == "warning" and sampled.evidence["dead_rate_sampled"]
    # A writer that does not record the step counts (NaN) is read as exact, as before.
    assert dead_finding(np.nan).severity == "critical"
