"""A real architecture nobody here wrote: keras.applications' MobileNetV2, randomly
initialised, a few steps: the session's shared run (conftest.py, shared_runs.py), 2 epochs of 2
steps with a point every step. (ResNet50 is ``benchmarks/overhead.py``'s: its graphs take a
CPU-minute and a half to build, and it adds no kind of layer or tensor that this one lacks.)
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

from tb_introspect import metadata
from tests.keras import collect_testlib as lib
from tests.shared_runs import APP_BATCH, APP_EPOCHS, APP_EVERY, APP_SAMPLES


def check_application(run, model, steps: list[int], epoch_ends: list[int], batch: int,
                      activity_steps: set[int]) -> None:
    """The four views of every tensor of ``model``, logged at ``steps`` from steps of
    ``batch`` samples, the activity maps at ``epoch_ends``; ``activity_steps``: the steps a
    point's activity counts, over all outputs."""
    per_epoch = len(steps) // len(epoch_ends)  # logged points in an epoch
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
        if "/metric" in tag or series.data.kind in (metadata.VIEW_SUMMARY, metadata.PROBES):
            continue
        activity = "/activity/" in tag
        assert series.steps == (epoch_ends if activity else steps), tag
        v = series.at(steps[-1])
        if activity:  # the epoch's per-channel and per-position rates
            rates = [x for f, x in v.items() if f[0] in "cs" and f[1:].isdigit()]
            assert rates and all(0 <= r <= 1 for r in rates), tag
            # Every sample for a rectifier's output, the statistics step's for the others.
            out = run[tag.replace("/activity/", "/output/")].at(steps[-1])
            counted.add(out["activity_steps"])
            assert v["samples"] == batch * out["activity_steps"] * per_epoch, tag
            continue
        assert v["count"] > 0 and v["nan_count"] == 0, tag
        assert np.isfinite(v["rms"]) and np.isfinite(v["q50"]), tag
    assert counted == activity_steps
    assert len(lib.tags_of(run, "activity")) >= len(outputs) // 2
    head = run[f"introspect/output/{layers[-1]}"].at(steps[-1])
    assert head["count"] == batch * 10 and 0 <= head["min"] <= head["max"] <= 1  # softmax


def fresh(build):
    """``build`` as a fresh process names it: the run was trained in one, and Keras numbers
    auto-named layers (``global_average_pooling2d_4``) after the models built before."""
    keras.backend.clear_session()
    return build(weights=None, input_shape=(32, 32, 3), classes=10)


@pytest.mark.slow
def test_mobilenetv2(trained):
    model = fresh(keras.applications.MobileNetV2)
    per_epoch = APP_SAMPLES // APP_BATCH
    total = APP_EPOCHS * per_epoch
    check_application(lib.read_run(str(trained.app)), model,
                      list(range(APP_EVERY, total + 1, APP_EVERY)),
                      list(range(per_epoch, total + 1, per_epoch)), APP_BATCH,
                      {1})  # every=N: a point's one sampled step, for every output

