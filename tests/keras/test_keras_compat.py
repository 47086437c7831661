"""The callback keeps the user's fit() intact: settings, other callbacks, model kinds, XLA, AMP."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from tb_introspect.keras import Introspect
from tb_introspect.keras import step as collect_step
from tests.keras import collect_testlib as lib


def cnn(seed=0, dropout=True) -> keras.Model:
    keras.utils.set_random_seed(seed)
    inp = keras.Input((8, 8, 3))
    h = keras.layers.Conv2D(4, 3, activation="relu", name="conv")(inp)
    h = keras.layers.BatchNormalization(name="bn")(h)
    h = keras.layers.Flatten(name="flat")(h)
    if dropout:
        h = keras.layers.Dropout(0.3, name="drop")(h)
    return keras.Model(inp, keras.layers.Dense(3, name="head")(h), name="cnn")


def data(n=64, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 8, 8, 3)).astype("float32"), rng.integers(0, 3, n)


LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def test_training_is_unchanged_and_model_restored(tmp_path):
    """Same weights and history with and without the callback; other callbacks still work."""
    x, y = data(96)
    results = []
    for with_cb in (False, True):
        model = cnn()
        model.compile(keras.optimizers.Adam(1e-2), LOSS, metrics=["accuracy"])
        others = [
            keras.callbacks.EarlyStopping(patience=5),
            keras.callbacks.ModelCheckpoint(str(tmp_path / f"ckpt{with_cb}.keras")),
            keras.callbacks.CSVLogger(str(tmp_path / f"log{with_cb}.csv")),
        ]
        cbs = others + ([Introspect(str(tmp_path / "run"), every=2)] if with_cb else [])
        history = model.fit(x[:64], y[:64], validation_data=(x[64:], y[64:]), batch_size=16,
                            epochs=2, shuffle=False, verbose=0, callbacks=cbs)
        results.append((model, history.history))
    (plain, h_plain), (inst, h_inst) = results
    assert h_plain.keys() == h_inst.keys()
    for key in h_plain:
        np.testing.assert_allclose(h_plain[key], h_inst[key], rtol=1e-5, atol=1e-6, err_msg=key)
    for a, b in zip(plain.get_weights(), inst.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert (tmp_path / "logTrue.csv").read_text().count("\n") == 3
    # Nothing of the instrumentation is left on the model.
    assert not any("call" in layer.__dict__ for layer in inst.layers)
    assert "apply" not in inst.optimizer.__dict__ and "train_step" not in inst.__dict__
    inst.save(str(tmp_path / "after.keras"))
    again = keras.models.load_model(str(tmp_path / "after.keras"))
    np.testing.assert_allclose(again.predict(x[:4], verbose=0), inst.predict(x[:4], verbose=0),
                               rtol=1e-5)
    run = lib.read_run(str(tmp_path / "run"))
    assert run["introspect/metric/val_loss"].steps == [4, 8]
    np.testing.assert_allclose(run["introspect/metric/val_loss"].field("value"),
                               h_inst["val_loss"], rtol=1e-6)
    assert run["introspect/output/drop"].steps == [2, 4, 6, 8]


def test_repeated_fit_continues_the_series(tmp_path):
    model = cnn(dropout=False)
    model.compile(keras.optimizers.SGD(0.05), LOSS)
    x, y = data()
    cb = Introspect(str(tmp_path))
    for _ in range(3):
        model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[cb])
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)  # and once without it
    run = lib.read_run(str(tmp_path))
    assert run["introspect/gradient/conv/kernel"].steps == [4, 8, 12]
    assert run["introspect/metric/loss"].steps == list(range(1, 13))


def test_jit_compile_and_steps_per_execution(tmp_path):
    model = cnn(dropout=False)
    model.compile(keras.optimizers.SGD(0.05), LOSS, jit_compile=True, steps_per_execution=2)
    x, y = data()
    model.fit(x, y, batch_size=16, epochs=1, verbose=0,
              callbacks=[Introspect(str(tmp_path), every=2)])
    run = lib.read_run(str(tmp_path))
    for view in ("variable", "gradient", "output", "output_gradient"):
        assert lib.tags_of(run, view), view
    out = run["introspect/output_gradient/conv"]
    assert out.steps == [2, 4]
    assert np.all(out.field("count") == 16 * 144) and np.all(np.isfinite(out.field("l2")))
    assert run["introspect/metric/loss"].steps == [1, 2, 3, 4]


def test_jit_compile_keeps_a_bounded_spread_of_layer_outputs(tmp_path, monkeypatch):
    """Under XLA only ``XLA_STEP_TENSORS`` outputs/output gradients get in-step statistics
    (compiling each costs seconds and memory); the rest are off with one warning, evenly
    spread over the model, and training and the other views go on."""
    monkeypatch.setattr(collect_step, "XLA_STEP_TENSORS", 6)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,))]
                             + [keras.layers.Dense(8, activation="relu", name=f"d{i}")
                                for i in range(8)] + [keras.layers.Dense(3, name="head")])
    model.compile(keras.optimizers.SGD(0.05), LOSS, jit_compile=True)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 8)).astype("float32"), rng.integers(0, 3, 64)
    with pytest.warns(RuntimeWarning, match="statistics of 6 of 18 layer outputs") as record:
        history = model.fit(x, y, batch_size=16, epochs=2, verbose=0,
                            callbacks=[Introspect(str(tmp_path))])
    assert len([w for w in record if "jit_compile=True" in str(w.message)]) == 1
    assert np.all(np.isfinite(history.history["loss"]))
    run = lib.read_run(str(tmp_path))
    for view in ("output", "output_gradient"):
        assert lib.tags_of(run, view) == ["d0", "d4", "head"], view
        assert run[f"introspect/{view}/head"].steps == [4, 8]
    assert len(lib.tags_of(run, "gradient")) == 18


def mixed_precision_mlp() -> tuple[keras.Model, keras.KerasTensor, keras.KerasTensor]:
    """A float16 MLP with a float32 head, compiled (under the mixed_float16 policy: with a
    loss-scaled optimizer); the model, its input and its output."""
    keras.utils.set_random_seed(0)
    inp = keras.Input((16,))
    h = keras.layers.Dense(32, activation="relu", name="hidden")(inp)
    out = keras.layers.Dense(3, name="head", dtype="float32")(h)
    model = keras.Model(inp, out)
    model.compile(keras.optimizers.SGD(0.01), LOSS)
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    return model, inp, out


def test_mixed_precision_gradients_are_unscaled(tmp_path):
    """Under a loss-scaled optimizer the logged gradients are those of the real loss."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model, inp, out = mixed_precision_mlp()
        rng = np.random.default_rng(0)
        x, y = rng.normal(size=(32, 16)).astype("float32"), rng.integers(0, 3, 32)
        initial = [np.array(v) for v in model.trainable_variables]
        model.fit(x, y, batch_size=32, epochs=1, verbose=0,
                  callbacks=[Introspect(str(tmp_path), every=1)])
        for v, w in zip(model.trainable_variables, initial, strict=True):
            v.assign(w)
        probe = keras.Model(inp, [model.get_layer("hidden").output, out])
        with tf.GradientTape() as tape:
            hid, logits = probe(x, training=True)
            loss = LOSS(y, logits)
        grads, dhid = tape.gradient(loss, [model.trainable_variables, hid])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    run = lib.read_run(str(tmp_path))
    for v, g in zip(model.trainable_variables, grads, strict=True):
        got = run[f"introspect/gradient/{v.path}"].at(1)
        np.testing.assert_allclose(got["l2"], np.linalg.norm(np.array(g, np.float64)), rtol=2e-2)
    got = run["introspect/output_gradient/hidden"].at(1)
    np.testing.assert_allclose(got["l2"], np.linalg.norm(np.array(dhid, np.float64)), rtol=2e-2)
    assert run["introspect/output/hidden"].data.dtype == "float16"


