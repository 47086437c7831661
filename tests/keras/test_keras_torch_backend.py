"""Keras 3 on its PyTorch backend: ``Introspect`` in an unmodified ``fit`` logs the four views
through the PyTorch engine, named as on TensorFlow, with each step's exact loss.

Keras picks its backend once per process, so the training runs in a child process with
``KERAS_BACKEND=torch`` (once per module); it saves what a user could check by hand (every
step's gradients as backward left them, the final weights, Keras's own running loss), and
the tests compare the event files against it.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.keras import collect_testlib as lib

BATCH, STEPS, EPOCHS = 32, 4, 2

TRAIN = textwrap.dedent(f"""
    import json, sys, warnings
    import keras, numpy as np
    from tb_introspect.keras import Introspect

    out = sys.argv[1]
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((8, 8, 3)),
        keras.layers.Conv2D(4, 3, activation="relu", name="conv"),
        keras.layers.Flatten(name="flat"),
        keras.layers.Dense(16, activation="relu", name="hidden"),
        keras.layers.Dense(3, name="head"),
    ])
    model.compile(keras.optimizers.Adam(0.01),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    rng = np.random.default_rng(0)
    x = rng.normal(size=({BATCH * STEPS}, 8, 8, 3)).astype("float32")
    y = rng.integers(0, 3, {BATCH * STEPS})
    grads, running = {{}}, []

    class Record(keras.callbacks.Callback):
        # After Introspect's own on_train_batch_end: what backward left for this step.
        def on_train_batch_end(self, batch, logs=None):
            step = int(self.model.optimizer.iterations.value)
            for v in self.model.trainable_variables:
                grads[f"{{step}}:{{v.path}}"] = v.value.grad.detach().numpy().copy()

        def on_epoch_end(self, epoch, logs=None):
            running.append(float(logs["loss"]))

    cb = Introspect(out + "/run", every=2)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        model.fit(x, y, batch_size={BATCH}, epochs={EPOCHS}, verbose=0, shuffle=False,
                  validation_data=(x[:64], y[:64]), callbacks=[cb, Record()])
        model.fit(x, y, batch_size={BATCH}, epochs=1, verbose=0, shuffle=False,
                  callbacks=[cb])
    np.savez(out + "/grads.npz", **grads)
    np.savez(out + "/weights.npz", **{{v.path: v.value.detach().numpy()
                                      for v in model.trainable_variables}})
    json.dump({{"running": running,
               "paths": [v.path for v in model.trainable_variables],
               "warnings": [str(w.message) for w in seen
                            if str(w.message).startswith("tb_introspect")]}},
              open(out + "/facts.json", "w"))
""")


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("keras_torch")
    lib.on_backend("torch", TRAIN, out)
    return out


def test_the_four_views_are_named_as_on_tensorflow(trained) -> None:
    facts = json.loads((trained / "facts.json").read_text())
    assert facts["warnings"] == []
    run = lib.read_run(str(trained / "run"))
    assert lib.tags_of(run, "variable") == lib.tags_of(run, "gradient") == sorted(facts["paths"])
    layers = ["conv", "flat", "hidden", "head"]
    assert lib.tags_of(run, "output") == lib.tags_of(run, "output_gradient") == sorted(layers)
    depths = [run[f"introspect/output/{n}"].data.depth for n in layers]
    assert depths == sorted(depths) and len(set(depths)) == len(layers)
    # every=2 over two fits (8 steps, then 4 more, the step count carried on)
    points = [2, 4, 6, 8, 10, 12]
    for view in ("variable", "gradient", "output", "output_gradient"):
        for name in lib.tags_of(run, view):
            assert run[f"introspect/{view}/{name}"].steps == points, (view, name)
    assert run["introspect/metric/loss"].steps == list(range(1, 13))
    assert run["introspect/metric/val_loss"].steps == [4, 8]


def test_the_numbers_are_the_models(trained) -> None:
    run = lib.read_run(str(trained / "run"))
    grads = np.load(trained / "grads.npz")
    weights = np.load(trained / "weights.npz")
    for path, w in weights.items():
        # The last point holds the weights after the last step; a point's gradient is
        # the one backward computed at that step.
        lib.assert_stats_match(run[f"introspect/variable/{path}"].at(12), w)
        for step in (2, 8):
            lib.assert_stats_match(run[f"introspect/gradient/{path}"].at(step),
                                   grads[f"{step}:{path}"])
    head = run["introspect/output/head"].at(4)
    assert head["count"] == BATCH * 3
    assert run["introspect/activity/hidden"].steps  # a rectifier's activity map


def test_each_step_has_its_own_loss(trained) -> None:
    """Keras's logs hold the running mean; the logged loss is each step's, so its mean over
    an epoch is the running mean at the epoch's end."""
    facts = json.loads((trained / "facts.json").read_text())
    values = lib.read_run(str(trained / "run"))["introspect/metric/loss"].field("value")
    per_epoch = values[:EPOCHS * STEPS].reshape(EPOCHS, STEPS)
    np.testing.assert_allclose(per_epoch.mean(axis=1), facts["running"], rtol=1e-5)
    assert len(set(np.round(values, 6))) == len(values)  # not one running value repeated


PROBED = textwrap.dedent("""
    import json, sys
    import keras, numpy as np, torch
    from tb_introspect.keras import Introspect

    out, T, V, D, H, B = sys.argv[1], 16, 50, 32, 4, 32
    keras.utils.set_random_seed(0)
    tokens = keras.Input((T,), dtype="int32")
    h = keras.layers.Embedding(V, D, name="embed")(tokens)
    x = keras.layers.Add(name="res")([h, keras.layers.MultiHeadAttention(H, D // H,
                                                                      name="attn")(h, h)])
    model = keras.Model(tokens, keras.layers.Dense(V, name="head")(x))
    model.compile(keras.optimizers.Adam(0.01),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    idx = np.random.default_rng(0).integers(0, V, (2 * B, T + 1)).astype("int32")
    truth = []

    class Truth(keras.callbacks.Callback):
        # Before each step, from its weights and batch, by hand: the largest |q.k| / sqrt(d)
        # of the attention layer, the head's largest logit and its mean logsumexp.
        def on_train_batch_begin(self, batch, logs=None):
            xb = torch.as_tensor(idx[batch * B:(batch + 1) * B, :-1])
            self.model.eval()  # not a training pass: the tool's hooks do not read it
            with torch.no_grad():
                mha, e = self.model.get_layer("attn"), self.model.get_layer("embed")(xb)
                q, k = mha._query_dense(e), mha._key_dense(e)
                att = torch.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(D // H)
                logits = self.model(xb)
            self.model.train()
            truth.append([float(att.abs().max()), float(logits.max()),
                          float(torch.logsumexp(logits, -1).mean())])

    model.fit(idx[:, :-1], idx[:, 1:], batch_size=B, epochs=1, shuffle=False, verbose=0,
              callbacks=[Truth(), Introspect(out + "/run", every=1)])
    json.dump(truth, open(out + "/truth.json", "w"))
""")


def test_the_transformer_probes_read_keras_attention_and_head(tmp_path) -> None:
    lib.on_backend("torch", PROBED, tmp_path)
    truth = np.array(json.loads((tmp_path / "truth.json").read_text()))
    series = lib.read_run(str(tmp_path / "run"))["introspect/probes"]
    rows, cols = list(series.data.rows), {f: i for i, f in enumerate(series.data.fields)}
    assert series.steps == [1, 2] and {"attn", "head"} <= set(rows)
    for field, col in (("attn_logit_max", 0), ("logit_max", 1), ("logit_lse", 2)):
        row = "attn" if field == "attn_logit_max" else "head"
        got = [m[rows.index(row), cols[field]] for m in series.vectors]
        np.testing.assert_allclose(got, truth[:, col], rtol=1e-4, err_msg=field)


DIVERGES = textwrap.dedent("""
    import sys
    import keras, numpy as np
    from tb_introspect.keras import Introspect

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(1e4), "mse")  # diverges to Inf, then NaN
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 8)).astype("float32"), rng.normal(size=(64, 1)) * 100
    history = model.fit(x, y, batch_size=16, epochs=20, verbose=0,
                        callbacks=[Introspect(sys.argv[1], every=1, on_finding="stop")])
    print(len(history.history["loss"]), int(model.optimizer.iterations.value))
""")


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_on_finding_stop_ends_fit_its_own_way(tmp_path, backend) -> None:
    """``on_finding="stop"``: a critical finding ends ``fit`` through ``stop_training``, not an
    exception out of it; the point that showed it is written (on the JAX backend too)."""
    r = lib.on_backend(backend, DIVERGES, tmp_path)
    epochs, steps = map(int, r.stdout.split()[-2:])
    assert epochs < 20 and steps < 80, r.stdout
    assert "stopping training" in r.stderr, r.stderr[-3000:]
    assert lib.read_run(str(tmp_path))["introspect/metric/loss"].steps[-1] == steps
