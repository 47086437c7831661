"""The numbers that show each demo situation, read back from a run's event files (no TensorFlow).

``tests/test_demo.py`` asserts on them, so what the demo claims is checked against what was
actually logged. :func:`story_problems` checks a run's findings against its scenario's story
(``Scenario.story`` in ``models.py``).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tb_introspect.demo.models import SERIOUS, get_scenario
from tb_introspect.read.series import RunSeries, Series


def serious_kinds(run: RunSeries) -> set[str]:
    """Kinds of ``run``'s warning and critical findings."""
    from tb_introspect.diagnose import find_issues

    return {f.kind for f in find_issues(run) if f.severity in SERIOUS}


def scenario_of(run_name: str) -> str:
    """``2_lr_too_high_cnn`` (or ``2_lr_too_high_cnn_3``, a later demo's) -> its scenario."""
    stem = run_name.split("_", 1)[1]
    head, _, tail = stem.rpartition("_")
    return head if tail.isdigit() else stem


def story_problems(run_name: str, kinds: set[str]) -> list[str]:
    """Why the serious finding ``kinds`` of demo run ``run_name`` do not tell its
    scenario's story; empty when they do."""
    return get_scenario(scenario_of(run_name)).story_problems(kinds)


@dataclass(frozen=True)
class Evidence:
    """Per-epoch summaries of one run (index = epoch, 0-based)."""

    loss_median: np.ndarray  # median of the per-step losses of each epoch
    loss_max: np.ndarray  # largest per-step loss of each epoch
    grad_first_last: np.ndarray  # gradient RMS of the first layer / the last layer
    grad_cos: np.ndarray  # median over gradient tensors of cos(this epoch's sum, previous one's)
    first_layer_grad_active: np.ndarray  # fraction of non-zero first-layer gradient entries
    dead_rate: dict[str, np.ndarray]  # per output layer: fraction of dead channels
    hidden_layers: tuple[str, ...]  # layers with trainable variables, input to output

    @property
    def epochs(self) -> int:
        return len(self.loss_median)

    def worst_dead(self, epoch: int = -1) -> tuple[str, float]:
        """The hidden layer with the highest dead rate at ``epoch`` and that rate."""
        rates = {k: float(v[epoch]) for k, v in self.dead_rate.items()
                 if k in self.hidden_layers[:-1] and len(v)}
        if not rates:
            return "", math.nan
        layer = max(rates, key=lambda k: rates[k])
        return layer, rates[layer]

    def summary(self) -> str:
        """One line with the numbers the README and the report quote."""
        layer, dead = self.worst_dead()
        late = self.loss_median[len(self.loss_median) // 2:]
        cos = self.grad_cos[1:]
        return (
            f"loss {self.loss_median[0]:.3f} -> best {np.nanmin(self.loss_median):.3f}"
            f" (epoch {int(np.nanargmin(self.loss_median))}) -> last {self.loss_median[-1]:.3f}"
            f", late/best {np.nanmax(late) / np.nanmin(self.loss_median):.1f}x"
            f"; grad RMS first/last {self.grad_first_last[-1]:.1e}"
            f"; grad cos median {np.nanmedian(cos) if len(cos) else math.nan:+.2f}"
            f"; worst dead {layer} {dead:.0%}"
            f"; first-layer grad non-zero {self.first_layer_grad_active[-1]:.0%}"
        )


def _per_epoch(series: Series, name: str, epochs: int) -> np.ndarray:
    """Field ``name`` at each epoch (the last point logged in it); NaN where none was."""
    out = np.full(epochs, np.nan)
    ep, values = series.epochs, series.field(name)
    for e in range(epochs):
        hit = np.flatnonzero(ep == e)
        if hit.size:
            out[e] = values[hit[-1]]
    return out


def _layer_order(run: RunSeries) -> tuple[str, ...]:
    depth: dict[str, int] = {}
    for s in run.tensors.get("gradient", []):
        depth.setdefault(s.info.layer, s.info.depth)
    return tuple(sorted(depth, key=lambda k: depth[k]))


def _layer_rms(series: Sequence[Series], layer: str, epochs: int) -> np.ndarray:
    """RMS over all of ``layer``'s gradient tensors together: sqrt(Σ l2² / Σ count)."""
    sq = np.zeros(epochs)
    n = np.zeros(epochs)
    for s in series:
        if s.info.layer == layer:
            sq += _per_epoch(s, "l2", epochs) ** 2
            n += _per_epoch(s, "count", epochs)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.sqrt(sq / n)


def collect(run: RunSeries) -> Evidence:
    """Read the demo's evidence from a run logged with ``every="epoch"``."""
    loss = run.metrics["loss"]
    values, ep = loss.field("value"), loss.epochs
    epochs = int(np.nanmax(ep)) + 1
    medians = np.array([np.nanmedian(values[ep == e]) if (ep == e).any() else np.nan
                        for e in range(epochs)])
    maxima = np.array([np.nanmax(values[ep == e]) if (ep == e).any() else np.nan
                       for e in range(epochs)])

    grads = run.tensors.get("gradient", [])
    layers = _layer_order(run)
    first, last = layers[0], layers[-1]
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = _layer_rms(grads, first, epochs) / _layer_rms(grads, last, epochs)
    cos = np.array([_per_epoch(s, "cos_prev", epochs) for s in grads])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # epoch 0 has no previous gradient
        cos_median = np.nanmedian(cos, axis=0) if len(cos) else np.full(epochs, np.nan)
    active = np.array([_per_epoch(s, "activation_rate", epochs)
                       for s in grads if s.info.layer == first])
    dead = {s.info.layer: _per_epoch(s, "dead_rate", epochs)
            for s in run.tensors.get("output", [])}
    return Evidence(
        loss_median=medians, loss_max=maxima, grad_first_last=ratio, grad_cos=cos_median,
        first_layer_grad_active=np.nanmin(active, axis=0) if len(active) else np.full(epochs, 1.0),
        dead_rate=dead, hidden_layers=layers,
    )


def margin_problems(scenario: str, e: Evidence) -> list[str]:
    """Why run evidence ``e`` of ``scenario`` does not show its situation with a margin over
    what its findings need; empty when it does. Every run: a finite loss at every step."""
    problems = []
    if not np.isfinite(e.loss_max).all():
        problems.append(f"a non-finite loss: epoch maxima {e.loss_max}")
    med = e.loss_median
    chance = math.log(10)
    if scenario == "healthy_cnn":
        # Healthy: 0.02-0.09 after 4 epochs; gradient scales within a few x of each other.
        if not med[-1] < 0.2:
            problems.append(f"loss {med[-1]:.3f} after {e.epochs} epochs (healthy: < 0.2)")
        ratio = e.grad_first_last
        if not np.all((ratio > 0.2) & (ratio < 5)):
            problems.append(f"gradient RMS first/last {ratio} outside 0.2-5")
        # A dead_units warning needs 50%; healthy runs have 8-27% in the dense layer.
        if not e.worst_dead()[1] < 0.4:
            problems.append(f"dead units {e.worst_dead()} (healthy: < 40%)")
    elif scenario == "lr_too_high_cnn":
        # It learns at the healthy rate first; after the jump the loss never comes back
        # near its best (loss_rising needs 1.5x the best; 3x is the margin).
        best = float(np.nanmin(med))
        if not best < 0.5 * chance:
            problems.append(f"never learned: best epoch median {best:.3f}")
        if not np.nanmin(med[-3:]) > 3 * best:
            problems.append(f"the last epochs' medians {med[-3:]} come back near the best"
                            f" {best:.3f}")
    elif scenario == "dying_relu_mlp":
        # Dead from the first epoch (a dead_units warning needs 50%), never recovering.
        hidden = [k for k in e.hidden_layers[:-1] if k in e.dead_rate]
        dead = np.array([e.dead_rate[k] for k in hidden])
        if not len(hidden) or not np.all(np.nanmax(dead, axis=0) >= 0.9):
            rates = dict(zip(hidden, dead.tolist(), strict=True))
            problems.append(f"dead rates {rates}: no layer >= 90% at every epoch")
        if not np.all(e.first_layer_grad_active < 0.5):
            problems.append(f"first-layer gradients non-zero {e.first_layer_grad_active}")
    elif scenario == "vanishing_sigmoid_mlp":
        # The finding needs 1e-2; eight sigmoid derivatives (<= 0.25 each) give 4e-5..6e-4.
        if not np.all(e.grad_first_last < 3e-3):
            problems.append(f"gradient RMS first/last {e.grad_first_last} (not all < 3e-3)")
        if not np.all(med > 0.9 * chance):
            problems.append(f"loss medians {med} moved away from chance ({chance:.2f})")
    return problems
