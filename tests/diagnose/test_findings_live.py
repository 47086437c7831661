"""The new findings on synthetic series, point by point as a live run grows: each rule
fires from the points so far, and drops or is downgraded when later points no longer
support it (no TensorFlow here)."""

from __future__ import annotations

import math

import numpy as np

from tb_introspect.diagnose import find_issues
from tests.diagnose.findings_synth import epochs_steps, kinds, metric, metric_epoch, run, tensor

LN10 = math.log(10)


def _softmax_out(n, depth=3, mean=0.1):
    return tensor("output", "classifier", depth, epochs_steps(n), name="classifier",
                  shape=(-1, 10), min=0.0, max=1.0, mean=mean, zero_fraction=0.0)


def _hidden(n):
    return tensor("output", "dense1", 1, epochs_steps(n), name="dense1", shape=(-1, 16),
                  min=0.0, max=3.0, zero_fraction=0.3, dead_rate=0.0, activation_rate=0.5,
                  rms=0.5)


def _weights(n, rms, ratio=0.01):
    return [tensor("variable", f"dense{d}", d, epochs_steps(n), rms=rms, update_ratio=ratio)
            for d in (1, 2, 3)]


def _prefixes(n_total, build):
    """find_issues of the run built from its first 1..n_total epochs."""
    return [find_issues(build(n)) for n in range(1, n_total + 1)]


def _curves(train, val, acc=None, vacc=None):
    n = len(train)
    steps = epochs_steps(n)
    parts = [metric_epoch("loss", steps, train), metric("val_loss", steps, val, epochs=range(n)),
             _softmax_out(n)]
    if acc is not None:
        parts += [metric_epoch("accuracy", steps, acc),
                  metric("val_accuracy", steps, vacc, epochs=range(n))]
    return run(*parts)


def test_overfitting_is_graded_while_it_grows_and_drops_when_validation_recovers() -> None:
    train = [1.0, 0.8, 0.6, 0.5, 0.4, 0.35, 0.3, 0.28, 0.26, 0.25]
    val = [1.0, 0.8, 0.6, 0.7, 0.72, 0.75, 0.8, 0.62, 0.6, 0.6]
    seen = [kinds(f).get("overfitting") for f in _prefixes(len(val), lambda n: _curves(
        train[:n], val[:n]))]
    # epoch 3: one point above +10%; 4: two (info); 6: four, +33% on the way (warning);
    # 7: back within 10% of its best: dropped.
    assert seen[:4] == [None, None, None, None]
    assert seen[4] == "info" and seen[6] == "warning"
    assert seen[7:] == [None, None, None]


def test_memorisation_is_a_warning_from_the_accuracies() -> None:
    n = 6
    train = [2.35, 2.25, 2.15, 2.0, 1.9, 1.8]
    val = [2.36, 2.38, 2.42, 2.5, 2.55, 2.6]
    acc = [0.1, 0.15, 0.22, 0.28, 0.33, 0.4]
    vacc = [0.1, 0.09, 0.11, 0.1, 0.1, 0.12]
    found = find_issues(_curves(train, val, acc, vacc))
    f = next(f for f in found if f.kind == "overfitting")
    assert f.severity == "warning" and f.evidence["pattern"] == "memorising"
    assert f.evidence["first_epoch"] == 2 and f.first_epoch == 0
    # The same curves with a validation accuracy that learns: not memorisation.
    learned = find_issues(_curves(train, val, acc, [0.1, 0.3, 0.4, 0.5, 0.5, 0.55][:n]))
    g = next((f for f in learned if f.kind == "overfitting"), None)
    assert g is None or g.evidence["pattern"] != "memorising"


def test_loss_at_chance_from_a_higher_start_then_leaving_it() -> None:
    med = [150.0, 20.0, 2.31, 2.303, 2.302, 1.5, 1.0]

    def build(n):
        return run(metric_epoch("loss", epochs_steps(n), med[:n]), _softmax_out(n),
                   metric_epoch("accuracy", epochs_steps(n), [0.1] * n))

    seen = [kinds(f).get("loss_at_chance") for f in _prefixes(len(med), build)]
    assert seen[:3] == [None, None, None]
    assert seen[3] == seen[4] == "warning"
    assert seen[5:] == [None, None]  # it learns again: dropped
    f = next(f for f in find_issues(build(5)) if f.kind == "loss_at_chance")
    assert f.first_epoch == 2 and f.evidence["classes"] == 10


