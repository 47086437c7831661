"""The transformer-signal rules (diagnose/transformer.py, and the loss spike score of
diagnose/loss.py they read) on synthetic series: each rule's trigger, the step it names,
and a healthy twin that must stay silent (no TensorFlow here).

The probes are built as the pipeline writes them (``summary_pb.probes_matrix``, float32) and
read back through ``read.series.probes_of``, the read side's one path to them.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tb_introspect import metadata, slots, summary_pb
from tb_introspect.diagnose import Thresholds, find_issues
from tb_introspect.read.provider import KIND_PROBES
from tb_introspect.read.series import RunSeries, Series, TagInfo
from tests.diagnose.findings_synth import kinds, metric, run, tensor

NAN = math.nan
N = 8
STEPS = [100 * (i + 1) for i in range(N)]  # window=100 points
RULES = ["attention_logit_growth", "output_logit_drift", "massive_activations", "loss_spike",
         "update_spike"]


def probes(rows: dict[str, dict[str, list[float]]], steps=STEPS) -> Series:
    """The PROBES series of ``rows`` (row -> {probe field: a value per point})."""
    names = list(rows)
    mats = []
    for j in range(len(steps)):
        vals = {r: [rows[r].get(f, [NAN] * len(steps))[j] for f in slots.PROBE_VALUE_FIELDS]
                for r in names}
        mats.append(summary_pb.probes_matrix(names, vals, epoch=0))
    info = TagInfo(tag=metadata.probes_tag(), kind=KIND_PROBES, version=4, name="probes",
                   fields=slots.PROBE_FIELDS, cadence="window", rows=tuple(names))
    values = np.stack(mats).reshape(len(steps), -1).astype(np.float64)
    return Series(info, np.asarray(steps, dtype=np.int64), np.zeros(len(steps)), values)


def with_probes(rows, *series, steps=STEPS) -> RunSeries:
    """A window run: an output tensor per row (so the run is step-based) and the probes."""
    outs = series or tuple(
        tensor("output", r, d, steps, name=r, shape=(-1, 64), cadence="window", min=-1.0,
               max=1.0) for d, r in enumerate(rows))
    r = run(*outs)
    r.probes = probes(rows, steps)
    return r


#: The rules' full grading: their warnings, provisional ones included (by default a
#: provisional rule's warning is reported as info, test below).
FULL = Thresholds(provisional=frozenset())


def found(r: RunSeries, rule: str):
    return [f for f in find_issues(r, FULL, rules=[rule]) if f.kind != "insufficient_data"]


def test_a_provisional_rules_warning_is_reported_as_info() -> None:
    lse = [10.8, 12, 14, 16, 18, 20, 22, 24]
    r = with_probes({"lm_head": {"logit_lse": lse, "logit_max": [9, 10, 12, 14, 16, 18, 20, 22]}},
                    lm_head())
    (f,) = [f for f in find_issues(r, rules=["output_logit_drift"])
            if f.kind != "insufficient_data"]
    assert f.severity == "info" and f.evidence["provisional"] is True
    assert "provisional" in f.explanation


# ---------------------------------------------------------------- attention logits


@pytest.mark.parametrize("logits, first, title", [
    # past the QK-clip reference at step 500, and already x12 and above 30 at step 400
    ([5, 8, 20, 60, 120, 150, 180, 200], 400, "above 100"),
    ([2, 3, 6, 12, 25, 35, 40, 45], 600, "growing"),  # x10 and above 30, still under 100
])
def test_attention_logit_growth(logits, first, title) -> None:
    r = with_probes({"h.0.attn": {"attn_logit_max": [3.0] * N},
                     "h.1.attn": {"attn_logit_max": logits}})
    (f,) = found(r, "attention_logit_growth")
    assert f.severity == "warning" and title in f.title
    assert f.layers == ["h.1.attn"] and f.evidence["layer"] == "h.1.attn"
    assert f.first_step == first and f.first_epoch is None  # a window run names its step
    assert f.jump == {"tab": "overview", "chart": "probes-attn"}


@pytest.mark.parametrize("logits", [
    [3, 4, 5, 6, 7, 8, 8, 9],  # healthy: grows 3x, stays far below 30
    [40, 42, 41, 43, 44, 42, 45, 44],  # high from the start, not growing
    [5, 6, 7, 150, 8, 8, 9, 9],  # one window above 100, then back: not sustained
])
def test_attention_logits_of_healthy_twins_are_no_finding(logits) -> None:
    r = with_probes({"h.0.attn": {"attn_logit_max": logits}})
    assert found(r, "attention_logit_growth") == []


# ---------------------------------------------------------------- output logits


def lm_head(name: str = "lm_head") -> Series:
    """A language model's head: logits per position, [batch, sequence, vocabulary]."""
    return tensor("output", name, 0, STEPS, name=name, shape=(-1, 16, 64), cadence="window",
                  min=-1.0, max=1.0)


