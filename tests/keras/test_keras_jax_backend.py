"""Keras 3 on its JAX backend: ``Introspect`` in an unmodified ``fit`` logs the four views
through the JAX engine, and they are the TensorFlow backend's numbers on the same weights
and batches.

Keras picks its backend once per process, so each training runs in a child process (once
per module for each backend), from weights and data made by numpy; the tests compare the
two runs' event files slot by slot.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.keras import collect_testlib as lib

BATCH, STEPS = 32, 4

TRAIN = textwrap.dedent(f"""
    import json, sys, warnings
    import keras, numpy as np
    from tb_introspect.keras import Introspect

    out = sys.argv[1]

    def model():
        m = keras.Sequential([
            keras.Input((8, 8, 3)),
            keras.layers.Conv2D(4, 3, activation="relu", name="conv"),
            keras.layers.Flatten(name="flat"),
            keras.layers.Dense(16, activation="relu", name="hidden"),
            keras.layers.Dense(3, name="head"),
        ])
        rng = np.random.default_rng(1)
        m.set_weights([rng.normal(0, 0.3, w.shape).astype("float32") for w in m.get_weights()])
        m.compile(keras.optimizers.SGD(0.05, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
        return m

    rng = np.random.default_rng(0)
    x = rng.normal(size=({BATCH * STEPS}, 8, 8, 3)).astype("float32")
    y = rng.integers(0, 3, {BATCH * STEPS})
    fit = dict(batch_size={BATCH}, verbose=0, shuffle=False)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        every2 = model()
        cb = Introspect(out + "/every2", every=2)
        every2.fit(x, y, epochs=2, validation_data=(x[:64], y[:64]), callbacks=[cb], **fit)
        every2.fit(x, y, epochs=1, callbacks=[cb], **fit)
        # the default cadence, its statistics steps fixed (no pacing): the lean steps too
        per_epoch = model()
        per_epoch.fit(x, y, epochs=2, callbacks=[Introspect(out + "/epoch", overhead=None,
                                                            stats_every=2)], **fit)
        plain = model()
        plain.fit(x, y, epochs=2, **fit)
        per_epoch.fit(x, y, epochs=1, **fit)  # after its callback's fit: Keras's own step
        plain.fit(x, y, epochs=1, **fit)
    json.dump({{
        "paths": [v.path for v in every2.trainable_variables],
        "variables": [len(every2.variables), len(plain.variables)],
        "same_as_plain": all(np.array_equal(a, b) for a, b in
                             zip(per_epoch.get_weights(), plain.get_weights())),
        "warnings": [str(w.message) for w in seen
                     if str(w.message).startswith("tb_introspect")]}},
        open(out + "/facts.json", "w"))
""")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    out = {b: tmp_path_factory.mktemp(f"keras_{b}") for b in ("jax", "tensorflow")}
    for backend, path in out.items():
        lib.on_backend(backend, TRAIN, path)
    return out


def test_fit_on_jax_logs_the_four_views_named_as_on_tensorflow(runs) -> None:
    facts = json.loads((runs["jax"] / "facts.json").read_text())
    assert facts["warnings"] == []
    run = lib.read_run(str(runs["jax"] / "every2"))
    assert lib.tags_of(run, "variable") == lib.tags_of(run, "gradient") == sorted(facts["paths"])
    layers = ["conv", "flat", "hidden", "head"]
    assert lib.tags_of(run, "output") == lib.tags_of(run, "output_gradient") == sorted(layers)
    depths = [run[f"introspect/output/{n}"].data.depth for n in layers]
    assert depths == sorted(depths) and len(set(depths)) == len(layers)
    # every=2 over two fits (8 steps, then 4 more, the step count carried on)
    for view in ("variable", "gradient", "output", "output_gradient"):
        for name in lib.tags_of(run, view):
            assert run[f"introspect/{view}/{name}"].steps == [2, 4, 6, 8, 10, 12], (view, name)
    assert run["introspect/metric/loss"].steps == list(range(1, 13))
    assert run["introspect/metric/val_loss"].steps == [4, 8]


def test_the_model_and_its_training_are_left_as_they_were(runs) -> None:
    """No variable added; after the callback's fit, ``fit`` runs Keras's own train step: the
    instrumented model then trains exactly as one that never had the callback."""
    facts = json.loads((runs["jax"] / "facts.json").read_text())
    assert facts["variables"][0] == facts["variables"][1]
    assert facts["same_as_plain"]


#: Slots that are functions of the tensor alone (not of a sample's draws).
EXACT = ("count", "finite_count", "nan_count", "zero_fraction", "sign_balance", "mean", "std",
         "rms", "l2", "min", "max", "activation_rate", "dead_rate", "spatial_dead_rate")


@pytest.mark.parametrize("run_dir", ["every2", "epoch"])
def test_the_numbers_are_the_tensorflow_backends(runs, run_dir) -> None:
    """The same weights and batches on both backends: every tag at every point holds the
    same exact statistics, and every step the same loss."""
    jax_run = lib.read_run(str(runs["jax"] / run_dir))
    tf_run = lib.read_run(str(runs["tensorflow"] / run_dir))
    tags = sorted(t for t in tf_run if t.split("/")[1] in (
        "variable", "gradient", "output", "output_gradient"))
    assert tags and sorted(t for t in jax_run if t in tags) == tags
    for tag in tags:
        ours, theirs = jax_run[tag], tf_run[tag]
        assert ours.steps == theirs.steps, tag
        for step in theirs.steps:
            got, want = ours.at(step), theirs.at(step)
            for key in EXACT:
                np.testing.assert_allclose(got[key], want[key], rtol=2e-4, atol=1e-6,
                                           err_msg=f"{tag} at {step}: {key}")
    if run_dir == "epoch":  # a rectifier's activity counts every step, lean ones included
        hidden = jax_run["introspect/output/hidden"].at(STEPS)
        assert hidden["activity_steps"] == hidden["steps"] == STEPS > hidden["stats_steps"]
    np.testing.assert_allclose(jax_run["introspect/metric/loss"].field("value"),
                               tf_run["introspect/metric/loss"].field("value"), rtol=1e-5)


OWN_STEP = textwrap.dedent("""
    import sys, warnings
    import keras, numpy as np
    from tb_introspect.keras import Introspect

    class Custom(keras.Model):
        def train_step(self, state, data):  # a train step of the user's own
            return super().train_step(state, data)

    inputs = keras.Input((4,))
    model = Custom(inputs, keras.layers.Dense(2)(inputs))
    model.compile("sgd", "mse")
    x, y = np.ones((16, 4), "float32"), np.zeros((16, 2), "float32")
    cb = Introspect(sys.argv[1], every=1)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        first = model.fit(x, y, epochs=2, verbose=0, callbacks=[cb])
        second = model.fit(x, y, epochs=1, verbose=0, callbacks=[cb])
    ours = [str(w.message) for w in seen if str(w.message).startswith("tb_introspect")]
    assert (len(first.history["loss"]), len(second.history["loss"])) == (2, 1)
    assert len(ours) == 1 and "train_step" in ours[0], ours
""")


def test_a_train_step_of_the_users_own_is_run_and_said_once(tmp_path) -> None:
    """The callback runs Keras's step instrumented; a model with its own ``train_step`` is
    trained by it, with one warning and nothing written."""
    lib.on_backend("jax", OWN_STEP, tmp_path / "run")
    assert not (tmp_path / "run").exists() or not list((tmp_path / "run").iterdir())


MIXED = textwrap.dedent("""
    import json, sys
    import keras, numpy as np
    from tb_introspect.keras import Introspect

    out = sys.argv[1]
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, 8)).astype("float32"), rng.integers(0, 3, 32)
    weights = None
    for policy in ("float32", "mixed_float16"):
        keras.mixed_precision.set_global_policy(policy)
        m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu",
                              name="hidden"), keras.layers.Dense(3, name="head")], name="net")
        weights = weights or [rng.normal(0, 0.5, w.shape).astype("float32")
                              for w in m.get_weights()]
        m.set_weights(weights)
        m.compile(keras.optimizers.SGD(0.1),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        m.fit(x, y, batch_size=32, epochs=1, verbose=0,
              callbacks=[Introspect(f"{out}/{policy}", every=1)])
    print(type(m.optimizer).__name__)
""")


def test_mixed_precision_logs_the_gradients_of_the_loss_not_of_the_scaled_loss(tmp_path):
    """Under ``mixed_float16`` Keras wraps the optimizer in a ``LossScaleOptimizer``, whose
    gradients are of the loss times 2**15: logged, they are the float32 run's, within
    float16's rounding."""
    r = lib.on_backend("jax", MIXED, tmp_path)
    assert r.stdout.split()[-1] == "LossScaleOptimizer"
    full, mixed = (lib.read_run(str(tmp_path / p)) for p in ("float32", "mixed_float16"))
    for view in ("gradient", "output_gradient"):
        for name in lib.tags_of(full, view):
            got = mixed[f"introspect/{view}/{name}"].at(1)
            want = full[f"introspect/{view}/{name}"].at(1)
            np.testing.assert_allclose(got["l2"], want["l2"], rtol=2e-2, err_msg=name)


DISTRIBUTED = textwrap.dedent("""
    import os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
    import keras, numpy as np
    from keras import distribution as kd
    from tb_introspect.keras import Introspect

    out = sys.argv[1]
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(128, 8)).astype("float32"), rng.integers(0, 3, 128)
    weights = None
    for mode in ("one", "data", "model"):
        mesh = kd.DeviceMesh((2, 2), ["batch", "model"], devices=kd.list_devices())
        layout = kd.LayoutMap(mesh)
        layout["net/hidden/kernel"], layout["net/hidden/bias"] = (None, "model"), ("model",)
        layout["net/head/kernel"] = ("model", None)
        kd.set_distribution({"one": None, "data": kd.DataParallel(),
                             "model": kd.ModelParallel(layout_map=layout,
                                                       batch_dim_name="batch")}[mode])
        m = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu",
                              name="hidden"), keras.layers.Dense(3, name="head")], name="net")
        weights = weights or [rng.normal(0, 0.5, w.shape).astype("float32")
                              for w in m.get_weights()]
        m.set_weights(weights)
        m.compile(keras.optimizers.SGD(0.1),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        m.fit(x, y, batch_size=32, epochs=2, verbose=0, shuffle=False,
              callbacks=[Introspect(f"{out}/{mode}", every=2)])
        print(mode, getattr(m.get_layer("hidden").kernel.value.sharding, "spec", None))
""")


def test_keras_distribution_data_and_model_parallel_equal_one_device(tmp_path) -> None:
    """Keras's own distribution API on 4 host devices: batches split over them
    (``DataParallel``), and kernels split as well (``ModelParallel``, a (batch, model) mesh):
    the exact slots of every view at every point are the one-device run's."""
    r = lib.on_backend("jax", DISTRIBUTED, tmp_path)
    assert "model P(None, 'model')" in r.stdout, r.stdout  # the kernel was split
    one = lib.read_run(str(tmp_path / "one"))
    tags = [t for t in one if t.split("/")[1] in ("variable", "gradient", "output",
                                                  "output_gradient")]
    assert len(tags) == 12  # 4 variables, their gradients, 2 outputs and theirs
    for mode in ("data", "model"):
        run = lib.read_run(str(tmp_path / mode))
        for tag in tags:
            assert run[tag].steps == one[tag].steps == [2, 4, 6, 8], (mode, tag)
            for step in one[tag].steps:
                for key in EXACT:
                    np.testing.assert_allclose(run[tag].at(step)[key], one[tag].at(step)[key],
                                               rtol=1e-4, atol=1e-6,
                                               err_msg=f"{mode} {tag} at {step}: {key}")
