"""The implicit learning rate (``ilr_q<p>`` slots of the variable view) on real training."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from tb_introspect import metadata, slots
from tb_introspect.keras import Introspect
from tests.keras import collect_testlib as lib

LR = 0.05
ILR = [slots.ILR_PREFIX + slots.quantile_field(q) for q in slots.DEFAULT_QUANTILES]


def train(tmp_path, optimizer, every="epoch", epochs=2):
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(128, 6)).astype("float32")
    y = rng.normal(size=(128, 1)).astype("float32")
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh",
                              name="hidden"), keras.layers.Dense(1, name="head")])
    model.compile(optimizer, "mse")
    model.fit(x, y, batch_size=16, epochs=epochs, verbose=0, shuffle=False,
              callbacks=[Introspect(str(tmp_path), every=every)])
    return lib.read_run(str(tmp_path)), model


@pytest.mark.parametrize("every", ["epoch", 1])
def test_plain_sgd_reads_its_learning_rate(tmp_path, every):
    run, model = train(tmp_path, keras.optimizers.SGD(LR), every=every)
    for v in model.trainable_variables:
        s = run[metadata.stats_tag("variable", v.path)]
        for step in s.steps:
            point = s.at(step)
            # float32 weight differences lose digits where an update is tiny next to the
            # weight; the middle of the distribution is the learning rate to 1e-3.
            np.testing.assert_allclose(point["ilr_q50"], LR, rtol=1e-3, err_msg=v.path)
            np.testing.assert_allclose([point[f] for f in ILR[1:-1]], LR, rtol=2e-2)


def test_sampled_steps_estimate_the_window_sum(tmp_path):
    """With every=4 one step in four adds its gradient; times 4 it estimates the window's sum,
    so the rate is the learning rate up to the gradients' change within the window (without
    the factor it would read 4x off)."""
    run, model = train(tmp_path, keras.optimizers.SGD(LR), every=4)
    medians = [s.at(step)["ilr_q50"] for v in model.trainable_variables
               for s in [run[metadata.stats_tag("variable", v.path)]] for step in s.steps]
    assert len(medians) == 4 * len(model.trainable_variables)  # 16 steps, one point per 4
    assert 0.5 * LR < np.median(medians) < 2.0 * LR


def test_adam_spreads_the_per_element_rates(tmp_path):
    run, model = train(tmp_path, keras.optimizers.Adam(1e-3), epochs=3)
    kernel = run[metadata.stats_tag("variable", model.layers[0].kernel.path)]
    for step in kernel.steps:
        q = np.array([kernel.at(step)[f] for f in ILR])
        assert np.all(np.isfinite(q)) and np.all(np.diff(q) >= 0)
        # Adam divides by the gradient's running RMS: small gradients get large rates.
        assert q[-1] / q[0] > 5.0


def test_no_gradient_view_no_implicit_rate(tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="d")])
    model.compile(keras.optimizers.SGD(LR), "mse")
    x = np.ones((32, 3), np.float32)
    model.fit(x, np.zeros((32, 2), np.float32), epochs=1, verbose=0,
              callbacks=[Introspect(str(tmp_path), views=("variable",))])
    run = lib.read_run(str(tmp_path))
    point = run[metadata.stats_tag("variable", model.layers[0].kernel.path)].at(1)
    assert all(np.isnan(point[f]) for f in ILR)
    assert np.isfinite(point["update_ratio"])
