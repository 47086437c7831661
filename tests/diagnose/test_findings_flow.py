"""Gradient-flow, graded-vanishing and overfitting findings on real training runs.

Every rule is validated twice: on small trainings built to show the pathology (a
``stop_gradient``, dead inputs and unused outputs, a too-high rate that kills ReLUs, three
sigmoid layers, a big MLP on 96 samples) and on healthy trainings of other shapes (deep
with BatchNorm, dropout, GELU with AdamW), where no rule may warn. Runs are trained with
the numpy-logged custom loop of ``findings_testlib`` and read back from disk; the
expectations are checked against the logged statistics themselves.
"""

from __future__ import annotations

import numpy as np
import pytest

from tb_introspect.demo.data import Digits, load_digits
from tb_introspect.demo.models import get_scenario
from tb_introspect.diagnose import find_issues
from tests.diagnose.findings_testlib import read_one, train_logged

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _sequential(name, hidden):
    import keras
    from keras import layers

    return keras.Sequential(
        [keras.Input((8, 8, 1), name="image"), layers.Flatten(name="flatten"), *hidden,
         layers.Dense(10, activation="softmax", name="classifier")],
        name=name,
    )


def build_stop_gradient_mlp(total_steps):
    """dense1 -> stop_gradient -> dense2: no gradient ever reaches dense1."""
    import keras
    from keras import layers

    model = _sequential("stop_gradient_mlp", [
        layers.Dense(32, activation="relu", name="dense1"),
        layers.Lambda(keras.ops.stop_gradient, name="stop"),
        layers.Dense(32, activation="relu", name="dense2"),
    ])
    return model, keras.optimizers.SGD(learning_rate=0.05, momentum=0.9)


