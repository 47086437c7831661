"""Activity (activation rate, dead rate, spatial dead rate) counts every row of every batch."""

from __future__ import annotations

import collect_testlib as lib
import keras
import numpy as np

from tb_introspect import metadata
from tb_introspect.keras import Introspect

SIDE, CHANNELS, SAMPLES, BATCH = 16, 64, 512, 64


def one_hot_activations() -> np.ndarray:
    """Sample i switches on exactly one channel at one position; all of them fire somewhere."""
    x = np.zeros((SAMPLES, SIDE, SIDE, CHANNELS), np.float32)
    i = np.arange(SAMPLES)
    x[i, i % SIDE, (i // SIDE) % SIDE, i % CHANNELS] = 1.0 + (i % 7)
    return x


def test_dead_rate_is_exact_over_every_sample(tmp_path):
    keras.utils.set_random_seed(0)
    inp = keras.Input((SIDE, SIDE, CHANNELS))
    h = keras.layers.ReLU(name="wide")(inp)
    h = keras.layers.Conv2D(2, 1, name="mix")(h)
    h = keras.layers.GlobalAveragePooling2D(name="pool")(h)
    out = keras.layers.Dense(3, name="head")(h)
    model = keras.Model(inp, out)
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = one_hot_activations()
    y = np.arange(SAMPLES) % 3
    # Each channel fires in 8 of the 512 samples, one sample per step at most for
    # most channels: any subsample of rows would report some of them dead.
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[Introspect(str(tmp_path), views=("output",))])
    run = lib.read_run(str(tmp_path))
    wide = run[metadata.stats_tag("output", "wide")].at(SAMPLES // BATCH)
    assert wide["count"] == x.size
    assert wide["dead_rate"] == 0.0
    assert wide["spatial_dead_rate"] == 0.0
    assert wide["activation_rate"] == SAMPLES / x.size