@pytest.mark.parametrize("every", ["epoch", 2])
def test_an_overflowed_loss_scaled_step_is_counted_not_summed(tmp_path, every):
    """The loss-scaled optimizer skips a step whose gradients overflowed: the gradient sum
    leaves it out and the non-finite slots count its values, with either cadence (the
    PyTorch Introspector's rule too)."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model, _, _ = mixed_precision_mlp()
        rng = np.random.default_rng(0)
        x, y = rng.normal(size=(64, 16)).astype("float32"), rng.integers(0, 3, 64)
        x[16, 0] = np.inf  # the second batch's gradients overflow
        model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0,
                  callbacks=[Introspect(str(tmp_path), every=every)])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    run = lib.read_run(str(tmp_path))
    got = run["introspect/gradient/head/kernel"].at(2 if every == 2 else 4)
    bad = got["nan_count"] + got["posinf_count"] + got["neginf_count"]
    assert bad > 0 and got["finite_count"] == 32 * 3
    assert got["count"] == 32 * 3 + bad and np.isfinite(got["rms"])


class Block(keras.layers.Layer):
    """A composite layer: one monitored unit."""

    def __init__(self, units, **kw):
        super().__init__(**kw)
        self.a = keras.layers.Dense(units, activation="relu")
        self.b = keras.layers.Dense(units)

    def call(self, x):
        return self.b(self.a(x)) + x


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__(name="sub")
        self.inp = keras.layers.Dense(8, name="inp")
        self.block = Block(8, name="block")
        self.head = keras.layers.Dense(2, name="head")

    def call(self, x, training=False):
        return self.head(self.block(self.inp(x)))


class CustomStep(keras.Model):
    """A user train_step that calls the optimizer itself."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(self(x, training=True) - y))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(grads, self.trainable_variables)
        self.tracker.update_state(loss)
        return {"loss": self.tracker.result()}

    @property
    def metrics(self):
        return [self.tracker]


