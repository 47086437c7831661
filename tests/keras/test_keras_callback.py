"""The Keras callback on real training: what it writes, checked against independent computations."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from tb_introspect.keras import Introspect
from tests.keras import collect_testlib as lib

LAYERS = ["conv", "bn", "flat", "head"]
LR = 0.1


def make_cnn(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    inp = keras.Input((8, 8, 3))
    h = keras.layers.Conv2D(4, 3, activation="relu", name="conv")(inp)
    h = keras.layers.BatchNormalization(name="bn")(h)
    h = keras.layers.Flatten(name="flat")(h)
    out = keras.layers.Dense(3, name="head")(h)
    model = keras.Model(inp, out, name="cnn")
    model.compile(
        keras.optimizers.SGD(LR),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 8, 8, 3)).astype("float32"), rng.integers(0, 3, n)


class Snapshots(keras.callbacks.Callback):
    """Weights at train begin, epoch begin/end and after each batch (read-only)."""

    def __init__(self):
        super().__init__()
        self.begin, self.end, self.batch = {}, {}, {}

    def _trainable(self):
        return {v.path: np.array(v) for v in self.model.trainable_variables}

    def on_train_begin(self, logs=None):
        self.initial = self.model.get_weights()

    def on_epoch_begin(self, epoch, logs=None):
        self.begin[epoch] = self._trainable()

    def on_epoch_end(self, epoch, logs=None):
        self.end[epoch] = self._trainable()

    def on_train_batch_end(self, batch, logs=None):
        self.batch[len(self.batch) + 1] = self._trainable()


def test_per_epoch_aggregation(tmp_path):
    """Per epoch: variables at the end, gradients summed over all steps, outputs over all
    batches (stats_every=1)."""
    model = make_cnn()
    x, y = data(64)
    snaps = Snapshots()
    model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0,
              callbacks=[Introspect(str(tmp_path), every="epoch", stats_every=1), snaps])
    run = lib.read_run(str(tmp_path))
    paths = [v.path for v in model.trainable_variables]
    assert lib.tags_of(run, "variable") == sorted(paths)
    assert lib.tags_of(run, "gradient") == sorted(paths)
    assert lib.tags_of(run, "output") == sorted(LAYERS)
    assert lib.tags_of(run, "output_gradient") == sorted(LAYERS)

    depths = [run[f"introspect/output/{n}"].data.depth for n in LAYERS]
    assert depths == sorted(depths) and len(set(depths)) == 4
    conv = run["introspect/output/conv"].data
    assert (conv.layer, conv.cadence, list(conv.shape), conv.dtype) == (
        "conv", "epoch", [-1, 6, 6, 4], "float32")
    assert run["introspect/variable/conv/kernel"].data.layer == "conv"
    assert run["introspect/variable/conv/kernel"].data.depth == conv.depth

    assert paths
    for p in paths:
        var, grad = run[f"introspect/variable/{p}"], run[f"introspect/gradient/{p}"]
        assert var.steps == grad.steps == [4, 8]
        np.testing.assert_array_equal(var.field("epoch"), [0, 1])
        gs = []
        for e, step in enumerate(var.steps):
            w0, w1 = snaps.begin[e][p], snaps.end[e][p]
            lib.assert_stats_match(var.at(step), w1, rtol=1e-6)
            ratio = np.linalg.norm(w1 - w0) / np.linalg.norm(w1)
            np.testing.assert_allclose(var.at(step)["update_ratio"], ratio, rtol=1e-4)
            # Plain SGD: the sum of the epoch's gradients is (w_begin - w_end) / lr.
            g = (w0.astype(np.float64) - w1) / LR
            got = grad.at(step)
            np.testing.assert_allclose(got["l2"], np.linalg.norm(g), rtol=1e-3)
            np.testing.assert_allclose([got["min"], got["max"]], [g.min(), g.max()],
                                       atol=1e-3 * np.abs(g).max())
            gs.append(g.reshape(-1))
        assert np.isnan(grad.at(4)["cos_prev"])
        cos = gs[0] @ gs[1] / (np.linalg.norm(gs[0]) * np.linalg.norm(gs[1]))
        np.testing.assert_allclose(grad.at(8)["cos_prev"], cos, atol=2e-3)

    for name in LAYERS:
        for view in ("output", "output_gradient"):
            s = run[f"introspect/{view}/{name}"]
            assert s.steps == [4, 8]
            per_sample = int(np.prod([d for d in s.data.shape[1:]]))
            # Every batch of the epoch, not the last one: 64 samples.
            np.testing.assert_array_equal(s.field("count"), [64 * per_sample] * 2)
            assert np.all(s.field("finite_count") == s.field("count"))

    loss = run["introspect/metric/loss"]
    assert loss.steps == list(range(1, 9))
    np.testing.assert_array_equal(loss.field("epoch"), [0] * 4 + [1] * 4)
    band = run["introspect/metric_epoch/loss"]
    assert band.steps == [4, 8]
    values = loss.field("value")
    for e in range(2):
        b = band.at(band.steps[e])
        chunk = values[4 * e: 4 * e + 4]
        assert b["count"] == 4
        np.testing.assert_allclose(
            [b["min"], b["p25"], b["p50"], b["p75"], b["max"], b["mean"]],
            [*np.percentile(chunk, [0, 25, 50, 75, 100]), chunk.mean()], rtol=1e-9)

    # The step-1 loss is the loss of the initial model on the first batch.
    clone = keras.models.clone_model(model)
    clone.set_weights(snaps.initial)
    logits = clone(x[:16], training=True)
    want = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y[:16], logits)
    np.testing.assert_allclose(values[0], float(want), rtol=1e-5)
    acc = run["introspect/metric/accuracy"]
    assert acc.steps == list(range(1, 9))
    np.testing.assert_allclose(
        acc.field("value")[0], np.mean(np.argmax(logits, -1) == y[:16]), rtol=1e-6)


def test_every_step_matches_step_one(tmp_path):
    """every=1: step 1's statistics equal those of tensors recomputed from the initial weights."""
    model = make_cnn()
    x, y = data(32)
    snaps = Snapshots()
    # A sample bound above the 2304 conv outputs makes its percentiles exact.
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0,
              callbacks=[Introspect(str(tmp_path), every=1, step_sample_size=4096), snaps])
    run = lib.read_run(str(tmp_path))
    for view in ("variable", "gradient", "output", "output_gradient"):
        for name in lib.tags_of(run, view):
            s = run[f"introspect/{view}/{name}"]
            assert s.steps == [1, 2] and s.data.cadence == "step", (view, name)

    model.set_weights(snaps.initial)
    probe = keras.Model(model.inputs[0], [model.get_layer(n).output for n in LAYERS])
    with tf.GradientTape() as tape:
        outs = probe(x[:16], training=True)
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y[:16], outs[-1])
    grads, douts = tape.gradient(loss, [model.trainable_variables, outs])
    for name, out, dout in zip(LAYERS, outs, douts, strict=True):
        got = run[f"introspect/output/{name}"].at(1)
        lib.assert_stats_match(got, np.array(out), rtol=1e-5)
        lib.assert_stats_match(run[f"introspect/output_gradient/{name}"].at(1), np.array(dout),
                               rtol=1e-4, atol=1e-9)
    conv = run["introspect/output/conv"].at(1)
    q = run["introspect/output/conv"].data.quantiles
    np.testing.assert_allclose([conv[f"q{p:g}"] for p in q],
                               np.percentile(np.array(outs[0]), q), rtol=1e-5, atol=1e-7)
    for v, g in zip(model.trainable_variables, grads, strict=True):
        lib.assert_stats_match(run[f"introspect/gradient/{v.path}"].at(1), np.array(g),
                               rtol=1e-4, atol=1e-8)
        lib.assert_stats_match(run[f"introspect/variable/{v.path}"].at(1), snaps.batch[1][v.path],
                               rtol=1e-6)