def test_output_logit_drift_of_the_logsumexp_is_a_warning() -> None:
    lse = [10.8, 12, 14, 16, 18, 20, 22, 24]
    r = with_probes({"lm_head": {"logit_lse": lse, "logit_max": [9, 10, 12, 14, 16, 18, 20, 22]}},
                    lm_head())
    (f,) = found(r, "output_logit_drift")
    assert f.severity == "warning" and "logsumexp" in f.title
    assert f.first_step == 700  # 22 - 10.8 >= 10 nats from there on
    assert f.evidence["logit_lse_drift"] == pytest.approx(13.2, abs=0.01)
    assert f.layers == ["lm_head"] and f.jump["chart"] == "probes-head"


def test_a_drift_while_the_loss_still_falls_is_info_and_one_with_a_stalled_loss_a_warning(
) -> None:
    # A classifier growing confident: log Z rises with the top logit.
    rows = {"head": {"logit_lse": [2.3, 4, 6, 8, 10, 12, 14, 16],
                     "logit_max": [1, 3, 5, 7, 9, 11, 13, 15]}}
    steps = np.arange(1, STEPS[-1] + 1)
    head = tensor("output", "head", 0, STEPS, name="head", shape=(-1, 10), cadence="window",
                  min=-1.0, max=1.0)

    def drift_with_loss(loss: np.ndarray):
        r = run(head, metric("loss", steps, loss))
        r.probes = probes(rows)
        (f,) = found(r, "output_logit_drift")
        return f

    f = drift_with_loss(2.3 * np.exp(-steps / 150))  # the loss keeps falling: learning
    assert f.severity == "info" and f.evidence["loss_fell_since"] is True
    assert "went on falling" in f.explanation
    # A classifier at its floor (the loss flat from ~step 50) whose logits' level held: log Z
    # rose with its confidence, which is learning, not drift.
    f = drift_with_loss(np.maximum(2.3 * np.exp(-steps / 50), 0.9))
    assert f.severity == "info" and f.evidence["loss_fell_since"] is False
    assert f.evidence["per_position"] is False and "level" in f.explanation


def test_a_drift_of_the_logits_level_is_a_warning_in_any_head() -> None:
    # The same classifier, but the mean of its logits (what the softmax cannot see) moved
    # 12 nats with log Z: the drift z-loss is for, whatever the loss does.
    rows = {"head": {"logit_lse": [2.3, 4, 6, 8, 10, 12, 14, 16],
                     "logit_max": [1, 3, 5, 7, 9, 11, 13, 15]}}
    head = tensor("output", "head", 0, STEPS, name="head", shape=(-1, 10), cadence="window",
                  min=-1.0, max=1.0, mean=[0, 1.5, 3.5, 5.5, 7.5, 9.5, 11.5, 13.5])
    steps = np.arange(1, STEPS[-1] + 1)
    r = run(head, metric("loss", steps, 2.3 * np.exp(-steps / 150)))
    r.probes = probes(rows)
    (f,) = found(r, "output_logit_drift")
    assert f.severity == "warning" and f.evidence["logit_level_drift"] == pytest.approx(13.5)


def test_a_language_models_drift_with_a_stalled_loss_is_a_warning() -> None:
    rows = {"lm_head": {"logit_lse": [3.5, 5, 7, 9, 11, 13, 15, 17],
                        "logit_max": [1, 3, 5, 7, 9, 11, 13, 15]}}
    steps = np.arange(1, STEPS[-1] + 1)
    for loss, severity in ((np.maximum(3.5 * np.exp(-steps / 50), 0.9), "warning"),
                           (3.5 * np.exp(-steps / 150), "info")):
        r = run(lm_head(), metric("loss", steps, loss))
        r.probes = probes(rows)
        (f,) = found(r, "output_logit_drift")
        assert f.severity == severity and f.evidence["per_position"] is True


def test_a_steadily_growing_largest_logit_is_info() -> None:
    r = with_probes({"lm_head": {"logit_lse": [10.8, 10.5, 10.9, 10.6, 10.8, 10.7, 10.9, 10.8],
                                 "logit_max": [8, 12, 18, 25, 32, 40, 48, 55]}})
    (f,) = found(r, "output_logit_drift")
    assert f.severity == "info" and "largest logit" in f.title and f.first_step == 500


