"""The rules that combine two signals which contradict each other, on synthetic series (no
TensorFlow): a loss with a floor, piled-up gradients, a train/eval gap, progress without
learning; and the re-grading of overfitting and loss spikes. The same rules on real
trainings in both frameworks: ``test_findings_pairs.py``."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tb_introspect import loss_field
from tb_introspect.diagnose import find_issues
from tb_introspect.diagnose.classification import softmax_floor
from tests.diagnose.findings_synth import epochs_steps, kinds, metric, metric_epoch, run, tensor

FROM_LOGITS = loss_field.loss_json("classification", from_logits=True, name="CrossEntropyLoss")
SMOOTHED = loss_field.loss_json("classification", from_logits=True, label_smoothing=0.2,
                              name="CrossEntropyLoss")


def _out(n, softmax: bool):
    """The 10-wide output layer: a softmax (values in [0, 1], mean 1/10) or logits."""
    lo, hi, mean = (0.0, 1.0, 0.1) if softmax else (-6.0, 9.0, 0.4)
    return tensor("output", "classifier", 3, epochs_steps(n), name="classifier",
                  shape=(-1, 10), min=lo, max=hi, mean=mean, zero_fraction=0.0)


def _classifier(loss, acc, *, declared=FROM_LOGITS, softmax=False, val=None, vacc=None):
    n = len(loss)
    steps = epochs_steps(n)
    parts = [metric_epoch("loss", steps, loss, loss=declared), _out(n, softmax),
             metric_epoch("accuracy", steps, acc)]
    if val is not None:
        parts.append(metric("val_loss", steps, val, epochs=range(n)))
    if vacc is not None:
        parts.append(metric("val_accuracy", steps, vacc, epochs=range(n)))
    return run(*parts)


def test_the_softmax_floor_is_a_one_hot_vector_read_as_logits() -> None:
    # Cross-entropy of logits (1, 0, ..., 0) for the first class: -log(e / (e + K - 1)).
    assert softmax_floor(10) == pytest.approx(-math.log(math.e / (math.e + 9)))
    assert softmax_floor(10) == pytest.approx(1.4612, abs=1e-4)


def test_loss_floor_from_a_softmax_output_under_a_from_logits_loss() -> None:
    loss = [2.29, 2.2, 2.0, 1.85]
    acc = [0.35, 0.6, 0.65, 0.78]
    f = next(f for f in find_issues(_classifier(loss, acc, softmax=True))
             if f.kind == "loss_floor")
    assert f.severity == "warning" and f.first_epoch == 0
    assert f.evidence["signal"] == "softmax output" and f.layers == ["classifier"]
    assert f.evidence["floor_loss"] == pytest.approx(softmax_floor(10))
    # The same output under a loss on probabilities, or a loss not declared: nothing.
    probs = loss_field.loss_json("classification", from_logits=False)
    assert "loss_floor" not in kinds(find_issues(_classifier(loss, acc, softmax=True,
                                                             declared=probs)))
    assert "loss_floor" not in kinds(find_issues(_classifier(loss, acc, softmax=True,
                                                             declared="")))


def test_loss_floor_from_a_plateau_at_a_high_accuracy() -> None:
    # The softmax is inside the model's forward (its output layer logs logits): the loss
    # stalls above the floor while the accuracy is high.
    loss = [2.29, 2.2, 2.0, 1.75, 1.70, 1.68]
    acc = [0.35, 0.6, 0.7, 0.8, 0.83, 0.84]
    found = {f.kind: f for f in find_issues(_classifier(loss, acc))}
    f = found["loss_floor"]
    assert f.evidence["signal"] == "loss plateau" and f.first_epoch == 4
    # Label smoothing has its floor by design (0.87 at 0.2): its plateau is not flagged.
    smooth = [2.2, 1.9, 1.5, 1.3, 1.22, 1.17]
    assert "loss_floor" not in kinds(find_issues(_classifier(smooth, acc, declared=SMOOTHED)))
    # A healthy from-logits run at that accuracy is far below the floor.
    healthy = [2.1, 1.1, 0.6, 0.45, 0.40, 0.38]
    assert "loss_floor" not in kinds(find_issues(_classifier(healthy, acc)))


def _gradients(rms_per_step, per_epoch=10):
    n = len(rms_per_step)
    return [tensor("gradient", f"dense{d}", d, epochs_steps(n, per_epoch),
                   rms=np.asarray(rms_per_step) * per_epoch * s, shape=(64, 64))
            for d, s in ((1, 1.0), (2, 0.8), (3, 1.3))]


def test_gradient_pileup_while_the_loss_falls() -> None:
    n = 5
    loss = [2.0, 1.1, 0.6, 0.5, 0.52]
    grow = [0.11, 0.42, 0.72, 0.92, 1.06]
    # Epochs of 45 steps (the digits at batch 32, as the pile-up runs train).
    r = run(metric_epoch("loss", epochs_steps(n, 45), loss), *_gradients(grow, 45))
    f = next(f for f in find_issues(r) if f.kind == "gradient_pileup")
    assert f.severity == "warning" and f.first_epoch == 1
    assert f.evidence["growth_orders"] == pytest.approx(math.log10(1.06 / 0.11), abs=0.01)
    # The same rise over a few optimizer steps (full-batch epochs of one step each): a
    # healthy gradient's early rise, not sums that pile up over the run.
    r = run(metric_epoch("loss", epochs_steps(n, 1), loss), *_gradients(grow, 1))
    assert "gradient_pileup" not in kinds(find_issues(r))
    # Gradients that hold their scale or shrink as the loss falls: nothing.
    for g in ([0.009, 0.008, 0.009, 0.009, 0.009], [0.012, 0.004, 0.002, 0.0015, 0.001]):
        r = run(metric_epoch("loss", epochs_steps(n), loss), *_gradients(g))
        assert "gradient_pileup" not in kinds(find_issues(r))
    # Growing gradients with a rising loss are another story (exploding, loss_rising).
    r = run(metric_epoch("loss", epochs_steps(n), [2.0, 2.2, 2.5, 3.0, 4.0]), *_gradients(grow))
    assert "gradient_pileup" not in kinds(find_issues(r))


def test_train_eval_gap_from_the_first_epochs() -> None:
    loss = [1.1, 0.3, 0.16, 0.12]
    acc = [0.76, 0.95, 0.97, 0.98]
    vacc = [0.10, 0.23, 0.30, 0.29]
    val = [3.0, 2.6, 2.4, 2.3]  # still falling: the overfitting rule stays silent
    found = {f.kind: f for f in find_issues(_classifier(loss, acc, val=val, vacc=vacc))}
    f = found["train_eval_gap"]
    assert f.severity == "warning" and f.first_epoch == 0
    assert f.evidence["val_accuracy_at_end"] == pytest.approx(0.29)
    assert "overfitting" not in found
    # Dropout: training accuracy below validation. Ordinary overfitting: 0.99 vs 0.80.
    for a, v in (([0.25, 0.56, 0.71, 0.78], [0.75, 0.85, 0.89, 0.91]),
                 ([0.8, 0.95, 0.99, 0.99], [0.78, 0.82, 0.80, 0.80])):
        assert "train_eval_gap" not in kinds(find_issues(_classifier(loss, a, val=val, vacc=v)))


def test_loss_without_learning_while_the_accuracy_sits_at_chance() -> None:
    loss = [150.0, 40.0, 12.0, 5.0]
    chance = [0.1, 0.09, 0.11, 0.1]
    f = next(f for f in find_issues(_classifier(loss, chance)) if f.kind ==
             "loss_without_learning")
    assert f.severity == "warning" and f.first_epoch == 1
    assert f.evidence["loss_fall_factor"] == pytest.approx(30.0)
    # A loss that falls as the accuracy rises (cosine decay to zero, any healthy run).
    learns = [0.6, 0.89, 0.92, 0.94]
    assert "loss_without_learning" not in kinds(
        find_issues(_classifier([1.7, 0.6, 0.35, 0.3], learns)))


def test_overfitting_names_the_best_epoch_and_warns_when_training_keeps_memorising() -> None:
    n = 12
    train = [0.6, 0.2, 0.08, 0.03, 0.01, 0.004, 0.002, 0.001, 6e-4, 3e-4, 2e-4, 1e-4]
    # From far above (2.0): +32% gives back 4% of the progress, not the "climbing" warning.
    val = [2.0, 0.3, 0.25, 0.22, 0.21, 0.20, 0.21, 0.22, 0.23, 0.245, 0.255, 0.264]
    r = run(metric_epoch("loss", epochs_steps(n), train),
            metric("val_loss", epochs_steps(n), val, epochs=range(n)), _out(n, True))
    f = next(f for f in find_issues(r) if f.kind == "overfitting")
    assert f.severity == "warning" and f.evidence["pattern"] == "stop"
    assert f.evidence["best_val_epoch"] == 5 and "epoch 5" in f.title
    assert f.evidence["threshold_stop_accuracy_drop"] == 0.02
    # The same curves with a validation accuracy that holds (0.3 points down, the demo
    # CNN's): the model grew confident on a few samples, not worse: info.
    acc = metric("val_accuracy", epochs_steps(n), [0.9] * 5 + [0.981] + [0.978] * 6,
                 epochs=range(n))
    r = run(metric_epoch("loss", epochs_steps(n), train),
            metric("val_loss", epochs_steps(n), val, epochs=range(n)), _out(n, True), acc)
    assert kinds(find_issues(r))["overfitting"] == "info"
    acc = metric("val_accuracy", epochs_steps(n), [0.9] * 5 + [0.98] + [0.95] * 6,
                 epochs=range(n))
    r = run(metric_epoch("loss", epochs_steps(n), train),
            metric("val_loss", epochs_steps(n), val, epochs=range(n)), _out(n, True), acc)
    assert kinds(find_issues(r))["overfitting"] == "warning"
    # The same rise while training improves little (2x): info, as before.
    slow = [0.6, 0.4, 0.3, 0.25, 0.22, 0.2, 0.19, 0.18, 0.17, 0.16, 0.15, 0.1]
    r = run(metric_epoch("loss", epochs_steps(n), slow),
            metric("val_loss", epochs_steps(n), val, epochs=range(n)), _out(n, True))
    assert kinds(find_issues(r))["overfitting"] == "info"


def test_loss_spike_on_a_recovering_run_is_info() -> None:
    rng = np.random.default_rng(1)
    n = 480
    steps = np.arange(1, n + 1)
    epochs = (steps - 1) // 40
    values = np.exp(np.linspace(np.log(1.5), np.log(0.03), n)) * np.exp(rng.normal(0, 0.1, n))
    hard = values.copy()
    hard[[402, 415, 430]] = 0.9  # ~25x a median near 0.04, below the starting loss (1.4)
    val = np.exp(np.linspace(np.log(1.3), np.log(0.14), 12))
    r = run(metric("loss", steps, hard, epochs),
            metric("val_loss", epochs_steps(12, 40), val, epochs=range(12)))
    f = next(f for f in find_issues(r) if f.kind == "loss_spike")
    assert f.evidence["spikes"] == 3 and f.evidence["recovered"] is True
    assert f.severity == "info"
    # Read live at the end of the spikes' epoch: its median already says the run goes on.
    live = run(metric("loss", steps[:440], hard[:440], epochs[:440]),
               metric("val_loss", epochs_steps(11, 40), val[:11], epochs=range(11)))
    f = next(f for f in find_issues(live) if f.kind == "loss_spike")
    assert f.evidence["spikes"] == 3 and f.severity == "info"
    # The same spikes while the validation loss gets worse: the run is worse for them.
    worse = val.copy()
    worse[7:] = worse[5] * 1.5
    r = run(metric("loss", steps, hard, epochs),
            metric("val_loss", epochs_steps(12, 40), worse, epochs=range(12)))
    assert kinds(find_issues(r))["loss_spike"] == "warning"


def test_overfitting_grows_to_a_warning_while_the_rise_goes_on() -> None:
    """Graded by how far and how long: a third above its best and still rising is a warning
    (whatever the training loss does); the same height with the latest epoch coming back
    down stays info; a healthy run whose validation loss wobbles never gets a warning, read
    after every epoch."""
    n = 12
    slow = [0.6, 0.4, 0.3, 0.25, 0.22, 0.2, 0.19, 0.18, 0.17, 0.16, 0.15, 0.1]

    def judged(val, upto=n):
        r = run(metric_epoch("loss", epochs_steps(upto), slow[:upto]),
                metric("val_loss", epochs_steps(upto), val[:upto], epochs=range(upto)),
                _out(upto, True))
        return next((f for f in find_issues(r) if f.kind == "overfitting"), None)

    # From far above (2.0): no "climbing" give-back; +40% and rising at every epoch.
    rising = [2.0, 0.3, 0.25, 0.22, 0.21, 0.20, 0.21, 0.22, 0.24, 0.26, 0.27, 0.28]
    f = judged(rising)
    assert f.severity == "warning" and f.evidence["pattern"] == "still rising"
    assert f.evidence["epochs_since_best"] == 6 and "still rising" in f.title
    # Where it crossed a third (0.27 at epoch 10), not before: +30% at epoch 9 is info.
    assert judged(rising, 10).severity == "info"
    # As high, then down at the latest epoch: the rise stopped, info.
    turned = rising[:-1] + [0.268]  # +34%, below epoch 10's 0.27
    assert judged(turned).severity == "info"
    # A healthy run: the validation loss wobbles +-15% around a falling trend.
    trend = np.exp(np.linspace(np.log(1.0), np.log(0.3), n))
    wobble = list(trend * (1 + 0.15 * np.array([0, 1, -1, 1, -1, 1, -1, 1, -1, 1, -1, 1])))
    for upto in range(3, n + 1):
        f = judged(wobble, upto)
        assert f is None or f.severity == "info", (upto, f.title)
