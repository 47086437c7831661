"""The Introspect tab on a run written by the real Keras callback.

A tiny CNN trains for a few epochs with ``tb_introspect.keras.Introspect``
(every step logged, all four views), a real ``tensorboard`` serves the logdir
and headless Chromium opens the tab inside TensorBoard's page. Checks that
every chart is drawn from real training data, that the numbers on screen are
the backend's numbers, and that real layer names and shapes appear.
"""

from __future__ import annotations

import numpy as np
import pytest
from playwright.sync_api import sync_playwright

from tests.browser.browser_session import COLOURED_PIXELS_JS, Session, readout_pairs
from tests.browser.browser_support import launch_chromium, tensorboard

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def keras_logdir(tmp_path_factory):
    keras = pytest.importorskip("keras")
    from tb_introspect.keras import Introspect

    root = tmp_path_factory.mktemp("keras") / "logs"
    rng = np.random.default_rng(0)
    x = rng.normal(size=(128, 8, 8, 1)).astype("float32")
    y = (x.mean(axis=(1, 2, 3)) > 0).astype("int32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(4, 3, activation="relu", name="conv"),
        keras.layers.Flatten(name="flatten"),
        keras.layers.Dense(2, name="head"),
    ])
    model.compile(keras.optimizers.SGD(0.05),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    model.fit(x, y, batch_size=32, epochs=3, verbose=0,
              callbacks=[Introspect(str(root / "cnn"), every=1)])
    return root


def test_keras_run_in_the_tab(keras_logdir):
    with tensorboard(keras_logdir, reload=False) as tb, sync_playwright() as p:
        browser = launch_chromium(p)
        s = Session(browser, tb)
        try:
            f = s.open("p.introspect.run=cnn")
            ov = tb.get_json("overview?run=cnn")
            assert set(ov["views"]) == {"variable", "gradient", "output", "output_gradient"}
            counts = f.evaluate(COLOURED_PIXELS_JS, "section:not(#sec-transformer) .chart canvas")
            # 4 views x 3 charts, the 2 implicit-learning-rate charts, the metrics.
            assert len(counts) == 14 + len(ov["metrics"]) and min(counts) > 100, counts
            # A classifier without attention: the probes' head, ratio and kurtosis charts.
            probes = f.evaluate(COLOURED_PIXELS_JS, "#sec-transformer .chart canvas")
            assert len(probes) == 3 and min(probes) > 100, probes
            assert f.locator("#sec-transformer h2").inner_text().startswith(
                "Output logits and outliers")  # not "Transformer": it has no attention
            # Plain SGD: every layer's weights move by the learning rate times the gradient.
            ilr = readout_pairs(f.locator('.chart[data-chart="variable-ilr-bands"]'))
            assert float(ilr["median"]) == pytest.approx(0.05, rel=1e-3), ilr
            # The loss readout (last point) is the backend's last logged loss.
            loss = ov["metrics"]["loss"]
            pairs = readout_pairs(f.locator('.chart[data-chart="metric-loss"]'))
            assert pairs["@"].startswith(f"step {loss['steps'][-1]} ")
            assert float(pairs["loss"]) == pytest.approx(loss["values"][-1], rel=1e-5)
            s.shot("keras-overview")

            s.click('.tab[data-tab="layers"]')
            names = f.locator(".panel-name").all_text_contents()
            assert len(names) == len(ov["views"]["gradient"]["tensors"]) and names
            shapes = f.locator(".panel .shape").all_text_contents()
            assert "shape 3×3×1×4" in shapes, shapes  # the conv kernel, first layer first
            assert "conv" in names[0], names  # depth order: the first layer first
            assert min(f.evaluate(COLOURED_PIXELS_JS, ".panel canvas")) > 100
            s.shot("keras-layers")

            s.click('.tab[data-tab="activity"]')
            labels = f.locator(".panel .final").all_text_contents()
            assert labels and all(t.startswith("dead ") and t.endswith("%") for t in labels)
            assert min(f.evaluate(COLOURED_PIXELS_JS, ".chart canvas")) > 100
            s.shot("keras-activity")
        finally:
            s.close()
            browser.close()
