"""Training with the callback prints nothing beyond what plain training prints."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import sys, tempfile
    import keras, numpy as np
    from tb_introspect.keras import Introspect
    keras.utils.set_random_seed(0)
    inp = keras.Input((16, 16, 3))
    h = keras.layers.Conv2D(8, 3, padding="same", use_bias=False)(inp)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.ReLU()(h)
    h = keras.layers.MaxPooling2D()(h)
    h = keras.layers.Flatten()(h)
    h = keras.layers.Dense(16, activation="relu")(h)
    h = keras.layers.Dropout(0.2)(h)
    model = keras.Model(inp, keras.layers.Dense(3)(h))
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(96, 16, 16, 3)).astype("float32"), rng.integers(0, 3, 96)
    every = sys.argv[1]
    callbacks = [] if every == "none" else [
        Introspect(tempfile.mkdtemp(), every=every if every == "epoch" else int(every))]
    model.fit(x, y, batch_size=32, epochs=2, validation_split=0.25, verbose=0,
              callbacks=callbacks)
    print("trained")
    """
)


def output_lines(every: str) -> list[str]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, every], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "trained" in proc.stdout
    # Timestamps and addresses differ from run to run; the messages themselves must not.
    return [line.split("] ", 1)[-1] for line in (proc.stdout + proc.stderr).splitlines()
            if line.strip()]


@pytest.fixture(scope="module")
def plain() -> set[str]:
    """What the same training prints without the callback."""
    return set(output_lines("none"))


@pytest.mark.parametrize("every", ["epoch", "1"])
def test_callback_adds_no_output(every, plain):
    """Nothing, but with every=1 the one line on what logging every step costs."""
    # TensorFlow's own note on which kernel serves an op on this CPU ("oneDNN supports
    # DT_INT32 only on platforms with AVX-512..."): printed on some machines for an int32
    # transpose of the logging function's vectorized finalize, never by this project.
    extra = [line for line in output_lines(every)
             if line not in plain and not line.startswith("oneDNN supports ")]
    if every == "1":
        notes = [line for line in extra if line.startswith("every=1: each step's logged point")]
        assert len(notes) == 1, extra
        extra.remove(notes[0])
    assert not extra, "\n".join(extra[:20])
