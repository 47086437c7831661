"""Keras ``fit`` with points written beside training (``pipeline.worker``), on a slow disk:
everything is on disk when ``fit`` returns, and a ``fit`` that raises keeps every point
logged before (the process's exit finishes the worker's writes). One child process: a real
Keras training, its event files read here."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tb_introspect import metadata
from tests.pipeline.pipeline_testlib import events

STEPS_PER_EPOCH = 4

CHILD = r"""
import sys, time
from pathlib import Path

import numpy as np
import keras

from tb_introspect.keras import Introspect
from tb_introspect.pipeline import sink

write = sink.EventSink.write_steps


def slow(self, *args, **kwargs):  # a slow disk: the worker lags the training
    time.sleep(0.2)
    return write(self, *args, **kwargs)


sink.EventSink.write_steps = slow
root = Path(sys.argv[1])
rng = np.random.default_rng(0)
x, y = rng.normal(size=(64, 8)).astype("float32"), rng.integers(0, 3, 64)


def fit(log_dir, callbacks=()):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="relu",
                              name="hidden"), keras.layers.Dense(3, name="head")])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=16, epochs=3, verbose=0,
              callbacks=[Introspect(log_dir, every="epoch"), *callbacks])


fit(root / "ended")
# what is on disk when fit returns, before anything closes the file
(root / "at_return").mkdir()
for f in (root / "ended").glob("events.out.tfevents.*"):
    (root / "at_return" / f.name).write_bytes(f.read_bytes())


class Fails(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if self.model.optimizer.iterations.numpy() == 2 * 4 + 2:
            raise RuntimeError("the training failed")


fit(root / "failed", [Fails()])
"""


def _point_steps(log_dir: Path) -> set[int]:
    prefix = metadata.stats_tag("variable", "")  # the tag names the model, then the layer
    return {e.step for e in events(log_dir) for v in e.summary.value
            if v.tag.startswith(prefix) and v.tag.endswith("/hidden/kernel")}


def test_fit_ends_with_its_points_on_disk_and_a_failed_fit_keeps_them(tmp_path):
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True,
                          text=True, timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode != 0 and "the training failed" in done.stderr, done.stderr[-3000:]
    every_epoch = {STEPS_PER_EPOCH * e for e in (1, 2, 3)}
    assert _point_steps(tmp_path / "at_return") == every_epoch
    # the exception came in epoch 3: the two epochs before it are all there
    assert _point_steps(tmp_path / "failed") == every_epoch - {3 * STEPS_PER_EPOCH}
    shutil.rmtree(tmp_path / "at_return")