def build_starved_mlp(total_steps):
    """Half of dense1's units dead from the start (bias -20), and only 8 of dense2's 32
    outputs used (a slice): dense2's kernel gets dead inputs and zero output gradients."""
    import keras
    from keras import layers

    def half_dead(shape, dtype=None):
        return keras.ops.concatenate([keras.ops.zeros((shape[0] // 2,)),
                                      keras.ops.full((shape[0] - shape[0] // 2,), -20.0)])

    model = _sequential("starved_mlp", [
        layers.Dense(32, activation="relu", bias_initializer=half_dead, name="dense1"),
        layers.Dense(32, activation="relu", name="dense2"),
        layers.Lambda(lambda x: x[:, :8], name="slice"),
    ])
    return model, keras.optimizers.SGD(learning_rate=0.05, momentum=0.9)


def build_shallow_sigmoid_mlp(total_steps):
    """Four sigmoid layers: the first layer's gradient 10-99x below the last one's (three
    give 5-10x, eight 10^3-10^4x)."""
    import keras
    from keras import layers

    model = _sequential("shallow_sigmoid_mlp", [
        layers.Dense(32, activation="sigmoid", name=f"dense{i}") for i in (1, 2, 3, 4)])
    return model, keras.optimizers.SGD(learning_rate=0.05, momentum=0.9)


def build_overfitting_mlp(total_steps):
    """A wide MLP with Adam on 192 training samples, a third of them with a wrong label:
    it memorises them, noise included."""
    import keras
    from keras import layers

    model = _sequential("overfitting_mlp", [
        layers.Dense(256, activation="relu", name="dense1"),
        layers.Dense(256, activation="relu", name="dense2"),
    ])
    return model, keras.optimizers.Adam(learning_rate=3e-3)


def build_deep_batchnorm(total_steps):
    import keras
    from keras import layers

    hidden = []
    for i in range(1, 7):
        hidden += [layers.Dense(32, use_bias=False, name=f"dense{i}"),
                   layers.BatchNormalization(name=f"bn{i}"),
                   layers.Activation("relu", name=f"relu{i}")]
    return _sequential("deep_batchnorm", hidden), keras.optimizers.SGD(0.05, momentum=0.9)


def build_dropout_mlp(total_steps):
    import keras
    from keras import layers

    model = _sequential("dropout_mlp", [
        layers.Dense(128, activation="relu", name="dense1"), layers.Dropout(0.3, name="drop1"),
        layers.Dense(64, activation="relu", name="dense2"), layers.Dropout(0.3, name="drop2"),
    ])
    return model, keras.optimizers.Adam(learning_rate=1e-3)


def build_gelu_adamw(total_steps):
    import keras
    from keras import layers

    model = _sequential("gelu_adamw", [
        layers.Dense(64, activation="gelu", name=f"dense{i}") for i in (1, 2, 3)])
    return model, keras.optimizers.AdamW(learning_rate=1e-3, weight_decay=1e-2)


def _noisy_few_samples(n: int = 192, noise: float = 1 / 3) -> Digits:
    d = load_digits()
    y = d.y_train[:n].copy()
    rng = np.random.default_rng(0)
    wrong = rng.choice(n, int(noise * n), replace=False)
    y[wrong] = (y[wrong] + rng.integers(1, 10, wrong.size)) % 10  # always another class
    return Digits(d.x_train[:n], y, d.x_val, d.y_val)


SCENARIOS = {
    # name: (build, epochs, training data)
    "stop_gradient": (build_stop_gradient_mlp, 4, None),
    "starved": (build_starved_mlp, 4, None),
    "lr_too_high": (get_scenario("lr_too_high_cnn").build, 6, None),
    "shallow_sigmoid": (build_shallow_sigmoid_mlp, 4, None),
    "overfitting": (build_overfitting_mlp, 30, "noisy"),
    "deep_batchnorm": (build_deep_batchnorm, 6, None),
    "dropout": (build_dropout_mlp, 6, None),
    "gelu_adamw": (build_gelu_adamw, 6, None),
}
HEALTHY = ("deep_batchnorm", "dropout", "gelu_adamw")
NEW_RULES = {"no_gradient", "gradient_activity", "zero_gradients", "overfitting",
             "vanishing_gradients"}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            build, epochs, data = SCENARIOS[name]
            logdir = str(tmp_path_factory.mktemp(name))
            train_logged(logdir, build, epochs=epochs, validation=True,
                         data=_noisy_few_samples() if data == "noisy" else None)
            run = read_one(logdir)
            cache[name] = (run, find_issues(run))
        return cache[name]

    return get


def by_kind(findings):
    return {f.kind: f for f in findings}


def titles(findings):
    return [f"{f.severity} {f.title}" for f in findings]


def _field(run, view, name, field):
    s = next(s for s in run.tensors[view] if s.info.name == name or s.info.layer == name)
    return s.field(field)


def test_stop_gradient_names_the_boundary(trained) -> None:
    run, findings = trained("stop_gradient")
    f = by_kind(findings)["no_gradient"]
    assert f.severity == "warning", titles(findings)
    assert f.layers == ["dense1"]
    assert (f.evidence["boundary_below"], f.evidence["boundary_above"]) == ("dense1", "dense2")
    assert "between 'dense1' and 'dense2' (through 'stop')" in f.title
    assert f.first_epoch == 0
    assert f.evidence["cause"] == "cut between the layers" and "stop_gradient" in f.suggestion
    # The logged gradient of dense1 is exactly zero at every point; dense2's is not.
    assert np.all(_field(run, "gradient", "dense1", "rms") == 0)
    assert np.all(_field(run, "gradient", "dense2", "rms") > 0)
    # dense1 is not also reported as "mostly zero" or as a drop of its activation rate.
    assert "dense1" not in by_kind(findings).get("zero_gradients", f).layers[1:]


def test_zero_gradients_are_explained_by_dead_inputs_and_unused_outputs(trained) -> None:
    run, findings = trained("starved")
    f = by_kind(findings)["zero_gradients"]
    assert f.severity == "warning", titles(findings)
    assert f.layers[0] == "dense2" and "dense1" in f.layers
    assert f.evidence["causes"] == "dead inputs, zero output gradients"
    step = f.evidence["worst_step"]
    at = lambda view, layer, field: float(  # noqa: E731
        _field(run, view, layer, field)[list(run.tensors[view][0].steps).index(step)])
    assert f.evidence["input_dead_rate"] == pytest.approx(at("output", "dense1", "dead_rate"))
    assert f.evidence["input_dead_rate"] >= 0.5
    assert f.evidence["output_gradient_dead_rate"] == pytest.approx(0.75)
    # The kernel's zero share is what its dead rows and columns make: at least
    # 1 - (1 - dead inputs) x (1 - 0.75), at most that with its own dead units added.
    zf = f.evidence["zero_fraction_at_worst"]
    d_in, own = f.evidence["input_dead_rate"], f.evidence["own_dead_rate"]
    assert 1 - (1 - d_in) * 0.25 - 0.01 <= zf <= 1 - (1 - d_in) * max(0.0, 0.25 - own) + 0.01
    # dense1's own zero share comes from its own dead units (half of them, by their bias).
    assert f.evidence["tensors_flagged"] == 2


def test_gradient_activation_rate_drop_when_a_too_high_rate_kills_the_units(trained) -> None:
    run, findings = trained("lr_too_high")
    f = by_kind(findings)["gradient_activity"]
    assert f.severity == "warning", titles(findings)
    rate = _field(run, "gradient", f.tags[0].split("/", 2)[2], "activation_rate")
    assert f.evidence["activation_rate_start"] > 0.75
    assert f.evidence["activation_rate_min"] == pytest.approx(float(np.nanmin(rate)))
    assert f.evidence["activation_rate_min"] < 0.5


def test_graded_vanishing_is_info_between_10_and_100x(trained) -> None:
    run, findings = trained("shallow_sigmoid")
    f = by_kind(findings)["vanishing_gradients"]
    first = _field(run, "gradient", "shallow_sigmoid_mlp/dense1/kernel", "rms")
    last = _field(run, "gradient", "shallow_sigmoid_mlp/classifier/kernel", "rms")
    gap = np.log10(last / first)
    assert 1 <= gap[0] < 2, gap
    assert f.severity == "info" and f.evidence["orders_below_last"] == pytest.approx(
        gap[0], abs=1e-3)
    assert "should not be smaller" in f.explanation


def test_overfitting_names_the_epoch_where_the_curves_part(trained) -> None:
    run, findings = trained("overfitting")
    f = by_kind(findings)["overfitting"]
    assert f.severity == "warning", titles(findings)
    val = run.metrics["val_loss"].field("value")
    best = int(np.argmin(val[: f.evidence["first_flagged_epoch"] + 1]))
    assert f.first_epoch == f.evidence["parting_epoch"] == best
    assert f.evidence["val_loss_at_end"] >= 1.5 * f.evidence["val_loss_best"]
    assert f.evidence["train_loss_at_end"] < f.evidence["train_loss_at_parting"]


@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_shapes_raise_no_warning(trained, name) -> None:
    _, findings = trained(name)
    serious = [f for f in findings if f.severity in ("warning", "critical") and f.kind in NEW_RULES]
    assert serious == [], titles(findings)
