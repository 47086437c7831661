"""Wrote adam_cnn/ with tb-introspect at commit cd77b44 (format version 1); kept as a record."""

import keras
import numpy as np

from tb_introspect import metadata
from tb_introspect.keras import Introspect

assert metadata.PROTO_VERSION == 1, metadata.__file__
keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
x = rng.random((192, 8, 8, 3)).astype("float32")
y = rng.integers(0, 4, 192)
m = keras.Sequential([
    keras.Input((8, 8, 3)),
    keras.layers.Conv2D(6, 3, activation="relu", name="conv"),
    keras.layers.GlobalAveragePooling2D(name="pool"),
    keras.layers.Dense(4, name="logits"),
])
m.compile(keras.optimizers.Adam(0.01), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
m.fit(x, y, epochs=3, batch_size=32, verbose=0,
      callbacks=[Introspect("tests/data/format_v1/adam_cnn")])