@pytest.mark.parametrize("lse, lmax", [
    # a language model learning: log Z falls from ln V a little, the largest logit grows 2.4x
    ([10.8, 9, 8, 7.5, 7.3, 7.2, 7.1, 7.0], [5, 7, 9, 10, 11, 11.5, 12, 12]),
    # a jump of 12 nats that comes back: not a drift
    ([10.8, 11, 23, 11, 10.9, 11.2, 10.7, 11], [5, 6, 40, 6, 6, 6, 6, 6]),
])
def test_output_logits_of_healthy_twins_are_no_finding(lse, lmax) -> None:
    r = with_probes({"lm_head": {"logit_lse": lse, "logit_max": lmax}})
    assert found(r, "output_logit_drift") == []


# ---------------------------------------------------------------- massive activations


def out(name, depth, max_abs, steps=STEPS):
    return tensor("output", name, depth, steps, name=name, shape=(-1, 64), cadence="window",
                  min=-0.5 * np.asarray(max_abs), max=max_abs)


def test_massive_activations_from_max_abs_over_the_median() -> None:
    grow = [5, 5, 50, 800, 2000, 2500, 2600, 2600]
    rows = {"h.0.mlp": {"abs_median": [0.5] * N, "kurtosis": [3.2] * N},
            "h.1.mlp": {"abs_median": [0.5] * N, "kurtosis": [3.5] * N}}
    r = with_probes(rows, out("h.0.mlp", 0, [5.0] * N), out("h.1.mlp", 1, grow))
    (f,) = found(r, "massive_activations")
    assert f.severity == "warning" and f.layers == ["h.1.mlp"]
    assert f.first_step == 400  # 800 > 100 and 1600x the median from the 4th point on
    assert f.evidence["max_to_median_ratio_peak"] == pytest.approx(5200, rel=1e-5)
    assert f.jump["chart"] == "probes-ratio"


def test_massive_activations_across_probe_points() -> None:
    """A paced run's probe points between its points hold the attention and head probes only
    (docs/options.md, "Probe points"): the layer outputs' are read at the points, whose
    warning the probe points between them leave as it is without them."""
    grow = [5, 5, 50, 800, 2000, 2500, 2600, 2600]
    steps = sorted([*STEPS, *(s + 50 for s in STEPS[:-1])])
    at = [steps.index(s) for s in STEPS]

    def at_points(values: list[float]) -> list[float]:
        spread = [NAN] * len(steps)
        for j, v in zip(at, values, strict=True):
            spread[j] = v
        return spread

    rows = {"h.0.mlp": {"abs_median": at_points([0.5] * N), "kurtosis": at_points([3.2] * N)},
            "h.1.mlp": {"abs_median": at_points([0.5] * N), "kurtosis": at_points([3.5] * N)},
            "h.0.attn": {"attn_logit_max": [4.0] * len(steps)}}
    r = with_probes(rows, out("h.0.mlp", 0, [5.0] * N), out("h.1.mlp", 1, grow), steps=steps)
    (f,) = found(r, "massive_activations")
    assert f.severity == "warning" and f.layers == ["h.1.mlp"] and f.first_step == 400


def test_heavy_tails_alone_are_info() -> None:
    rows = {"h.0.mlp": {"abs_median": [0.5] * N, "kurtosis": [3, 20, 150, 300, 400, 420, 430,
                                                             440]}}
    r = with_probes(rows, out("h.0.mlp", 0, [40.0] * N))  # 80x the median: not massive
    (f,) = found(r, "massive_activations")
    assert f.severity == "info" and "kurtosis" in f.title and f.first_step == 300


@pytest.mark.parametrize("max_abs, med, kurt", [
    (5.0, 0.7, 3.1),  # healthy: Gaussian-like
    (200.0, 1.0, 8.0),  # above 100 but only 200x the median
    (50.0, 0.0, 500.0),  # a rectifier output mostly zeros: kurtosis measures sparsity
])
def test_outputs_of_healthy_twins_are_no_finding(max_abs, med, kurt) -> None:
    rows = {"h.0.mlp": {"abs_median": [med] * N, "kurtosis": [kurt] * N}}
    r = with_probes(rows, out("h.0.mlp", 0, [max_abs] * N))
    assert found(r, "massive_activations") == []


# ---------------------------------------------------------------- loss spikes (the score)