def test_loss_at_chance_needs_a_classifier() -> None:
    n = 5
    med = [10.0, 3.0, LN10, LN10, LN10]
    # A linear 10-wide output without an accuracy metric: could be a regression.
    linear = tensor("output", "out", 3, epochs_steps(n), name="out", shape=(-1, 10),
                    min=-2.0, max=2.0, mean=0.3, zero_fraction=0.0)
    r = run(metric_epoch("loss", epochs_steps(n), med), linear)
    assert "loss_at_chance" not in kinds(find_issues(r))
    # With an accuracy metric it is a classifier.
    r = run(metric_epoch("loss", epochs_steps(n), med), linear,
            metric_epoch("accuracy", epochs_steps(n), [0.1] * n))
    assert kinds(find_issues(r))["loss_at_chance"] == "warning"


def test_a_loss_that_never_fell_is_not_decreasing_at_chance() -> None:
    n = 4  # epochs of 45 steps: the digits at batch 32
    r = run(metric_epoch("loss", epochs_steps(n, 45), [LN10] * n), _softmax_out(n))
    found = {f.kind: f for f in find_issues(r)}
    assert "loss_at_chance" not in found
    f = found["loss_not_decreasing"]
    assert f.evidence["at_chance_level"] is True and "ln 10" in f.title


def _per_step(epoch_values):
    steps, values, epochs = [], [], []
    for e, vs in enumerate(epoch_values):
        for v in vs:
            steps.append(len(steps) + 1)
            values.append(v)
            epochs.append(e)
    return metric("loss", steps, values, epochs=epochs)


def test_early_instability_fires_after_epoch_0_and_is_downgraded_once_it_settles() -> None:
    e0 = [2.3, 4.6, 3.4, 3.0, 2.6, 2.4, 2.35, 2.5]  # jumps 2x, mean above ln 10
    calm = [2.3, 2.9, 2.6, 2.2, 2.0, 1.8, 1.7, 1.6]  # the healthy first epoch: mean below
    f = find_issues(run(_per_step([e0]), _softmax_out(1)))
    assert kinds(f)["early_instability"] == "warning"
    assert "early_instability" not in kinds(find_issues(run(_per_step([calm]), _softmax_out(1))))
    wobbly = [e0, [1.8] * 8, [2.0] * 8]
    assert kinds(find_issues(run(_per_step(wobbly), _softmax_out(3))))["early_instability"] \
        == "warning"
    settled = [e0, [1.8] * 8, [1.2] * 8, [0.9] * 8]
    assert kinds(find_issues(run(_per_step(settled), _softmax_out(4))))["early_instability"] \
        == "info"


def test_early_instability_ignores_a_loss_that_starts_high_and_falls() -> None:
    # An L2 penalty: the first step is the highest, the loss falls from there.
    e0 = [2000.0, 1500.0, 900.0, 300.0, 50.0, 5.0, 2.4, 2.3]
    assert "early_instability" not in kinds(find_issues(run(_per_step([e0]), _softmax_out(1))))


def test_rectified_output_fires_on_two_points_not_on_a_softmax() -> None:
    def out(n, **kw):
        return tensor("output", "classifier", 3, epochs_steps(n), name="classifier",
                      shape=(-1, 10), **kw)

    acc = lambda n: metric_epoch("accuracy", epochs_steps(n), [0.5] * n)  # noqa: E731
    relu = dict(min=0.0, max=4.0, mean=0.4, zero_fraction=0.6)
    assert "rectified_output" not in kinds(find_issues(run(out(1, **relu), acc(1))))
    assert kinds(find_issues(run(out(2, **relu), acc(2))))["rectified_output"] == "warning"
    # An over-confident softmax underflows to exact zeros too; its mean is still 1/K.
    soft = dict(min=0.0, max=1.0, mean=0.1, zero_fraction=0.6)
    assert "rectified_output" not in kinds(find_issues(run(out(3, **soft), acc(3))))
    # Without any sign of a classifier (no accuracy, not a softmax): not judged.
    assert "rectified_output" not in kinds(find_issues(run(out(3, **relu))))


def test_weight_collapse_from_the_first_update_ratio_and_its_recovery() -> None:
    # First point: weights 100x below their start (update ratio ~ 100 against the start).
    rms = [0.005, 0.001, 0.0005, 0.0004]
    ratio = [100.0, 4.0, 1.0, 0.2]
    r = run(*_weights(4, rms, ratio))
    f = kinds(find_issues(r))
    assert f["weight_collapse"] == "warning"
    # Weights that stay at their scale (ratio ~ 0.01 at the first point): nothing.
    assert "weight_collapse" not in kinds(find_issues(run(*_weights(4, 0.1))))
    # Back at their scale: dropped.
    back = run(*_weights(4, [0.005, 0.001, 0.4, 0.45], ratio))
    assert "weight_collapse" not in kinds(find_issues(back))


