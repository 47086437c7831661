"""Findings on a run logged by the real Keras callback (``Introspect``) from ``model.fit``:
the demo's dying-ReLU MLP, 8 epochs, per-epoch cadence."""

from __future__ import annotations

import json
import math
import os

import pytest

from tb_introspect.diagnose import find_issues
from tests.diagnose.findings_testlib import dead_onset, read_one

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

EPOCHS = 8


def test_dying_relu_logged_by_the_callback_is_flagged(tmp_path) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    from tb_introspect.demo.data import load_digits
    from tb_introspect.demo.models import BATCH_SIZE, get_scenario
    from tb_introspect.keras import Introspect

    data = load_digits(seed=0)
    keras.utils.set_random_seed(0)
    steps = EPOCHS * math.ceil(len(data.x_train) / BATCH_SIZE)
    model, optimizer = get_scenario("dying_relu_mlp").build(steps)
    model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    model.fit(data.x_train, data.y_train, batch_size=BATCH_SIZE, epochs=EPOCHS, verbose=0,
              callbacks=[Introspect(str(tmp_path), every="epoch", seed=0)])
    keras.backend.clear_session()

    run = read_one(str(tmp_path))
    findings = find_issues(run)
    found = {f.kind: f for f in findings}
    dead = found["dead_units"]
    assert dead.severity in ("warning", "critical") and dead.view == "output"
    assert dead.first_step == dead_onset(run, dead)
    # Dead from the first epoch (biases that start at -1): no gradient reaches the hidden
    # layers and the loss never leaves chance.
    assert dead.first_epoch == 0
    assert {"no_gradient", "zero_gradients", "loss_not_decreasing"} <= found.keys(), sorted(found)
    assert not {"nonfinite", "identical_units", "vanishing_gradients"} & found.keys()
    # What the overview serves is plain JSON.
    docs = [f.to_json() for f in findings]
    assert json.loads(json.dumps(docs)) == docs


def _fit_with_callback(logdir: str, name: str, epochs: int):
    """Scenario ``name`` of findings_archs trained by ``model.fit`` with the callback,
    ``accuracy`` compiled and validation data, as a user would."""
    import keras

    from tb_introspect.keras import Introspect
    from tests.diagnose.findings_archs import SCENARIOS

    sc = SCENARIOS[name]
    data = sc.data()
    live: list = []

    intro = Introspect(logdir, every="epoch", seed=0)

    class ReadBack(keras.callbacks.Callback):
        """After each epoch (the Introspect callback, listed first, has logged it; its
        point is written beside the next steps, so flushed here), the logdir as a live
        TensorBoard reads it."""

        def on_epoch_end(self, epoch, logs=None):
            intro.pipeline.flush()
            live.append({f.kind: f.severity for f in find_issues(read_one(logdir))})

    keras.utils.set_random_seed(0)
    model, optimizer = sc.build(epochs * math.ceil(len(data.x_train) / sc.batch_size))
    model.compile(optimizer=optimizer, loss=sc.loss(),
                  metrics=["accuracy"] if sc.accuracy else [])
    model.fit(data.x_train, data.y_train, batch_size=sc.batch_size, epochs=epochs, verbose=0,
              validation_data=(data.x_val, data.y_val),
              callbacks=[intro, ReadBack()])
    keras.backend.clear_session()
    run = read_one(logdir)
    return run, {f.kind: f for f in find_issues(run)}, live


def test_new_rules_read_what_the_callback_logs(tmp_path) -> None:
    """K from the output layer's logged shape, the accuracy from Keras's compiled metric:
    the chance level, the collapse and the rectified output are found on callback runs."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    run, found, live = _fit_with_callback(str(tmp_path / "l2"), "l2_collapse", 4)
    assert "accuracy" in run.metrics and "val_accuracy" in run.metrics
    chance = found["loss_at_chance"]
    assert chance.severity == "warning" and chance.evidence["classes"] == 10
    assert chance.evidence["classification_from"] == "accuracy metric"
    assert found["weight_collapse"].severity == "warning"
    # Read while it trained: both within 2 epochs of their onsets (epoch 0 and 1).
    assert len(live) == 4
    assert live[2].get("weight_collapse") == "warning"
    assert live[3].get("loss_at_chance") == "warning"
    run, found, live = _fit_with_callback(str(tmp_path / "relu"), "relu_output", 4)
    f = found["rectified_output"]
    assert f.severity == "warning" and f.layers == ["classifier"]
    assert "loss_at_chance" not in found and "early_instability" not in found
    assert live[1].get("rectified_output") == "warning"