def loss_curve(n=400, spike_at=None, height=1.0, seed=0):
    """A decreasing loss with 1% noise; ``height`` added at step ``spike_at``."""
    steps = np.arange(1, n + 1)
    v = 2.0 + 3.0 * np.exp(-steps / 80) + 0.02 * np.random.default_rng(seed).standard_normal(n)
    if spike_at is not None:
        v[spike_at - 1] += height
    return steps, v


def test_loss_spike_six_sigma_above_the_trailing_mean() -> None:
    steps, v = loss_curve(spike_at=300)
    (f,) = found(run(metric("loss", steps, v)), "loss_spike")
    assert f.first_step == 300 and f.evidence["spikes"] == 1
    assert f.evidence["largest_score_sigmas"] > 6
    # 1.4x its recent median: the score alone sees it.
    assert f.evidence["spikes_by_ratio"] == 0 and "recent median" not in f.title
    assert f.severity == "info"  # 3.1 after a start near 5: the run kept its progress


def test_loss_spike_above_the_start_is_a_warning_and_short_runs_use_what_they_have() -> None:
    steps, v = loss_curve(n=40, spike_at=30, height=4.0)
    (f,) = found(run(metric("loss", steps, v)), "loss_spike")
    assert f.first_step == 30 and f.severity == "warning"
    assert f.evidence["above_starting_loss"] is True


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_loss_without_spike_is_no_finding(seed) -> None:
    steps, v = loss_curve(seed=seed)
    assert found(run(metric("loss", steps, v)), "loss_spike") == []
    # A flat loss: the trailing std is 0, and a rounding-size bump is no spike.
    flat = np.full(200, 1.0)
    flat[150] += 1e-6
    assert found(run(metric("loss", np.arange(1, 201), flat)), "loss_spike") == []


# ---------------------------------------------------------------- update spike


VAR_STEPS = list(range(10, 410, 10))  # a point every 10 steps


def kernels(spikes: dict[str, int], seed=0):
    """Kernels of 3 layers with per-point update ratios near 1e-2, ``spikes[layer]``: the
    point index where that layer's ratio jumps 50x."""
    rng = np.random.default_rng(seed)
    out = []
    for d, layer in enumerate(("h.0", "h.1", "h.2")):
        ratio = 1e-2 * (1 + 0.2 * rng.standard_normal(len(VAR_STEPS)))
        if layer in spikes:
            ratio[spikes[layer]] *= 50
        out.append(tensor("variable", layer, d, VAR_STEPS, cadence="window",
                          update_ratio=ratio))
    return out


def test_update_spike_names_the_layer_that_moved_first() -> None:
    steps, v = loss_curve(spike_at=305, height=1.0)
    # h.1 jumps at the point of step 300, h.2 at step 310 (the window holding the loss spike)
    r = run(metric("loss", steps, v), *kernels({"h.1": 29, "h.2": 30}))
    (f,) = found(r, "update_spike")
    assert f.severity == "warning" and f.evidence["first_layer"] == "h.1"
    assert f.evidence["update_spike_step"] == 300 and f.evidence["loss_spike_step"] == 305
    assert f.evidence["steps_before_loss"] == 5 and "5 steps before" in f.title
    assert f.layers == ["h.1", "h.2"] and f.first_step == 300
    assert f.jump["chart"] == "update_ratio" and f.jump["view"] == "variable"


def test_update_spike_in_the_window_of_the_loss_spike() -> None:
    steps, v = loss_curve(spike_at=305, height=1.0)
    (f,) = found(run(metric("loss", steps, v), *kernels({"h.2": 30})), "update_spike")
    assert f.evidence["first_layer"] == "h.2" and f.evidence["same_window"] is True
    assert "window of steps 301-310" in f.title


def test_update_or_loss_spike_alone_is_no_update_spike() -> None:
    steps, v = loss_curve()
    # An update spike with no loss spike after it.
    assert found(run(metric("loss", steps, v), *kernels({"h.1": 29})), "update_spike") == []
    # A loss spike with no update spike before it (a bad batch): only the loss finding.
    steps, v = loss_curve(spike_at=305, height=1.0)
    r = run(metric("loss", steps, v), *kernels({}))
    assert "update_spike" not in kinds(find_issues(r))
    assert kinds(find_issues(r, rules=["loss_spike"]))["loss_spike"] == "info"
    # An update spike long before the loss spike does not explain it.
    assert found(run(metric("loss", steps, v), *kernels({"h.1": 10})), "update_spike") == []


# ---------------------------------------------------------------- runs without probes


def test_runs_without_probes_skip_the_probe_rules() -> None:
    r = run(*kernels({}), metric("loss", *loss_curve()))
    assert r.probes is None
    got = {f.kind for f in find_issues(r, rules=RULES)}
    assert got == set()