def test_poor_initialization_at_the_first_point_and_evened_out_later() -> None:
    def outs(n, scales):
        return [tensor("output", f"dense{d}", d, epochs_steps(n), name=f"dense{d}",
                       shape=(-1, 16), min=0.0, max=1.0, zero_fraction=0.5, rms=s)
                for d, s in enumerate(scales, start=1)] + [_softmax_out(n, depth=9)]

    weights = _weights(1, 0.1)
    f = {f.kind: f for f in find_issues(run(*outs(1, [1.0, 1e-2, 1e-4]), *weights))}
    p = f["poor_initialization"]
    assert p.severity == "warning" and p.evidence["direction"] == "shrinking"
    assert p.evidence["orders_spread"] == np.float64(4.0) and p.first_epoch == 0
    assert "poor_initialization" not in kinds(find_issues(run(*outs(1, [1.0, 0.3, 0.2]),
                                                              *weights)))
    evened = [[1.0, 1.0], [1e-2, 0.5], [1e-4, 0.4]]
    r = run(*outs(2, evened), *_weights(2, 0.1))
    assert kinds(find_issues(r))["poor_initialization"] == "info"


def test_a_kernel_at_exactly_zero_has_collapsed() -> None:
    r = run(*_weights(4, [0.004, 0.0, 0.0, 0.0], [100.0, 1.0, 0.0, 0.0]))
    f = next(f for f in find_issues(r) if f.kind == "weight_collapse")
    assert f.evidence["share_collapsed"] == 1.0


def _relu(layer, depth, dead):
    return tensor("output", layer, depth, epochs_steps(len(dead)), name=layer, shape=(-1, 16),
                  min=0.0, max=3.0, zero_fraction=0.5, dead_rate=dead, activation_rate=0.4)


def test_dead_units_that_came_back_are_one_level_lower() -> None:
    head = tensor("output", "out", 5, epochs_steps(8), name="out", shape=(-1, 10), min=0.0,
                  max=1.0, mean=0.1, zero_fraction=0.0)
    dying = [0.1, 0.6, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7]
    found = {f.kind: f for f in find_issues(run(_relu("dense1", 1, dying), head))}
    assert found["dead_units"].severity == "warning"
    back = [0.1, 0.6, 0.7, 0.6, 0.4, 0.3, 0.2, 0.1]  # the article's CNN: dead early, recovered
    f = {f.kind: f for f in find_issues(run(_relu("dense1", 1, back), head))}["dead_units"]
    assert f.severity == "info" and f.evidence["recovered"] is True and "now 10%" in f.title


def test_vanishing_gradients_that_closed_are_info() -> None:
    def grads(gap):
        n = len(gap)
        return [tensor("gradient", "dense1", 0, epochs_steps(n), rms=[10.0 ** -g for g in gap]),
                tensor("gradient", "dense2", 1, epochs_steps(n), rms=1.0)]

    assert kinds(find_issues(run(*grads([3, 3, 3, 3, 3, 3]))))["vanishing_gradients"] == "warning"
    closed = find_issues(run(*grads([3, 3, 3, 2.5, 1.5, 1.2])))
    f = next(f for f in closed if f.kind == "vanishing_gradients")
    assert f.severity == "info" and f.evidence["closed_since"] is True
    assert "closed" in f.explanation


def test_a_hidden_softmax_is_not_a_poor_initialisation() -> None:
    n = 1
    probs = tensor("output", "scores", 2, epochs_steps(n), name="scores", shape=(-1, 8, 500),
                   min=0.0, max=0.9, mean=1 / 500, rms=3e-3, zero_fraction=0.0)
    dense = [tensor("output", f"dense{d}", d, epochs_steps(n), name=f"dense{d}",
                    shape=(-1, 8, 32), min=-2.0, max=2.0, mean=0.0, rms=1.0,
                    zero_fraction=0.0) for d in (1, 3)]
    r = run(probs, *dense, _softmax_out(n, depth=9), *_weights(n, 0.1))
    assert "poor_initialization" not in kinds(find_issues(r))
    # The same scale from a layer that is not a softmax is one.
    loud = tensor("output", "scores", 2, epochs_steps(n), name="scores", shape=(-1, 8, 500),
                  min=-0.1, max=0.1, mean=0.0, rms=3e-3, zero_fraction=0.0)
    r = run(loud, *dense, _softmax_out(n, depth=9), *_weights(n, 0.1))
    assert kinds(find_issues(r))["poor_initialization"] == "warning"


def test_a_hidden_layer_is_never_taken_for_the_output_layer() -> None:
    # Only a hidden ReLU layer's output was logged (the classifier, with weights, deeper).
    n = 3
    hidden = tensor("output", "dense1", 1, epochs_steps(n), name="dense1", shape=(-1, 64),
                    min=0.0, max=3.0, mean=0.5, zero_fraction=0.6)
    weights = [tensor("variable", name, d, epochs_steps(n), rms=0.1, update_ratio=0.01)
               for d, name in ((1, "dense1"), (2, "classifier"))]
    acc = metric_epoch("accuracy", epochs_steps(n), [0.5] * n)
    found = kinds(find_issues(run(hidden, *weights, acc)))
    assert "rectified_output" not in found


