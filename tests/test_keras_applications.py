"""Real architectures nobody here wrote: keras.applications, randomly initialised, a few steps."""

from __future__ import annotations

import collect_testlib as lib
import keras
import numpy as np
import pytest

from tb_introspect.keras import Introspect


@pytest.mark.slow
@pytest.mark.parametrize("name", ["MobileNetV2", "ResNet50"])
def test_application(tmp_path, name):
    keras.utils.set_random_seed(0)
    build = getattr(keras.applications, name)
    model = build(weights=None, input_shape=(32, 32, 3), classes=10)
    model.compile(keras.optimizers.SGD(0.01),
                  keras.losses.SparseCategoricalCrossentropy(), metrics=["accuracy"])
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, 8)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0,
              callbacks=[Introspect(str(tmp_path), every="epoch")])
    run = lib.read_run(str(tmp_path))
    variables = {v.path for v in model.trainable_variables}
    assert set(lib.tags_of(run, "variable")) == variables
    assert set(lib.tags_of(run, "gradient")) == variables
    layers = [layer.name for layer in model.layers
              if not isinstance(layer, keras.layers.InputLayer)]
    outputs = lib.tags_of(run, "output")
    assert sorted(outputs) == sorted(layers)
    # Every layer after the first trainable one receives a gradient.
    assert len(lib.tags_of(run, "output_gradient")) >= len(layers) - 2
    depth = {run[f"introspect/output/{n}"].data.depth: n for n in outputs}
    assert len(depth) == len(outputs)  # a strict forward order
    assert depth[min(depth)] == layers[0] and depth[max(depth)] == layers[-1]
    counted = set()
    for tag, series in run.items():
        if "/metric" in tag:
            continue
        assert series.steps == [2], tag
        v = series.at(2)
        if "/activity/" in tag:  # the epoch's per-channel and per-position rates
            rates = [x for f, x in v.items() if f[0] in "cs" and f[1:].isdigit()]
            assert rates and all(0 <= r <= 1 for r in rates), tag
            # Every sample for a rectifier's output, the statistics step's for the others.
            out = run[tag.replace("/activity/", "/output/")].at(2)
            counted.add(out["activity_steps"])
            assert v["samples"] == 4 * out["activity_steps"], tag
            continue
        assert v["count"] > 0 and v["nan_count"] == 0, tag
        assert np.isfinite(v["rms"]) and np.isfinite(v["q50"]), tag
    assert counted == {1, 2}  # sampled (other outputs) and exact (the ReLUs)
    assert len(lib.tags_of(run, "activity")) >= len(outputs) // 2
    head = run[f"introspect/output/{layers[-1]}"].at(2)
    assert head["count"] == 4 * 10 and 0 <= head["min"] <= head["max"] <= 1  # softmax
