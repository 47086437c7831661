"""A Keras point's host part runs beside the next training steps on what the training thread
handed it (the weights' copies, read-only views of the window's gradient sums and output
states): nothing training does afterwards may change them."""

from __future__ import annotations

import threading

import keras
import numpy as np

from tb_introspect.keras import Introspect
from tb_introspect.keras.point_graph import PointGraph

STEPS = 6


def arrays_of(host) -> dict[str, list[np.ndarray]]:
    """The arrays the host part closes over, by name."""
    out = {}
    for name, cell in zip(host.__code__.co_freevars, host.__closure__, strict=True):
        value = cell.cell_contents
        items = value if isinstance(value, list) else [value]
        if items and all(isinstance(a, np.ndarray) for a in items):
            out[name] = items
    return out


def test_a_points_host_arrays_hold_while_training_goes_on(tmp_path, monkeypatch):
    held, checked = [], []
    point = PointGraph.point

    def keep(self, step):
        host = point(self, step)
        arrays = arrays_of(host)
        held.append({k: [a.copy() for a in v] for k, v in arrays.items()})
        if len(held) == 2:  # the first point's host part runs after the second's copies
            gate.set()

        def later():
            checked.append({k: all(np.array_equal(a, b, equal_nan=True)
                                   for a, b in zip(v, held[0][k], strict=True))
                            for k, v in arrays.items()})
            return host()

        return later

    monkeypatch.setattr(PointGraph, "point", keep)
    gate = threading.Event()

    class Hold(keras.callbacks.Callback):
        """The worker waits until the second epoch's steps ran and its point was taken."""

        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 0:  # bounded: a failure here fails the test, it does not hang it
                cb.pipeline.worker.submit(gate.wait, 120)

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(3)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8 * STEPS, 8)), rng.integers(0, 3, 8 * STEPS)
    # No timed flush within the fit: it would wait for the held worker (a slow machine's
    # first epoch, which traces the point, can outlast the default 5 s).
    cb = Introspect(str(tmp_path), every="epoch", flush_secs=3600)
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[cb, Hold()])
    cb.close()
    assert gate.is_set()
    assert len(held) == 2 and len(checked) == 2
    # The first point's host part ran after the second epoch and its point: its arrays are
    # as they were handed over.
    assert {"weights", "sums", "states"} <= set(checked[0])
    assert all(checked[0].values()), checked[0]
    assert not all(np.array_equal(a, b) for a, b in zip(held[0]["weights"], held[1]["weights"],
                                                       strict=True))  # training went on
