"""Bad input for the Keras callback: each case is handled, training goes on, nothing is lost."""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from tb_introspect.keras import Introspect
from tests.keras import collect_testlib as lib


def compile_(model: keras.Model, loss="mse") -> keras.Model:
    model.compile(keras.optimizers.SGD(0.05), loss)
    return model


def xy(n=32, d=6, out=2, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)).astype("float32"), rng.normal(size=(n, out)).astype("float32")


def test_unwritable_log_dir_fails_before_training(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.raises(OSError, match="not writable"):
        Introspect(str(blocker / "run"))


def test_bad_arguments_fail_at_construction(tmp_path):
    with pytest.raises(ValueError, match="unknown view"):
        Introspect(str(tmp_path), views=("weights",))
    with pytest.raises(ValueError, match="every"):
        Introspect(str(tmp_path), every=0)
    with pytest.raises(ValueError, match="sample_size"):
        Introspect(str(tmp_path), sample_size=0)


def test_no_trainable_variables(tmp_path):
    keras.utils.set_random_seed(0)
    inp = keras.Input((6,))
    out = keras.layers.Dense(2, name="frozen", trainable=False)(
        keras.layers.Dense(4, activation="relu", name="frozen0", trainable=False)(inp))
    model = compile_(keras.Model(inp, out))
    x, y = xy()
    with pytest.warns(RuntimeWarning, match="no trainable variables"):
        history = model.fit(x, y, batch_size=8, epochs=2, verbose=0,
                            callbacks=[Introspect(str(tmp_path))])
    assert len(history.history["loss"]) == 2
    run = lib.read_run(str(tmp_path))
    assert lib.tags_of(run, "variable") == lib.tags_of(run, "gradient") == []
    assert lib.tags_of(run, "output") == ["frozen", "frozen0"]
    assert lib.tags_of(run, "output_gradient") == []
    # 8 samples x 2 units: the epoch's first step, its only statistics step (stats_every=8)
    assert run["introspect/output/frozen"].field("count").tolist() == [16.0, 16.0]
    assert run["introspect/metric/loss"].steps == list(range(1, 9))


class Split(keras.layers.Layer):
    """Returns a tuple."""

    def call(self, x):
        return x[:, :3], x[:, 3:]


class Named(keras.layers.Layer):
    """Returns a dict."""

    def call(self, x):
        return {"pos": tf.nn.relu(x), "neg": tf.nn.relu(-x)}


class Sign(keras.layers.Layer):
    """Returns an int32 tensor (no gradient flows through it)."""

    def call(self, x):
        return tf.cast(x > 0, tf.int32)


class Text(keras.layers.Layer):
    """Returns a string tensor next to its input: statistics cannot be taken of it."""

    def call(self, x):
        return x, tf.strings.as_string(x[:, :1])


def test_tuple_dict_int_and_string_outputs(tmp_path):
    keras.utils.set_random_seed(0)
    inp = keras.Input((6,))
    h = keras.layers.Dense(6, name="d0")(inp)
    a, b = Split(name="split")(h)
    parts = Named(name="named")(keras.layers.Concatenate(name="cat")([a, b]))
    h = keras.layers.Add(name="add")([parts["pos"], parts["neg"]])
    sign = Sign(name="sign")(h)
    h, _ = Text(name="text")(h)
    h = keras.layers.Concatenate(name="cat2")([h, keras.layers.Lambda(
        lambda t: tf.cast(t, tf.float32), name="as_float")(sign)])
    out = keras.layers.Dense(2, name="head")(h)
    model = compile_(keras.Model(inp, out))
    x, y = xy()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(x, y, batch_size=8, epochs=2, verbose=0,
                            callbacks=[Introspect(str(tmp_path), every=2)])
    assert len(history.history["loss"]) == 2
    messages = [str(w.message) for w in caught if "tb_introspect" in str(w.message)]
    # The string output is switched off with one warning naming it; nothing else fails.
    assert len([m for m in messages if "text/1" in m]) == 1, messages
    run = lib.read_run(str(tmp_path))
    outputs = lib.tags_of(run, "output")
    for name in ("split/0", "split/1", "named/neg", "named/pos", "sign", "text/0", "head"):
        assert name in outputs, (name, outputs)
    assert "text/1" not in outputs
    grads = lib.tags_of(run, "output_gradient")
    assert "split/0" in grads and "named/pos" in grads
    assert "sign" not in grads  # an int output has no gradient
    sign = run["introspect/output/sign"]
    assert sign.data.dtype == "int32"
    v = sign.at(sign.steps[0])
    assert v["min"] >= 0 and v["max"] <= 1 and v["count"] == 8 * 6
    assert run["introspect/output/split/0"].data.shape[1:] == [3]


def test_nan_mid_training_is_counted_and_training_goes_on(tmp_path):
    keras.utils.set_random_seed(0)
    inp = keras.Input((6,))
    out = keras.layers.Dense(2, name="head")(keras.layers.Dense(4, name="hidden")(inp))
    model = compile_(keras.Model(inp, out))
    x, y = xy(64)
    x[24:32] = np.nan  # the 4th batch of 8
    history = model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0,
                        callbacks=[Introspect(str(tmp_path), every=1)])
    assert len(history.history["loss"]) == 2
    run = lib.read_run(str(tmp_path))
    out = run["introspect/output/hidden"]
    nan = out.field("nan_count")
    assert out.steps == list(range(1, 17))
    assert nan[:3].tolist() == [0, 0, 0] and nan[3] == 8 * 4  # the NaN batch, counted
    assert np.all(nan[4:] == 8 * 4)  # NaN weights from then on
    grad = run["introspect/gradient/hidden/kernel"]
    assert grad.field("nan_count")[3] == 24 and grad.field("nan_count")[2] == 0
    var = run["introspect/variable/hidden/kernel"]
    assert var.field("nan_count")[2] == 0 and var.field("nan_count")[3] == 24
    loss = run["introspect/metric/loss"]
    assert np.isfinite(loss.field("value")[:3]).all() and np.isnan(loss.field("value")[3])
    band = run["introspect/metric_epoch/loss"]
    assert band.field("count").tolist() == [3, 0]  # finite per-step values only


