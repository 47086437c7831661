"""``window=N`` in Keras ``fit`` and in the custom TensorFlow loop: a point per window of N
steps (and at each epoch's end), aggregated as an epoch is."""

from __future__ import annotations

import numpy as np

from tb_introspect.keras import Introspect, Introspector
from tests.keras import collect_testlib as lib
from tests.keras import test_introspector as loop
from tests.keras.test_keras_callback import LR, Snapshots, data, make_cnn


def test_keras_fit_windows(tmp_path):
    """8 steps an epoch, windows of 3: points at the multiples of 3 and at the epochs'
    ends (steps 3, 6, 8, 9, 12, 15, 16); each gradient point is the sum of its window's
    gradients (plain SGD: (w_begin - w_end) / lr); outputs counted over every batch of the
    window."""
    model = make_cnn()
    x, y = data(64)
    snaps = Snapshots()
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0,
              callbacks=[snaps, Introspect(str(tmp_path), window=3, stats_every=1,
                                           overhead=None)])
    run = lib.read_run(str(tmp_path))
    ends = [3, 6, 8, 9, 12, 15, 16]
    weights = {0: snaps.begin[0], **snaps.batch}
    for v in model.trainable_variables:
        grad = run[f"introspect/gradient/{v.path}"]
        assert grad.steps == ends and grad.data.cadence == "window"
        np.testing.assert_array_equal(grad.field("epoch"), [0, 0, 0, 1, 1, 1, 1])
        for lo, hi in zip([0, *ends[:-1]], ends, strict=True):
            g = (weights[lo][v.path].astype(np.float64) - weights[hi][v.path]) / LR
            np.testing.assert_allclose(grad.at(hi)["l2"], np.linalg.norm(g), rtol=2e-3)
    conv = run["introspect/output/conv"]  # a ReLU: its activity exact
    steps = np.diff([0, *ends])
    np.testing.assert_array_equal(conv.field("steps"), steps)
    np.testing.assert_array_equal(conv.field("activity_steps"), steps)
    np.testing.assert_array_equal(conv.field("count"), steps * 8 * 6 * 6 * 4)
    assert run["introspect/activity/conv"].steps == ends
    band = run["introspect/metric_epoch/loss"]
    assert band.steps == ends
    np.testing.assert_array_equal(band.field("count"), steps)


def test_custom_loop_windows(tmp_path):
    """Two epochs of 4 steps, windows of 3: points at 3, 4, 6, 8; the window's first step
    is its statistics step; the rectifier's activity counts every step of the window."""
    model, opt = loop.make()
    intro = Introspector(str(tmp_path), window=3, rectifiers=["hidden"])
    train_step = loop.recorded_step(intro, model, opt)

    weights = [[np.array(v) for v in model.trainable_variables]]
    for _ in range(2):
        for x, y in loop.batches():
            train_step(x, y)
            weights.append([np.array(v) for v in model.trainable_variables])
            intro.step()
        intro.end_epoch()
    intro.close()
    run = lib.read_run(str(tmp_path))
    ends = [3, 4, 6, 8]
    for i, v in enumerate(model.trainable_variables):
        grad = run[f"introspect/gradient/{v.path}"]
        assert grad.steps == ends
        for lo, hi in zip([0, *ends[:-1]], ends, strict=True):
            g = (weights[lo][i].astype(np.float64) - weights[hi][i]) / loop.LR
            np.testing.assert_allclose(grad.at(hi)["l2"], np.linalg.norm(g), rtol=1e-3)
    out = run["introspect/output/hidden"]
    steps = np.diff([0, *ends])
    np.testing.assert_array_equal(out.field("steps"), steps)
    np.testing.assert_array_equal(out.field("stats_steps"), [1, 1, 1, 1])
    np.testing.assert_array_equal(out.field("activity_steps"), steps)
    assert out.data.cadence == "window"
    assert run["introspect/activity/hidden"].field("samples").tolist() == list(steps * 8)
