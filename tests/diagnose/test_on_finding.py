"""``on_finding``: the diagnose rules judged while a real training runs, acting on what they
find. Trainings diverge for real (a learning rate far too high, scikit-learn digits, a tiny
MLP); a healthy twin's callable is never called; what the rules judged during training is
what ``tb-introspect diagnose`` reads from the run's files."""

from __future__ import annotations

import logging
import os
import warnings

import numpy as np
import pytest

from tb_introspect.diagnose import find_issues
from tb_introspect.diagnose.core import SEVERITY_RANK
from tb_introspect.pipeline.findings import FindingStop
from tb_introspect.pipeline.options import Options, check_on_finding, check_severity
from tb_introspect.read import read_logdir

BATCH = 64
ACTS = ("critical", "warning")  # what the default on_finding_severity="warning" acts on
#: Diverging Keras fits trace no layer-output probes (faster); the healthy twins log all.
LEAN = ("variable", "gradient")


def _digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.data / 16).astype("float32"), d.target.astype("int64")


def _files(logdir: str):
    return read_logdir(logdir)["."]


def _judged(recorded: list) -> None:
    """Each rule once, every one at or above the default severity."""
    kinds = [f.kind for f in recorded]
    assert len(kinds) == len(set(kinds)), kinds
    assert all(f.severity in ACTS for f in recorded), [(f.kind, f.severity) for f in recorded]


# ---------------------------------------------------------------- the option


def test_the_option_is_validated_once_for_every_front_end() -> None:
    assert check_on_finding("stop") == "stop" and check_on_finding(None) is None
    assert check_on_finding(print) is print
    with pytest.raises(ValueError, match="on_finding must be None, 'stop' or a callable"):
        Options.of(("variable",), "epoch", {"on_finding": "halt"})
    with pytest.raises(ValueError, match="on_finding_severity must be one of critical"):
        Options.of(("variable",), "epoch", {"on_finding": "stop",
                                            "on_finding_severity": "error"})
    assert check_severity("info") == "info"
    o = Options.of(("variable",), "epoch", {"on_finding": "stop"})
    assert o.on_finding == "stop" and o.on_finding_severity == "warning"


# ---------------------------------------------------------------- PyTorch


def _torch_fit(logdir: str, lr: float, epochs: int, every="epoch", **options):
    """SGD at ``lr`` on digits, a 64-32-10 ReLU MLP; the epochs run (a FindingStop escapes)."""
    import torch
    from torch import nn

    from tb_introspect.torch import Introspector

    x, y = (torch.from_numpy(a) for a in _digits())
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    intro = Introspector(logdir, model, opt, every=every, **options)
    done = 0
    try:
        for _ in range(epochs):
            for i in range(0, len(x), BATCH):
                loss = nn.functional.cross_entropy(model(x[i:i + BATCH]), y[i:i + BATCH])
                opt.zero_grad()
                loss.backward()
                opt.step()
                intro.step(loss=loss)
            with torch.no_grad():
                val = nn.functional.cross_entropy(model(x), y)
            intro.end_epoch(val_loss=val)
            done += 1
    finally:
        intro.close()
    return intro, done


