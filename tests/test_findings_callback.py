"""Findings on a run logged by the real Keras callback (``Introspect``) from ``model.fit``:
the demo's dying-ReLU MLP, 8 epochs, per-epoch cadence."""

from __future__ import annotations

import json
import math
import os

import pytest
from findings_testlib import dead_onset, read_one

from tb_introspect.diagnose import find_issues

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
    # The loss climbs back (0.65 -> 14.5 over the last two epochs with Keras 3.15.1): a
    # sustained rise reads as loss_rising, one as short as this as loss_spikes.
    assert {"loss_rising", "loss_spikes"} & found.keys(), sorted(found)
    assert "nonfinite" not in found
    # What the overview serves is plain JSON.
    docs = [f.to_json() for f in findings]
    assert json.loads(json.dumps(docs)) == docs
