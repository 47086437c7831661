"""The custom-loop Introspector on a real GradientTape loop."""

from __future__ import annotations

import doctest

import keras
import numpy as np
import pytest
import tensorflow as tf

from tb_introspect.keras import Introspector
from tb_introspect.keras import callback as keras_callback
from tb_introspect.keras import introspector as introspector_module
from tests.keras import collect_testlib as lib

LR = 0.1


def make(seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((5,)),
        keras.layers.Dense(8, activation="relu", name="hidden"),
        keras.layers.Dense(2, name="head"),
    ], name="mlp")
    return model, keras.optimizers.SGD(LR)


def batches(n_batches=4, batch=8, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(batch, 5)).astype("float32"),
             rng.normal(size=(batch, 2)).astype("float32")) for _ in range(n_batches)]


def recorded_step(intro, model, opt, jit=False):
    """The MLP's training step, recording all four views of both layers into ``intro``."""
    hidden, head = model.layers

    @tf.function(jit_compile=jit)
    def train_step(x, y):
        with tf.GradientTape() as tape:
            h = hidden(x)
            out = head(h)
            loss = tf.reduce_mean(tf.square(out - y))
        grads, (dh, dout) = tape.gradient(loss, [model.trainable_variables, [h, out]])
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        intro.record(variables=model.trainable_variables, gradients=grads,
                     outputs={"hidden": h, "head": out},
                     output_gradients={"hidden": dh, "head": dout}, metrics={"loss": loss})
        return loss

    return train_step


@pytest.mark.parametrize("jit", [False, True])
def test_per_epoch_custom_loop(tmp_path, jit):
    model, opt = make()
    intro = Introspector(str(tmp_path), every="epoch")
    train_step = recorded_step(intro, model, opt, jit)

    data = batches()
    begin, end, losses = {}, {}, []
    for epoch in range(2):
        begin[epoch] = [np.array(v) for v in model.trainable_variables]
        for x, y in data:
            losses.append(float(train_step(x, y)))
            intro.step()
        end[epoch] = [np.array(v) for v in model.trainable_variables]
        intro.end_epoch()
    intro.close()

    run = lib.read_run(str(tmp_path))
    assert lib.tags_of(run, "output") == lib.tags_of(run, "output_gradient") == ["head", "hidden"]
    for i, v in enumerate(model.trainable_variables):
        grad = run[f"introspect/gradient/{v.path}"]
        assert grad.steps == [4, 8]
        for e, step in enumerate(grad.steps):
            g = (begin[e][i].astype(np.float64) - end[e][i]) / LR  # summed over the epoch
            np.testing.assert_allclose(grad.at(step)["l2"], np.linalg.norm(g), rtol=1e-3)
            lib.assert_stats_match(run[f"introspect/variable/{v.path}"].at(step), end[e][i],
                                   rtol=1e-6)
    out = run["introspect/output/hidden"]
    assert out.field("count").tolist() == [8 * 8] * 2  # the first of 4 steps (stats_every=8)
    assert out.data.layer == "hidden" and out.data.cadence == "epoch"
    # end_epoch writes the epoch's activity map, consistent with the epoch's statistics.
    amap = run["introspect/activity/hidden"]
    assert amap.steps == [4, 8] and amap.field("samples").tolist() == [32, 32]
    channels = [f for f in amap.data.fields if f.startswith("c")]
    np.testing.assert_allclose([np.mean([amap.at(s)[f] for f in channels]) for s in (4, 8)],
                               out.field("activation_rate"), rtol=1e-12)
    loss = run["introspect/metric/loss"]
    assert loss.steps == list(range(1, 9))
    np.testing.assert_allclose(loss.field("value"), losses, rtol=1e-6)
    assert run["introspect/metric_epoch/loss"].field("count").tolist() == [4, 4]


def test_every_n_steps_eager(tmp_path):
    model, opt = make()
    with Introspector(str(tmp_path), every=3, views=("gradient", "output")) as intro:
        for x, y in batches(6):
            with tf.GradientTape() as tape:
                h = model.layers[0](x)
                loss = tf.reduce_mean(tf.square(model.layers[1](h) - y))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            intro.record(variables=model.trainable_variables, gradients=grads,
                         outputs={"hidden": h}, metrics={"loss": loss})
            intro.step()
            if len(grads) and intro.front_end.current_step() == 3:
                want = [np.array(g) for g in grads]
    run = lib.read_run(str(tmp_path))
    assert lib.tags_of(run, "variable") == [] and lib.tags_of(run, "output_gradient") == []
    grad = run["introspect/gradient/mlp/hidden/kernel"]
    assert grad.steps == [3, 6]
    lib.assert_stats_match(grad.at(3), want[0], rtol=1e-5)
    assert run["introspect/output/hidden"].field("count").tolist() == [64, 64]


def test_record_failure_never_breaks_the_loop(tmp_path):
    model, opt = make()
    intro = Introspector(str(tmp_path), every=1)
    x, y = batches(1)[0]
    with pytest.warns(RuntimeWarning, match="record failed"):
        intro.record(variables=model.trainable_variables, gradients=[None])  # lengths differ
    intro.record(variables=model.trainable_variables, gradients=[])  # now a no-op
    intro.step()
    intro.close()


def test_docstring_examples():
    """The runnable examples in the public docstrings run and pass."""
    for module in (introspector_module, keras_callback):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0 and result.attempted > 0, module.__name__
