"""What is monitored: ``layers=`` chooses the layers, rectifier outputs count activity exactly."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from tb_introspect import metadata
from tb_introspect.keras import Introspect
from tb_introspect.keras.model_parts import is_rectifier
from tests.keras import collect_testlib as lib


def test_rectifiers_are_recognised_from_the_layer_and_its_activation():
    L = keras.layers
    rectifiers = [L.ReLU(), L.ReLU(max_value=6.0), L.ReLU(threshold=0.5), L.Activation("relu"),
                  L.Activation("relu6"), L.Dense(4, activation="relu"),
                  L.Conv2D(4, 3, activation="relu"), L.LeakyReLU(negative_slope=0.0)]
    others = [L.ReLU(negative_slope=0.1), L.LeakyReLU(), L.Activation("gelu"), L.Dense(4),
              L.Dense(4, activation="sigmoid"), L.BatchNormalization(), L.Add(),
              L.MaxPooling2D(), L.Flatten(), L.Dropout(0.2), L.Softmax(), L.LayerNormalization()]
    assert all(is_rectifier(layer) for layer in rectifiers)
    assert not any(is_rectifier(layer) for layer in others)


def _model() -> keras.Model:
    inp = keras.Input((6,))
    h = keras.layers.Dense(8, activation="relu", name="a")(inp)
    h = keras.layers.Dense(8, name="b")(h)
    # A custom rectifier the callback cannot recognise: named with rectifiers=.
    h = keras.layers.Lambda(lambda t: keras.ops.maximum(t, 0.0), name="clip")(h)
    model = keras.Model(inp, keras.layers.Dense(3, name="head")(h))
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 6)).astype("float32"), rng.integers(0, 3, 64)
    out = {}
    for key, kwargs in {"chosen": {"layers": "a|head"},
                        "named": {"layers": ["b", "clip"], "rectifiers": ["clip"]},
                        "all": {}}.items():
        d = str(tmp_path_factory.mktemp(key))
        _model().fit(x, y, batch_size=8, epochs=1, verbose=0,
                     callbacks=[Introspect(d, stats_every=4, overhead=None, **kwargs)])
        out[key] = lib.read_run(d)
    return out


def test_layers_chooses_what_is_monitored_in_all_four_views(runs):
    run = runs["chosen"]
    assert lib.tags_of(run, "output") == lib.tags_of(run, "output_gradient") == ["a", "head"]
    for view in ("variable", "gradient"):
        assert {t.split("/")[0] for t in lib.tags_of(run, view)} == {"a", "head"}
    assert {t.split("/")[0] for t in lib.tags_of(runs["named"], "variable")} == {"b"}


def test_rectifiers_names_more_exact_outputs(runs):
    def activity_steps(run, name):
        return run[metadata.stats_tag("output", name)].at(8)["activity_steps"]
    assert activity_steps(runs["all"], "a") == 8  # Dense(activation="relu"): exact
    assert activity_steps(runs["all"], "clip") == 2  # not recognised: sampled (steps 0, 4)
    assert activity_steps(runs["named"], "clip") == 8
    assert activity_steps(runs["named"], "b") == 2


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"layers": "("}, "not a regular expression"),
    ({"rectifiers": []}, "non-empty list"),
    ({"overhead": 0}, "overhead must be"),
    ({"overhead": "5%"}, "overhead must be"),
])
def test_bad_options_are_clear_errors(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        Introspect(str(tmp_path), **kwargs)


def test_a_failed_fold_switches_both_output_views_off_and_training_goes_on(tmp_path, monkeypatch):
    """Both output views share the step's fold: when it fails, both are off (typed keys, not
    one string that left the output-gradient view on), with one warning naming both."""
    from tb_introspect.keras import step as collect_step

    def broken(self):
        raise RuntimeError("fold broke")

    monkeypatch.setattr(collect_step.StepRecorder, "_fold", broken)
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, 6)).astype("float32"), rng.integers(0, 3, 32)
    with pytest.warns(RuntimeWarning) as caught:
        history = _model().fit(x, y, batch_size=8, epochs=2, verbose=0,
                               callbacks=[Introspect(str(tmp_path), overhead=None)])
    assert len(history.history["loss"]) == 2
    ours = [str(w.message) for w in caught if "fold broke" in str(w.message)]
    assert len(ours) == 1 and "output view, output_gradient view" in ours[0], ours
    run = lib.read_run(str(tmp_path))
    assert not lib.tags_of(run, "output") and not lib.tags_of(run, "output_gradient")
    assert lib.tags_of(run, "gradient") and lib.tags_of(run, "variable")