def test_every_n_with_steps_per_execution(tmp_path):
    """every=3 with 2 steps per execution: points at steps 3 and 6, each one step's data."""
    model = make_cnn()
    model.compile(model.optimizer, model.loss, steps_per_execution=2)
    x, y = data(96)
    model.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0,
              callbacks=[Introspect(str(tmp_path / "a"), every=3)])
    run = lib.read_run(str(tmp_path / "a"))
    out = run["introspect/output/conv"]
    assert out.steps == [3, 6]
    np.testing.assert_array_equal(out.field("count"), [16 * 144] * 2)
    assert run["introspect/gradient/head/kernel"].steps == [3, 6]
    # Per-step loss for every step although the callback runs every 2 steps.
    assert run["introspect/metric/loss"].steps == [1, 2, 3, 4, 5, 6]

    model = make_cnn()
    model.compile(model.optimizer, model.loss, steps_per_execution=4)
    with pytest.warns(RuntimeWarning, match="steps_per_execution=4"):
        model.fit(x[:64], y[:64], batch_size=8, epochs=1, shuffle=False, verbose=0,
                  callbacks=[Introspect(str(tmp_path / "b"), every=1)])
    run = lib.read_run(str(tmp_path / "b"))
    assert run["introspect/output/conv"].steps == [4, 8]
    assert run["introspect/metric/loss"].steps == list(range(1, 9))


def test_a_url_log_dir_is_written_through_tensorflows_file_systems(tmp_path, monkeypatch):
    """A scheme only TensorFlow's file systems know (its in-memory ``ram://``) reaches the
    Keras callback's sink through ``tf.io.gfile`` (``s3://``, ``gs://``: boto3 and fsspec,
    tests/remote); nothing lands in a local folder."""
    monkeypatch.chdir(tmp_path)
    model = make_cnn()
    x, y = data(32)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0,
              callbacks=[Introspect("ram://keras-url/run", every=1)])
    run = lib.read_run("ram://keras-url/run")
    assert lib.tags_of(run, "gradient") and run["introspect/metric/loss"].steps == [1, 2]
    assert list(tmp_path.iterdir()) == []