@pytest.mark.parametrize("kind", ["nested", "subclassed", "custom_step"])
def test_model_kinds(tmp_path, kind):
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, 6)).astype("float32"), rng.normal(size=(32, 2)).astype("float32")
    if kind == "nested":
        inner = keras.Sequential([keras.layers.Dense(8, activation="relu", name="i1"),
                                  keras.layers.Dense(8, name="i2")], name="inner")
        inp = keras.Input((6,))
        model = keras.Model(inp, keras.layers.Dense(2, name="head")(
            inner(keras.layers.Dense(8, name="stem")(inp))))
        expected = ["stem", "inner/i1", "inner/i2", "head"]
    elif kind == "subclassed":
        model = Subclassed()
        expected = ["inp", "block", "head"]
    else:
        inp = keras.Input((6,))
        model = CustomStep(inp, keras.layers.Dense(2, name="head")(
            keras.layers.Dense(8, name="stem")(inp)))
        model.tracker = keras.metrics.Mean(name="loss")
        expected = ["stem", "head"]
    model.compile(keras.optimizers.SGD(0.05), "mse")
    model.fit(x, y, batch_size=8, epochs=1, verbose=0,
              callbacks=[Introspect(str(tmp_path), every=2)])
    run = lib.read_run(str(tmp_path))
    assert sorted(lib.tags_of(run, "output")) == sorted(expected)
    depths = [run[f"introspect/output/{n}"].data.depth for n in expected]
    assert depths == sorted(depths) and len(set(depths)) == len(expected)
    assert sorted(lib.tags_of(run, "gradient")) == sorted(v.path for v in model.trainable_variables)
    assert lib.tags_of(run, "output_gradient")
    for tag in run:
        if "/activity/" in tag:  # activity maps are per epoch, whatever the cadence
            assert run[tag].steps == [4], tag
        elif "/metric" not in tag:
            assert run[tag].steps == [2, 4], tag
    assert run["introspect/metric/loss"].steps == [1, 2, 3, 4]


def test_another_keras_backend_trains_with_one_warning_and_checks_the_options(tmp_path):
    """On a backend it cannot log on (NumPy), the callback says so once and every fit
    trains; a bad option is still an error at construction. Its hooks are the backend's
    Keras callback hooks, run here by TensorFlow's fit."""
    import warnings

    from tb_introspect.keras import other_backends

    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                          keras.layers.Dense(2)])
    m.compile("sgd", "mse")
    x, y = np.ones((16, 4), "float32"), np.zeros((16, 2), "float32")
    cb = other_backends.Introspect(str(tmp_path), every=1)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        first = m.fit(x, y, epochs=2, verbose=0, callbacks=[cb])
        second = m.fit(x, y, epochs=1, verbose=0, callbacks=[cb])
    ours = [str(w.message) for w in seen if str(w.message).startswith("tb_introspect")]
    assert (len(first.history["loss"]), len(second.history["loss"])) == (2, 1)
    assert len(ours) == 1 and "KERAS_BACKEND" in ours[0], ours
    assert not list(tmp_path.iterdir())  # nothing written
    with pytest.raises(ValueError, match="weights"):
        other_backends.Introspect(str(tmp_path), views=["weights"])