def test_dataset_of_unknown_length(tmp_path):
    keras.utils.set_random_seed(0)
    model = compile_(keras.Sequential([keras.Input((6,)), keras.layers.Dense(2, name="head")]))
    x, y = xy(40)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda a, b: True).batch(8)
    assert ds.cardinality() == tf.data.UNKNOWN_CARDINALITY
    live = []
    # stats_every=1: every step's values are counted, so an empty last step would show
    intro = Introspect(str(tmp_path), stats_every=1)

    class Reader(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 1:  # epoch 0 is readable while training runs, once written
                intro.pipeline.flush()
                live.append(lib.read_run(str(tmp_path)))

    model.fit(ds, epochs=2, verbose=0, callbacks=[intro, Reader()])
    assert live and live[0]["introspect/output/head"].steps == [5]
    run = lib.read_run(str(tmp_path))
    out = run["introspect/output/head"]
    assert out.steps == [5, 10]
    assert out.field("count").tolist() == [80.0, 80.0]  # all 40 samples x 2 units
    assert run["introspect/metric/loss"].steps == list(range(1, 11))


def test_keyboard_interrupt_keeps_what_was_logged(tmp_path):
    keras.utils.set_random_seed(0)
    model = compile_(keras.Sequential([keras.Input((6,)), keras.layers.Dense(2, name="head")]))
    x, y = xy(64)

    class Interrupt(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                raise KeyboardInterrupt

    cb = Introspect(str(tmp_path), every=1, flush_secs=0)
    with pytest.raises(KeyboardInterrupt):
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[cb, Interrupt()])
    # Read while the callback (and its writer) is still alive: nothing was closed. The
    # clock's flush (flush_secs=0) is a job of the worker: on disk once it has run.
    assert cb.pipeline.worker.wait(20)
    run = lib.read_run(str(tmp_path))
    assert run["introspect/output/head"].steps == [1, 2, 3]
    assert run["introspect/metric/loss"].steps == [1, 2, 3]
    # The model is usable again, with or without the callback.
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