def test_a_pre_norm_block_is_judged_from_its_own_norm() -> None:
    """A stock pre-norm transformer at its first point (the scales of a small Llama): an
    RMSNorm (RMS 1, a gain and no kernel) feeds each block's branch, whose last projection
    is small by design (down_proj at 0.007). The norm against down_proj spans 2.15 orders,
    but within the branch (0.16 -> 0.007) the scale goes down 1.4: no finding. The same
    branch with a projection 3 orders below its input is one."""
    n = 1

    def out(name, depth, rms, mean=0.0):
        return tensor("output", name, depth, epochs_steps(n), name=name, shape=(-1, 16, 64),
                      min=-3.0, max=3.0, mean=mean, rms=rms, zero_fraction=0.0)

    def var(name, depth, shape):
        return tensor("variable", name, depth, epochs_steps(n), name=f"{name}/weight",
                      shape=shape, rms=0.02, update_ratio=0.01)

    def model(down_rms):
        layers = [("embed", 0.02, (32, 64)), ("norm1", 1.0, (64,)), ("gate", 0.16, (128, 64)),
                  ("up", 0.16, (128, 64)), ("down", down_rms, (64, 128)),
                  ("norm2", 1.0, (64,)), ("gate2", 0.16, (128, 64)), ("down2", 0.007, (64, 128))]
        series = []
        for d, (name, rms, shape) in enumerate(layers):
            series += [out(name, d, rms), var(name, d, shape)]
        head = tensor("output", "lm_head", 9, epochs_steps(n), name="lm_head",
                      shape=(-1, 16, 32), min=-1.0, max=1.0, mean=0.0, rms=0.3)
        return run(*series, head, var("lm_head", 9, (32, 64)))

    assert "poor_initialization" not in kinds(find_issues(model(0.007)))
    f = next(f for f in find_issues(model(1.6e-4)) if f.kind == "poor_initialization")
    assert f.severity == "warning" and f.evidence["normalisations"] == 2
    assert set(f.layers) == {"gate", "down"}


def test_overfitting_at_a_held_validation_accuracy_is_info() -> None:
    """A classifier trained to 100% training accuracy: its validation loss rises 60% above
    its best as it grows confident on the few samples it gets wrong, while its validation
    accuracy stays at its best (98%). Not a worse model: info. The same losses with the
    validation accuracy 6 points down from its best: the warning."""
    train = [1.0, 0.3, 0.1, 0.05, 0.02, 0.01, 0.005, 0.003]
    val = [1.0, 0.4, 0.2, 0.22, 0.25, 0.28, 0.3, 0.32]
    acc = [0.7, 0.9, 0.97, 0.99, 1.0, 1.0, 1.0, 1.0]
    held = [0.7, 0.9, 0.97, 0.98, 0.98, 0.975, 0.98, 0.98]
    f = next(f for f in find_issues(_curves(train, val, acc, held)) if f.kind == "overfitting")
    assert f.severity == "info" and f.evidence["val_accuracy_held"] is True
    fell = [0.7, 0.9, 0.97, 0.96, 0.95, 0.94, 0.92, 0.91]
    f = next(f for f in find_issues(_curves(train, val, acc, fell)) if f.kind == "overfitting")
    assert f.severity == "warning" and f.evidence["val_accuracy_held"] is False


def test_a_validation_wobble_at_a_held_accuracy_is_info() -> None:
    """AdamW at a constant rate near 100% training accuracy: the validation loss wobbles
    +40% above its best for 3 epochs (and comes back) while the validation accuracy dips 2.2
    points below its best (the corpus's GELU MLP): info. The same losses with the accuracy
    6 points down are the climbing grade's warning."""
    val = [0.34, 0.19, 0.18, 0.12, 0.11, 0.125, 0.12, 0.109, 0.135, 0.134, 0.153]
    vacc = [0.89, 0.94, 0.95, 0.967, 0.972, 0.969, 0.964, 0.964, 0.961, 0.953, 0.95]
    acc = [0.75, 0.93, 0.97, 0.97, 0.98, 0.985, 0.99, 0.99, 0.986, 0.99, 0.985]
    flat = [0.8, 0.2, 0.1, 0.08, 0.06, 0.05, 0.045, 0.037, 0.033, 0.03, 0.026]
    f = next(f for f in find_issues(_curves(flat, val, acc, vacc)) if f.kind == "overfitting")
    assert f.severity == "info"
    worse = vacc[:8] + [0.94, 0.925, 0.91]
    f = next(f for f in find_issues(_curves(flat, val, acc, worse))
             if f.kind == "overfitting")
    assert f.severity == "warning" and f.evidence["pattern"] == "climbing"