def test_torch_stop_raises_after_the_point_is_written(tmp_path, caplog) -> None:
    logdir = str(tmp_path)
    with caplog.at_level(logging.WARNING, "tb_introspect"), \
            pytest.raises(FindingStop) as stopped:
        _torch_fit(logdir, lr=30.0, epochs=20, on_finding="stop")
    stop = stopped.value
    f = stop.finding
    assert f.severity in ACTS
    # The message names the finding: rule, severity, title.
    for text in (str(stop), caplog.text):
        assert f.kind in text and f.severity in text and f.title in text
    # It stopped early, after the point that showed it, which is in the run's files.
    steps_per_epoch = -(-1797 // BATCH)
    assert stop.step < 20 * steps_per_epoch
    run = _files(logdir)
    points = np.concatenate([s.steps for s in run.tensors["variable"]])
    assert f.first_step is not None and f.first_step <= points.max() <= stop.step
    assert f.kind in {g.kind for g in find_issues(run)}


def test_torch_callable_records_each_finding_once_and_a_healthy_run_calls_nothing(
        tmp_path) -> None:
    seen: list = []
    _, done = _torch_fit(str(tmp_path / "diverging"), lr=30.0, epochs=3, on_finding=seen.append)
    assert done == 3  # a callable does not stop training
    assert seen, "no finding on a diverging run"
    _judged(seen)
    healthy: list = []
    _, done = _torch_fit(str(tmp_path / "healthy"), lr=0.1, epochs=5, on_finding=healthy.append)
    assert done == 5 and healthy == []


def test_a_failing_callable_warns_once_and_training_goes_on(tmp_path) -> None:
    calls: list = []

    def broken(finding):
        calls.append(finding)
        raise KeyError("no such channel")

    with pytest.warns(RuntimeWarning, match="on_finding callable failed .*no such channel"):
        _, done = _torch_fit(str(tmp_path), lr=30.0, epochs=3, on_finding=broken)
    assert done == 3 and len(calls) == 1


def test_a_callable_that_raises_finding_stop_stops(tmp_path) -> None:
    seen: list = []

    def page_then_stop(finding):
        seen.append(finding)
        raise FindingStop(finding)

    with pytest.raises(FindingStop) as stopped:
        _torch_fit(str(tmp_path), lr=30.0, epochs=20, on_finding=page_then_stop)
    assert seen and stopped.value.finding is seen[0]


@pytest.mark.parametrize("every", ["epoch", 10])
def test_the_rules_judge_what_diagnose_reads_from_the_files(tmp_path, every) -> None:
    """The series judged during training are the files' series, point for point, and so
    are their findings (every severity)."""
    intro, _ = _torch_fit(str(tmp_path), lr=3.0, epochs=3, every=every,
                          on_finding=lambda f: None, on_finding_severity="info")
    live = intro.pipeline.findings.run.series()
    files = _files(str(tmp_path))
    a, b = live.all_series(), files.all_series()
    assert sorted(a) == sorted(b) and len(a) > 10
    for tag, s in b.items():
        assert a[tag].info == s.info, tag
        np.testing.assert_array_equal(a[tag].steps, s.steps, err_msg=tag)
        np.testing.assert_array_equal(a[tag].values, s.values, err_msg=tag)
    assert [f.to_json() for f in find_issues(live)] == [f.to_json() for f in find_issues(files)]


# ---------------------------------------------------------------- Keras


def _keras_fit(logdir: str, lr: float, epochs: int, **options):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    from tb_introspect.keras import Introspect

    x, y = _digits()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    model.compile(keras.optimizers.SGD(lr), "sparse_categorical_crossentropy")
    callback = Introspect(logdir, **options)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no instrumentation failure
        history = model.fit(x, y, batch_size=BATCH, epochs=epochs, verbose=0,
                            callbacks=[callback])
    callback.close()
    keras.backend.clear_session()
    return len(history.history["loss"])


def test_keras_stop_ends_fit_early_and_names_the_finding(tmp_path, caplog) -> None:
    logdir = str(tmp_path)
    with caplog.at_level(logging.WARNING, "tb_introspect"):
        epochs = _keras_fit(logdir, lr=5.0, epochs=10, on_finding="stop", views=LEAN)
    assert epochs < 10
    lines = [r.getMessage() for r in caplog.records if "stopping training" in r.getMessage()]
    assert len(lines) == 1, caplog.text
    found = {f.kind: f for f in find_issues(_files(logdir))}
    # The rule it names is one the run's files show (at the severity it acted on or above).
    named = [k for k in found if f" {k}: " in lines[0]]
    assert named and SEVERITY_RANK[found[named[0]].severity] <= SEVERITY_RANK["warning"]


def test_keras_callable_records_each_finding_once_and_a_healthy_fit_calls_nothing(
        tmp_path) -> None:
    seen: list = []
    assert _keras_fit(str(tmp_path / "diverging"), lr=5.0, epochs=2, on_finding=seen.append,
                      views=LEAN) == 2
    assert seen, "no finding on a diverging fit"
    _judged(seen)
    healthy: list = []
    assert _keras_fit(str(tmp_path / "healthy"), lr=0.1, epochs=4,
                      on_finding=healthy.append) == 4
    assert healthy == []


# ---------------------------------------------------------------- custom GradientTape loop


def test_custom_loop_stop_raises_from_end_step_or_end_epoch(tmp_path) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    from tb_introspect import FindingStop as Exported
    from tb_introspect.keras import Introspector

    assert Exported is FindingStop
    x, y = (tf.constant(a[:1024]) for a in _digits())  # tensors: no retrace per batch
    keras.utils.set_random_seed(0)
    dense1, dense2 = keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)
    model = keras.Sequential([keras.Input((64,)), dense1, dense2])
    opt = keras.optimizers.SGD(30.0)
    done = 0
    with pytest.raises(FindingStop) as stopped, \
            Introspector(str(tmp_path), on_finding="stop") as intro:

        @tf.function
        def train_step(xb, yb):
            with tf.GradientTape() as tape:
                logits = dense2(dense1(xb))
                loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                    yb, logits, from_logits=True))
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            # No outputs: a smaller graph to trace; the gradients show the divergence.
            intro.record(variables=model.trainable_variables, gradients=grads,
                         metrics={"loss": loss})

        for _ in range(12):
            for i in range(0, 1024, BATCH):
                train_step(x[i:i + BATCH], y[i:i + BATCH])
                intro.step()
            intro.end_epoch()
            done += 1
    assert done < 12 and stopped.value.finding.severity in ACTS
    keras.backend.clear_session()
