"""Unit tests of the findings rules on synthetic series: each rule's trigger, its edges,
too-few-points and partial runs (no TensorFlow here)."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tb_introspect.diagnose import (
    RULES,
    Finding,
    Thresholds,
    find_issues,
    findings_json,
    format_findings,
)
from tb_introspect.diagnose.activity import quantile_cdf
from tb_introspect.diagnose.core import first_sustained, fmt_sigmas, fmt_times, point_spans
from tests.diagnose.findings_synth import epochs_steps, kinds, metric, metric_epoch, run, tensor

N = 8
STEPS = epochs_steps(N)  # 10 steps per epoch


def grads(rms_by_layer: dict[str, float | list[float]], steps=STEPS, cadence="epoch", **kw):
    """Gradient kernels of layers in depth order with the given RMS."""
    return [tensor("gradient", layer, d, steps, rms=rms, cadence=cadence, **kw)
            for d, (layer, rms) in enumerate(rms_by_layer.items())]


def relu_out(layer, depth, dead, steps=STEPS, activation_rate=0.4):
    return tensor("output", layer, depth, steps, name=layer, shape=(-1, 16), min=0.0,
                  max=3.0, zero_fraction=0.5, dead_rate=dead, activation_rate=activation_rate)


# ---------------------------------------------------------------- core helpers


def test_first_sustained_needs_k_in_a_row_or_a_run_to_the_end() -> None:
    assert first_sustained(np.array([0, 1, 0, 1, 1, 1, 0], bool), 3) == 3
    assert first_sustained(np.array([0, 1, 0, 1, 0, 1, 0], bool), 2) is None
    assert first_sustained(np.array([0, 0, 0, 0, 1, 1], bool), 3) == 4  # reaches the end
    assert first_sustained(np.array([0, 0, 0, 0, 0, 1], bool), 3) is None  # one last point


def test_point_spans_use_the_typical_gap_for_a_resumed_first_point() -> None:
    assert point_spans(np.array([45, 90, 135])).tolist() == [45, 45, 45]
    assert point_spans(np.array([10045, 10090, 10135])).tolist() == [45, 45, 45]
    assert point_spans(np.array([5])).tolist() == [5]


def test_quantile_cdf_interpolates_and_counts_ties() -> None:
    q = np.array([0, 25, 50, 75, 100.0])
    v = np.array([-1, -0.5, 0, 0.5, 1.0])
    assert quantile_cdf(v, q, 0.25) == pytest.approx([0.625])
    assert quantile_cdf(v, q, -2) == [0] and quantile_cdf(v, q, 2) == [1]
    tied = np.array([0.0, 0.2, 1.0, 1.0, 1.0])
    assert quantile_cdf(tied, q, np.nextafter(1.0, 0)) == pytest.approx([0.5], abs=1e-6)
    # One row per point.
    assert quantile_cdf(np.stack([v, tied]), q, 0.1).tolist() == pytest.approx([0.55, 0.125])


def test_finding_json_is_plain_json_with_null_for_non_finite() -> None:
    f = Finding(kind="k", severity="warning", title="t", evidence={"a": np.float64(np.nan),
                "b": np.int64(3), "c": 1.234567891, "d": "x"}, layers=["l"])
    doc = f.to_json()
    assert json.loads(json.dumps(doc)) == doc
    assert doc["evidence"] == {"a": None, "b": 3, "c": 1.235, "d": "x"}
    assert set(doc) >= {"kind", "severity", "title", "first_step", "first_epoch", "layers",
                        "tags", "view", "metric", "evidence", "explanation", "suggestion", "jump"}
    with pytest.raises(ValueError):
        Finding(kind="k", severity="error", title="t")


# ---------------------------------------------------------------- NaN / Inf


def test_nonfinite_reports_the_first_tensor_and_step_as_critical() -> None:
    nan_b = np.zeros(N)
    nan_b[3:] = 5
    inf_a = np.zeros(N)
    inf_a[5:] = 1
    loss = np.linspace(2, 1, 40)
    loss[35:] = np.nan
    r = run(
        tensor("output", "a", 0, STEPS, name="a", posinf_count=inf_a, rms=1.0),
        *grads({"a": 1e-2, "b": 1e-2}),
        tensor("gradient", "b", 1, STEPS, name="b/bias", shape=(8,), nan_count=nan_b, rms=1e-2),
        metric("loss", list(range(1, 41)), loss, epochs=np.repeat(np.arange(4), 10)),
    )
    f = next(f for f in find_issues(r) if f.kind == "nonfinite")
    assert f.severity == "critical"
    assert (f.first_step, f.first_epoch) == (36, 3)  # the loss (step 36) before the tensors (40)
    assert f.metric == "loss"
    assert f.tags == ["introspect/gradient/b/bias"]
    assert f.evidence["first_tensor_step"] == 40 and f.evidence["nan_values"] == 5
    assert f.evidence["tensors_ever_nonfinite"] == 2
    assert find_issues(r)[0].kind == "nonfinite"  # most severe first


def test_one_nonfinite_point_is_enough_and_other_rules_say_insufficient_data() -> None:
    r = run(tensor("gradient", "a", 0, [10], nan_count=3, rms=np.nan),
            tensor("gradient", "b", 1, [10], rms=1.0))
    got = kinds(find_issues(r))
    assert got == {"nonfinite": "critical", "insufficient_data": "info"}


def test_statistics_of_a_nan_tensor_are_not_evidence_of_anything_else() -> None:
    # After the NaN, "nothing finite" reads as dead rate 1 and activation rate 0.
    nan = np.zeros(N)
    nan[4:] = 100
    broken = relu_out("d1", 0, [0, 0, 0, 0, 1, 1, 1, 1],
                      activation_rate=[0.5] * 4 + [0.0] * 4)
    broken.values[:, broken.info.fields.index("nan_count")] = nan
    got = kinds(find_issues(run(broken, relu_out("head", 1, 0.0))))
    assert got == {"nonfinite": "critical"}


# ---------------------------------------------------------------- gradient scale


def test_vanishing_gradients_flags_a_sustained_gap_of_two_orders() -> None:
    r = run(*grads({"d1": 1e-6, "d2": 1e-5, "d3": 3e-3, "out": 1e-2}))
    f = next(f for f in find_issues(r) if f.kind == "vanishing_gradients")
    assert f.severity == "warning" and (f.first_step, f.first_epoch) == (10, 0)
    assert f.layers == ["d1", "d2"]  # the layers at least one order below the last
    assert f.evidence["orders_below_last"] == pytest.approx(4.0)
    assert f.jump == {"tab": "overview", "view": "gradient", "chart": "stack"}


@pytest.mark.parametrize("first", [
    [1e-3] * N,  # one order: normal spread between layers
    [1e-3, 1e-3, 1e-3, 1e-6, 1e-3, 1e-3, 1e-3, 1e-3],  # one bad point
    [0.0] * N,  # exactly zero: the dead-units rule's business
])
def test_vanishing_gradients_is_no_warning_on_spread_blips_and_zeros(first) -> None:
    r = run(*grads({"d1": first, "d2": 1e-3, "out": 1e-2}))
    # A 10x gap (d1 at 1e-3 against 1e-2) is the graded "info"; never a warning.
    assert kinds(find_issues(r)).get("vanishing_gradients") == (None if first[0] == 0 else "info")
    calm = run(*grads({"d1": [3 * x for x in first], "d2": 1e-3, "out": 1e-2}))
    assert "vanishing_gradients" not in kinds(find_issues(calm))


def test_vanishing_gradients_flags_the_point_where_it_starts() -> None:
    first = [1e-3, 1e-3, 1e-3, 1e-5, 1e-5, 1e-6, 1e-6, 1e-6]
    f = next(f for f in find_issues(run(*grads({"d1": first, "out": 1e-2})))
             if f.kind == "vanishing_gradients")
    assert f.first_epoch == 3


def test_exploding_gradients_divides_epoch_sums_by_the_steps_they_span() -> None:
    # 100 steps per epoch: an epoch sum of RMS 50 is at least 0.5 per step: not flagged;
    # 500 is at least 5 per step.
    steps = epochs_steps(N, per_epoch=100)
    calm = run(*grads({"a": 50.0, "b": 50.0}, steps=steps))
    assert "exploding_gradients" not in kinds(find_issues(calm))
    hot = run(*grads({"a": 500.0, "b": 500.0}, steps=steps))
    f = next(f for f in find_issues(hot) if f.kind == "exploding_gradients")
    assert f.evidence["median_layer_rms_per_step"] == pytest.approx(5.0)
    # The same numbers logged per step are per-step values.
    per_step = run(*grads({"a": 50.0, "b": 50.0}, steps=steps, cadence="step"))
    assert "exploding_gradients" in kinds(find_issues(per_step))


def test_exploding_gradients_flags_growth_by_orders_of_magnitude() -> None:
    rms = [5e-4, 5e-4, 5e-4, 5e-3, 2e-2, 1e-1, 3e-1, 5e-1]  # never above 1
    f = next(f for f in find_issues(run(*grads({"a": rms, "b": rms}, cadence="step")))
             if f.kind == "exploding_gradients")
    assert f.first_epoch == 5  # the first point 100x above the start
    assert f.evidence["growth_orders"] == pytest.approx(3.0)
    slow = list(np.logspace(-3, -1.5, N))  # 1.5 orders: not flagged
    assert "exploding_gradients" not in kinds(find_issues(run(*grads({"a": slow}))))


def test_oscillation_needs_persistent_anti_aligned_gradients() -> None:
    cos = [np.nan, 0.5, 0.3, -0.4, -0.3, -0.5, -0.2, -0.4]
    flat_loss = metric_epoch("loss", STEPS, [1.0, 0.6, 0.5, 0.5, 0.55, 0.5, 0.52, 0.5])
    f = next(f for f in find_issues(run(*grads({"a": 1e-2, "b": 1e-2}, cos_prev=cos),
                                        flat_loss)) if f.kind == "gradient_oscillation")
    assert f.severity == "warning" and f.first_epoch == 3
    assert f.evidence["share_negative_cos"] == 1.0 and f.evidence["loss_stalled"] is True
    # Loss still falling fast over the same stretch: a passing phase, "info".
    falling = metric_epoch("loss", STEPS, [1.0, 0.6, 0.3, 0.1, 0.05, 0.02, 0.01, 0.005])
    f = next(f for f in find_issues(run(*grads({"a": 1e-2, "b": 1e-2}, cos_prev=cos),
                                        falling)) if f.kind == "gradient_oscillation")
    assert f.severity == "info"
    # Mostly aligned in the second half: nothing.
    mixed = [np.nan, -0.5, -0.4, -0.3, 0.4, -0.3, 0.6, 0.5]
    assert "gradient_oscillation" not in kinds(
        find_issues(run(*grads({"a": 1e-2, "b": 1e-2}, cos_prev=mixed), flat_loss)))


def test_oscillation_at_the_losss_floor_is_info_and_a_stall_above_it_a_warning() -> None:
    """A language model at its floor: the per-step loss falls from ln 32 to the language's
    entropy within the first two windows and sits there, while consecutive windows' summed
    gradients point against each other (Adam at a constant rate, bouncing around the
    minimum). Nothing is wrong. The same cosines with the loss stuck at 0.65 of its start (a
    too-high rate holding it up) are the stall the warning is for."""
    cos = [np.nan, 0.5, -0.2, -0.3, -0.3, -0.4, -0.2, -0.3]
    steps = np.arange(1, STEPS[-1] + 1)
    at_floor = np.maximum(3.47 * np.exp(-steps / 8), 0.8)
    f = next(f for f in find_issues(run(*grads({"a": 1e-2, "b": 1e-2}, cos_prev=cos),
                                        metric("loss", steps, at_floor)))
             if f.kind == "gradient_oscillation")
    assert f.severity == "info" and f.evidence["loss_stalled"] is True
    assert f.evidence["loss_at_floor"] is True and "floor" in f.explanation
    stalled = np.maximum(3.47 * np.exp(-steps / 8), 0.65 * 3.47)
    f = next(f for f in find_issues(run(*grads({"a": 1e-2, "b": 1e-2}, cos_prev=cos),
                                        metric("loss", steps, stalled)))
             if f.kind == "gradient_oscillation")
    assert f.severity == "warning" and f.evidence["loss_at_floor"] is False


def test_jagged_layer_scale_stack_is_oscillation() -> None:
    zig = [1e-2, 1e-4, 1e-2, 1e-4, 1e-2, 1e-4, 1e-2, 1e-4]
    f = next(f for f in find_issues(run(*grads({"a": zig, "b": 1e-3})))
             if f.kind == "gradient_oscillation")
    assert f.severity == "warning" and f.evidence["stack_roughness_orders"] > 0.5
    smooth = list(np.logspace(-2, -4, N))
    assert "gradient_oscillation" not in kinds(find_issues(run(*grads({"a": smooth,
                                                                         "b": 1e-3}))))


# ---------------------------------------------------------------- activity


@pytest.mark.parametrize(("dead", "severity"), [(0.3, "info"), (0.6, "warning"), (1.0, "critical")])
def test_dead_units_severity_follows_the_dead_share(dead, severity) -> None:
    rates = [0.0, 0.0, dead, dead, dead, dead, dead, dead]
    r = run(relu_out("conv1", 0, rates), relu_out("conv2", 1, 0.0), *grads({"conv1": 1e-2}))
    f = next(f for f in find_issues(r) if f.kind == "dead_units")
    assert f.severity == severity and f.first_epoch == 2
    assert f.layers == ["conv1"] and f.view == "output"
    assert f.jump["tag"] == "introspect/output/conv1"


def test_dead_units_ignores_blips_signed_layers_and_input_preprocessing() -> None:
    blip = [0.0, 0.0, 0.9, 0.0, 0.0, 0.0, 0.0, 0.0]
    signed = tensor("output", "bn", 2, STEPS, name="bn", min=-2.0, zero_fraction=0.5,
                    dead_rate=0.9)
    pixels = relu_out("flatten", 0, 0.9)  # before the first weighted layer: the data
    r = run(pixels, relu_out("conv1", 1, blip), signed,
            tensor("variable", "conv1", 1, STEPS, update_ratio=1e-3))
    assert "dead_units" not in kinds(find_issues(r))


def test_dead_units_from_gradients_when_outputs_were_not_logged() -> None:
    r = run(*grads({"d1": 1e-3, "d2": 1e-3}, dead_rate=[0, 0, 0.7, 0.7, 0.8, 0.8, 0.8, 0.8]))
    f = next(f for f in find_issues(r) if f.kind == "dead_units")
    assert f.view == "gradient" and f.severity == "warning"


def test_dying_units_flags_a_collapsing_activation_rate() -> None:
    rate = [0.5, 0.45, 0.3, 0.1, 0.04, 0.03, 0.02, 0.02]
    head = relu_out("head", 1, 0.0)
    f = next(f for f in find_issues(run(relu_out("d1", 0, 0.0, activation_rate=rate), head))
             if f.kind == "dying_units")
    assert f.first_epoch == 4 and f.evidence["activation_rate_start"] == pytest.approx(0.475)
    sparse_from_start = [0.04] * N  # sparse, but not collapsing
    assert "dying_units" not in kinds(
        find_issues(run(relu_out("d1", 0, 0.0, activation_rate=sparse_from_start), head)))
    # The output layer is never judged.
    assert "dying_units" not in kinds(find_issues(run(relu_out("d1", 0, 0.0,
                                                               activation_rate=rate))))


TANH_SATURATED = [-1.0, -1.0, -0.999, -0.995, 0.1, 0.995, 0.999, 1.0, 1.0]
TANH_OK = [-0.9, -0.6, -0.3, -0.1, 0.0, 0.1, 0.3, 0.6, 0.9]


def squash(layer, depth, qv, zero=0.0):
    return tensor("output", layer, depth, STEPS, name=layer, quantile_values=qv,
                  zero_fraction=zero)


def test_saturated_tanh_units() -> None:
    r = run(squash("t1", 0, TANH_SATURATED), squash("t2", 1, TANH_OK), squash("head", 2, TANH_OK))
    f = next(f for f in find_issues(r) if f.kind == "saturated_units")
    assert f.severity == "warning" and f.layers == ["t1"]
    assert f.evidence["activation"] == "tanh"
    assert f.evidence["saturated_share_max"] == pytest.approx(0.75, abs=0.02)


def test_an_output_fixed_by_the_positions_is_not_units() -> None:
    """A rotary embedding's output (cos/sin of the positions: half its values near +-1 at
    the first positions' angles) is the same at every point: no unit is saturated there.
    The same values from a layer whose statistics move with training are saturated units."""
    fixed = tensor("output", "rotary_emb", 0, STEPS, name="rotary_emb",
                   quantile_values=TANH_SATURATED, zero_fraction=0.0, mean=0.31, rms=0.71)
    head = squash("head", 1, TANH_OK)
    assert "saturated_units" not in kinds(find_issues(run(fixed, head)))
    moving = tensor("output", "rotary_emb", 0, STEPS, name="rotary_emb",
                    quantile_values=TANH_SATURATED, zero_fraction=0.0, mean=0.31,
                    rms=list(np.linspace(0.70, 0.75, N)))
    assert kinds(find_issues(run(moving, head)))["saturated_units"] == "warning"


def test_saturated_sigmoid_and_what_is_not_saturation() -> None:
    sig = [1e-6, 1e-5, 1e-3, 0.005, 0.5, 0.995, 0.999, 1.0, 1.0]
    assert kinds(find_issues(run(squash("s1", 0, sig), squash("head", 1, TANH_OK)))) == {
        "saturated_units": "warning"}
    # The model's output layer (a confident softmax) is not a finding.
    assert "saturated_units" not in kinds(find_issues(run(squash("t1", 0, TANH_OK),
                                                          squash("head", 1, sig))))
    # Rectified outputs (many exact zeros) are the dead-units rule's business.
    relu = [0, 0, 0, 0, 0, 0.001, 0.2, 0.6, 1.0]
    assert "saturated_units" not in kinds(find_issues(run(squash("r1", 0, relu, zero=0.6),
                                                          squash("head", 1, TANH_OK))))


# ---------------------------------------------------------------- update ratio


def test_update_ratio_high_uses_a_per_step_lower_bound() -> None:
    steps = epochs_steps(N, per_epoch=10)
    # 0.5 over 10 steps: at least 0.05 per step: fine. 5.0 over 10 steps: >= 0.5 per step.
    ok = tensor("variable", "d1", 0, steps, update_ratio=0.5)
    hot = tensor("variable", "d2", 1, steps, update_ratio=5.0)
    bias = tensor("variable", "d2", 1, steps, name="d2/bias", shape=(8,), update_ratio=50.0)
    f = next(f for f in find_issues(run(ok, hot, bias)) if f.kind == "update_ratio_high")
    assert f.layers == ["d2"] and f.tags == ["introspect/variable/d2/kernel"]
    assert f.evidence["per_step_ratio_max"] == pytest.approx(0.5)
    assert "update_ratio_high" not in kinds(find_issues(run(ok, bias)))


def test_large_updates_the_loss_pays_off_are_info() -> None:
    """Full-batch Adam at 1e-2 (one step a point): every kernel moves 0.1-0.2 of its norm a
    step while the loss falls fastest: info. The same steps with the loss not falling (or
    rising, an exploding run) are the warning."""
    steps = epochs_steps(N, per_epoch=1)
    hot = tensor("variable", "d1", 0, steps, update_ratio=[0.2, 0.18, 0.15, 0.12, 0.11, 0.1,
                                                            0.08, 0.05])
    falling = metric_epoch("loss", steps, [2.3, 1.5, 0.9, 0.5, 0.3, 0.2, 0.15, 0.1])
    f = next(f for f in find_issues(run(hot, falling)) if f.kind == "update_ratio_high")
    assert f.severity == "info" and f.evidence["loss_fell_since"] is True
    rising = metric_epoch("loss", steps, [2.3, 2.4, 2.6, 3.0, 3.5, 4.0, 5.0, 6.0])
    f = next(f for f in find_issues(run(hot, rising)) if f.kind == "update_ratio_high")
    assert f.severity == "warning" and f.evidence["loss_fell_since"] is False


def test_update_ratio_low_only_when_frozen_over_the_second_half() -> None:
    frozen = tensor("variable", "d1", 0, STEPS, update_ratio=[1e-3] * 4 + [1e-7] * 4)
    moving = tensor("variable", "d2", 1, STEPS, update_ratio=[1e-3] * 7 + [1e-7])
    f = next(f for f in find_issues(run(frozen, moving)) if f.kind == "update_ratio_low")
    assert f.severity == "info" and f.layers == ["d1"]


# ---------------------------------------------------------------- loss


def test_loss_not_decreasing_and_a_healthy_loss() -> None:
    flat = run(metric_epoch("loss", STEPS, [2.30, 2.31, 2.29, 2.30, 2.28, 2.3, 2.29, 2.28]))
    f = next(f for f in find_issues(flat) if f.kind == "loss_not_decreasing")
    assert f.severity == "warning" and f.first_epoch == 2 and f.metric == "loss"
    healthy = run(metric_epoch("loss", STEPS, [2.0, 0.5, 0.2, 0.1, 0.05, 0.06, 0.03, 0.04]))
    assert find_issues(healthy) == []


def test_a_loss_flat_over_a_few_short_epochs_is_not_judged_yet() -> None:
    """Epochs of 4 steps under a warm-up: three flat epochs are 8 optimizer steps at a rate
    near zero, not a loss that does not decrease. Flat for 60 steps after the first epoch,
    it is."""
    short = epochs_steps(4, per_epoch=4)
    assert "loss_not_decreasing" not in kinds(find_issues(run(
        metric_epoch("loss", short, [2.30, 2.31, 2.29, 2.30]))))
    long = epochs_steps(17, per_epoch=4)
    f = next(f for f in find_issues(run(metric_epoch("loss", long, [2.3] * 17)))
             if f.kind == "loss_not_decreasing")
    assert f.severity == "warning"


def test_loss_rising_after_progress() -> None:
    med = [2.0, 0.8, 0.3, 0.2, 0.35, 1.5, 2.1, 2.2]
    f = next(f for f in find_issues(run(metric_epoch("loss", STEPS, med)))
             if f.kind == "loss_rising")
    assert f.first_epoch == 5 and f.evidence["best_median"] == pytest.approx(0.2)
    # Noise of a small loss near convergence is not "rising" (0.02 -> 0.05 is 2.5x).
    noisy = [2.0, 0.5, 0.1, 0.02, 0.05, 0.03, 0.05, 0.04]
    assert find_issues(run(metric_epoch("loss", STEPS, noisy))) == []


def test_loss_trend_from_per_step_values_grouped_by_epoch() -> None:
    rng = np.random.default_rng(0)
    epochs = np.repeat(np.arange(6), 20)
    values = 2.3 * np.exp(rng.normal(0, 0.02, epochs.size))
    r = run(metric("loss", np.arange(1, epochs.size + 1), values, epochs=epochs))
    assert "loss_not_decreasing" in kinds(find_issues(r))


def _decaying_loss(n=200, seed=1):
    """A loss from 2 down to 0.05 with 10% noise, 40 steps per epoch."""
    rng = np.random.default_rng(seed)
    values = np.exp(np.linspace(np.log(2.0), np.log(0.05), n)) * np.exp(rng.normal(0, 0.1, n))
    steps = np.arange(1, n + 1)
    return steps, values, steps // 40


def _spike(steps, values, epochs):
    found = [f for f in find_issues(run(metric("loss", steps, values, epochs)))
             if f.kind == "loss_spike"]
    assert len(found) <= 1, [f.title for f in found]
    return found[0] if found else None


def test_loss_spike_by_ratio_to_the_recent_median() -> None:
    steps, values, epochs = _decaying_loss()
    assert _spike(steps, values, epochs) is None
    spiky = values.copy()
    spiky[[120, 150, 180]] = 5.0
    f = _spike(steps, spiky, epochs)
    # Three single batches above the starting loss (2), the loss back on its trend right
    # after each: hard batches (a batch of 2 has them), the run kept its progress.
    assert f.severity == "info" and f.first_step == 121 and f.evidence["spikes"] == 3
    assert f.evidence["spikes_by_ratio"] == 3 and f.evidence["above_starting_loss"] is False
    assert f.evidence["largest_ratio_to_recent_median"] > 10
    # A spike above the starting loss after which the loss stays up (the next 20 steps'
    # median at half the start or more) is a warning: the run lost its progress.
    one = values.copy()
    one[150:175] = 5.0
    f = _spike(steps, one, epochs)
    assert f.severity == "warning" and f.evidence["above_starting_loss"] is True
    # One below it (10x the recent median, above half the start) is info. The steep decay
    # widens the trailing standard deviation: the score alone would miss it.
    low = values.copy()
    low[150] = 1.5
    f = _spike(steps, low, epochs)
    assert f.severity == "info" and f.evidence["spikes"] == 1
    assert f.evidence["spikes_by_score"] == 0 and f.evidence["largest_score_sigmas"] < 6
    assert "x the recent median" in f.title


def test_loss_spike_by_ratio_where_a_wide_trailing_spread_hides_it_from_the_score() -> None:
    """A second spike 40x the recent median within 128 steps of a 50.0 one: the first
    inflates the trailing standard deviation past what the second reaches, so only the
    ratio criterion sees the second."""
    steps, values, epochs = _decaying_loss()
    two = values.copy()
    two[[100, 150]] = [50.0, 5.0]
    f = _spike(steps, two, epochs)
    assert f.evidence["spikes"] == 2 and f.first_step == 101
    assert f.evidence["spikes_by_ratio"] == 2 and f.evidence["spikes_by_score"] == 1


def test_loss_spike_by_score_below_the_ratio_criterion() -> None:
    """A batch 6x above a converged loss, below half the starting loss, is no spike by
    ratio (a ratio to a median near zero says little) and one by its score: info."""
    steps = np.arange(1, 401)
    noise = np.exp(np.random.default_rng(2).normal(0, 0.02, 400))
    v = (0.05 + 2 * np.exp(-steps / 20)) * noise
    assert _spike(steps, v, steps // 40) is None
    v[300] = 0.3
    f = _spike(steps, v, steps // 40)
    assert f.severity == "info" and f.first_step == 301
    assert f.evidence["spikes_by_ratio"] == 0 and f.evidence["spikes_by_score"] == 1
    assert f.evidence["largest_score_sigmas"] > 6


def test_a_diverging_loss_is_one_loss_spike_with_a_readable_title() -> None:
    """A loss that trains, then grows 1.6x a step to past 1e40 and goes NaN: one finding,
    its numbers in words, not 20 digits; the same for a spike 400 decades high."""
    steps, values, epochs = _decaying_loss(n=400)
    div = values.copy()
    div[250:] *= np.exp(0.5 * np.arange(150))
    div[380:] = np.nan
    f = _spike(steps, div, epochs)
    assert f.severity == "warning" and f.first_step <= 256
    assert "(the loss went non-finite at step 381)" in f.title
    assert f.evidence["nonfinite_loss_step"] == 381
    assert not re.search(r"\d{10,}", f.title), f.title
    # A jump from a flat loss: the trailing spread is 0, the score infinite.
    flat = np.full(200, 2.0)
    flat[150] = 1e12
    f = _spike(np.arange(1, 201), flat, np.arange(1, 201) // 40)
    assert f.evidence["spikes"] == 1
    assert "far beyond 6 sigma" in f.title and "more than a billion times" in f.title
    assert "non-finite" not in f.title and not re.search(r"\d{10,}", f.title), f.title


def test_loss_spike_scores_survive_an_earlier_huge_spike() -> None:
    """After a 1e10 spike the steps that follow are scored against their own window, not a
    running sum that lost their digits (which scored a later ordinary step at inf sigma)."""
    steps = np.arange(1, 401)
    v = 2.0 + 3.0 * np.exp(-steps / 80) + 0.02 * np.random.default_rng(0).standard_normal(400)
    v[200] = 1e10
    f = _spike(steps, v, steps // 40)
    assert f.evidence["spikes"] == 1 and f.evidence["largest_spike_step"] == 201


def test_humane_ratios_and_scores_in_titles() -> None:
    assert fmt_times(12.4) == "12x" and fmt_times(1.46, 1) == "1.5x"
    assert fmt_times(999_999) == "999999x"
    assert fmt_times(2.5e20) == "more than a trillion times"
    assert fmt_times(3e9) == "more than a billion times"
    assert fmt_times(1e6) == "more than a million times"
    assert fmt_times(math.inf) == "more than a trillion times"
    assert fmt_times(math.nan) == "an unknown number of times"
    assert fmt_sigmas(25.3, 6) == "25 sigma" and fmt_sigmas(1000, 6) == "1000 sigma"
    assert fmt_sigmas(2.5e20, 6) == "far beyond 6 sigma"
    assert fmt_sigmas(math.inf, 6.5) == "far beyond 6.5 sigma"
    assert fmt_sigmas(math.nan, 6) == "far beyond 6 sigma"


# ---------------------------------------------------------------- bad input, partial runs


def test_empty_run_has_no_findings() -> None:
    assert find_issues(run()) == []


def test_too_few_points_gives_only_an_insufficient_data_info() -> None:
    # Two epochs of a run that would be flagged everywhere with more points.
    steps = epochs_steps(2)
    r = run(*grads({"a": 1e-8, "b": 1.0}, steps=steps, dead_rate=1.0, cos_prev=-0.9),
            relu_out("a", 0, 1.0, steps=steps),
            tensor("variable", "a", 0, steps, update_ratio=10.0),
            metric_epoch("loss", steps, [2.3, 5.0]))
    found = find_issues(r)
    assert kinds(found) == {"insufficient_data": "info"}
    assert found[0].evidence["points"] == 2 and "vanishing_gradients" in found[0].explanation


def test_partial_runs_run_only_the_rules_whose_inputs_exist() -> None:
    only_loss = run(metric_epoch("loss", STEPS, [2.3] * N))
    assert kinds(find_issues(only_loss)) == {"loss_not_decreasing": "warning"}
    only_vars = run(tensor("variable", "a", 0, STEPS, update_ratio=[1e-3] * 4 + [1e-8] * 4))
    assert kinds(find_issues(only_vars)) == {"update_ratio_low": "info"}
    applicable = {r.name for r in RULES if r.applicable(__import__(
        "tb_introspect.diagnose.core", fromlist=["RunView"]).RunView(only_vars))}
    assert applicable == {"nonfinite", "update_ratio", "weight_collapse", "identical_units"}


def test_thresholds_and_rule_selection_are_parameters() -> None:
    r = run(*grads({"d1": 1e-4, "out": 1e-2}))
    assert "vanishing_gradients" in kinds(find_issues(r))
    assert kinds(find_issues(r, Thresholds(vanishing_orders=3)))["vanishing_gradients"] == "info"
    assert "vanishing_gradients" not in kinds(
        find_issues(r, Thresholds(vanishing_orders=3, vanishing_info_orders=3)))
    assert find_issues(r, rules=["loss_trend"]) == []


def test_sorting_json_and_text_report() -> None:
    nan = np.zeros(N)
    nan[6:] = 1
    r = run(*grads({"d1": 1e-6, "out": 1e-2}),
            tensor("gradient", "out", 1, STEPS, name="out/bias", shape=(4,), nan_count=nan,
                   rms=1e-2),
            metric_epoch("loss", STEPS, [2.3] * N))
    found = find_issues(r)
    assert [f.severity for f in found] == sorted((f.severity for f in found),
                                                 key=["critical", "warning", "info"].index)
    assert found[0].kind == "nonfinite"
    docs = findings_json(found)
    assert json.loads(json.dumps(docs)) == docs
    text = format_findings({"runA": found}, verbose=True)
    assert text.startswith("run runA: 1 critical, 2 warning")
    assert "CRITICAL nonfinite" in text and "vanishing_gradients" in text and "try: " in text
    assert format_findings({"runB": []}) == "run runB: no findings\n"


def test_overview_serves_the_findings() -> None:
    from tb_introspect.plugin.overview import compute_overview

    doc = compute_overview(run(*grads({"d1": 1e-6, "out": 1e-2})))
    assert [f["kind"] for f in doc["findings"]] == ["vanishing_gradients"]
    assert "findings_error" not in doc
    assert json.loads(json.dumps(doc["findings"])) == doc["findings"]


def test_rules_module_does_not_import_tensorflow() -> None:
    script = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})\n"
        "import tb_introspect.diagnose as d\n"
        "from tests.diagnose.findings_synth import run, tensor\n"
        "d.find_issues(run(tensor('gradient', 'a', 0, [1, 2, 3], rms=1.0)))\n"
        "print('TF:' + ','.join(m for m in sys.modules if m.split('.')[0] == 'tensorflow'))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.strip().splitlines()[-1] == "TF:", out


def test_a_large_run_is_diagnosed() -> None:
    # 4 views x 100 tensors x 1000 steps, a NaN from mid-run in every 7th tensor. How fast
    # is benchmarks/plugin_bench.py's concern (the Overview, findings included).
    rng = np.random.default_rng(0)
    steps = list(range(1, 1001))
    nan = np.zeros(1000)
    nan[500:] = 1
    series = []
    for view in ("variable", "gradient", "output", "output_gradient"):
        for i in range(100):
            extra = {"update_ratio": 1e-3} if view == "variable" else (
                {"cos_prev": rng.uniform(-1, 1, 1000)} if view == "gradient" else {})
            if view == "output":
                extra.update(quantile_values=np.linspace(-0.5, 0.5, 9), dead_rate=0.1,
                             zero_fraction=0.0)
            series.append(tensor(view, f"l{i}", i, steps, cadence="step",
                                 rms=rng.lognormal(-5, 0.3, 1000),
                                 nan_count=nan if i % 7 == 0 else 0, **extra))
    r = run(*series)
    found = find_issues(r)
    f = next(f for f in found if f.kind == "nonfinite")
    assert f.first_step == 501 and f.evidence["tensors_ever_nonfinite"] == 4 * 15


def test_magnitudes_past_the_float_range_give_inf_evidence_not_an_error() -> None:
    """Gradients at the largest float (whose log10 read back rounds past it), a loss spiking
    400 decades: the rules report them (inf in the evidence, null in JSON) instead of raising
    OverflowError."""
    top = np.finfo(np.float64).max
    found = find_issues(run(*grads({"a": top, "b": top}, cadence="step")))
    f = next(f for f in found if f.kind == "exploding_gradients")
    assert f.evidence["start_median_layer_rms_per_step"] >= 0.99 * top
    steps = np.arange(1, 201)
    loss = np.full(200, 1e-200)
    loss[[120, 150, 180]] = 1e200
    f = _spike(steps, loss, steps // 40)
    assert json.loads(json.dumps(findings_json([f])))
    assert "far beyond 6 sigma" in f.title and not re.search(r"\d{10,}", f.title), f.title


# ---------------------------------------------------------------- graded by what the run learned


def _falling_loss(n=N, per_epoch=10, end=0.05):
    """Per-step losses from ln 10 down to ``end`` (a run that learned its task)."""
    steps = np.arange(1, n * per_epoch + 1)
    values = np.maximum(2.3 * np.exp(-steps / (per_epoch * 1.5)), end)
    return metric("loss", steps, values, epochs=(steps - 1) // per_epoch)


def test_units_that_died_while_the_loss_came_down_are_info() -> None:
    """Half a dense layer dead from epoch 2 in a run whose loss fell to 2% of its start (a
    PyTorch CNN at Adam 3e-3, 100% training accuracy): the units left carry the task. The
    same dead share with the loss stuck at ln 10 is the warning; a whole layer dead stays
    critical."""
    dead = [0.1, 0.3, 0.55, 0.6, 0.6, 0.6, 0.6, 0.6]
    head = tensor("output", "out", 5, STEPS, name="out", shape=(-1, 10), min=-5.0, max=5.0,
                  zero_fraction=0.0)
    f = next(f for f in find_issues(run(relu_out("dense1", 1, dead), head, _falling_loss()))
             if f.kind == "dead_units")
    assert f.severity == "info" and f.evidence["loss_came_down"] is True
    stuck = metric_epoch("loss", STEPS, [2.3] * N)
    f = next(f for f in find_issues(run(relu_out("dense1", 1, dead), head, stuck))
             if f.kind == "dead_units")
    assert f.severity == "warning"
    whole = [0.1, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    f = next(f for f in find_issues(run(relu_out("dense1", 1, whole), head, _falling_loss()))
             if f.kind == "dead_units")
    assert f.severity == "critical"


def test_zero_gradients_that_grew_while_learning_are_info_and_structural_ones_a_warning(
) -> None:
    grew = [0.15, 0.3, 0.52, 0.55, 0.55, 0.55, 0.55, 0.55]
    f = next(f for f in find_issues(run(*grads({"d1": 1e-2, "d2": 1e-2}, zero_fraction=grew),
                                        _falling_loss())) if f.kind == "zero_gradients")
    assert f.severity == "info" and f.evidence["died_while_learning"] is True
    # From the first point (a slice that drops outputs, inputs dead by their init): the
    # model's structure, a warning however well the loss does.
    f = next(f for f in find_issues(run(*grads({"d1": 1e-2, "d2": 1e-2}, zero_fraction=0.87),
                                        _falling_loss())) if f.kind == "zero_gradients")
    assert f.severity == "warning" and f.evidence["died_while_learning"] is False


def test_a_lookup_tables_unused_rows_are_not_zero_gradients() -> None:
    """A stock BERT's token-type table (2 x 64) in single-segment text: its second row is
    never looked up, so half its gradient is exactly zero from the first point, by design.
    A PyTorch Linear's weight ([out, in]) of the same zero share is still judged."""
    table = tensor("gradient", "bert.embeddings.token_type_embeddings", 0, STEPS,
                   name="bert.embeddings.token_type_embeddings/weight", shape=(2, 64),
                   rms=1e-2, zero_fraction=0.5)
    table_out = tensor("output", "bert.embeddings.token_type_embeddings", 0, STEPS,
                       name="bert.embeddings.token_type_embeddings", shape=(-1, 32, 64),
                       rms=0.02)
    assert "zero_gradients" not in kinds(find_issues(run(table, table_out, _falling_loss())))
    linear = tensor("gradient", "proj", 0, STEPS, name="proj/weight", shape=(2, 64),
                    rms=1e-2, zero_fraction=0.5)
    linear_out = tensor("output", "proj", 0, STEPS, name="proj", shape=(-1, 32, 2), rms=0.02)
    assert kinds(find_issues(run(linear, linear_out, _falling_loss())))["zero_gradients"] == \
        "warning"


def test_a_loss_blown_up_in_its_first_steps_has_not_come_down() -> None:
    """A rate 100x too high: the loss jumps from ln 10 to 200 within the first 3 steps, then
    sits at ln 10 with half the layer dead. Against its first step (before any update) it
    never came down: the dead units stay a warning."""
    steps = np.arange(1, N * 10 + 1)
    values = np.full(steps.size, 2.3)
    values[1:3] = 200.0
    blown = metric("loss", steps, values, epochs=(steps - 1) // 10)
    dead = [0.1, 0.3, 0.55, 0.6, 0.6, 0.6, 0.6, 0.6]
    head = tensor("output", "out", 5, STEPS, name="out", shape=(-1, 10), min=-5.0, max=5.0,
                  zero_fraction=0.0)
    f = next(f for f in find_issues(run(relu_out("dense1", 1, dead), head, blown))
             if f.kind == "dead_units")
    assert f.severity == "warning" and f.evidence["loss_came_down"] is False
