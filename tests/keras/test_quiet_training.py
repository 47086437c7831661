"""Training with the callback prints nothing beyond what plain training prints, also in a
process that fits several models."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

#: The three trainings, plain first, in one process, as a notebook or a sweep fits several
#: models (and one TensorFlow start-up, not three); a marker line on stderr (TensorFlow's
#: own log stream) opens each one's output.
EVERY = ("none", "epoch", "1")
MARK = "=== fit every="

SCRIPT = textwrap.dedent(
    f"""
    import sys
    import keras, numpy as np
    from tb_introspect.keras import Introspect
    for every in {EVERY!r}:
        print("{MARK}" + every, file=sys.stderr, flush=True)
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
        callbacks = [] if every == "none" else [
            Introspect(every, every=every if every == "epoch" else int(every))]
        model.fit(x, y, batch_size=32, epochs=2, validation_split=0.25, verbose=0,
                  callbacks=callbacks)
        print("trained", flush=True)
    """
)


@pytest.fixture(scope="module")
def output(tmp_path_factory) -> dict[str, list[str]]:
    """Each training's lines, by ``every`` ("none": without the callback); the runs are
    written in a temporary folder, one per ``every``."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="0")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300, env=env,
                          cwd=tmp_path_factory.mktemp("quiet"))
    assert proc.returncode == 0, proc.stdout[-3000:]
    out: dict[str, list[str]] = {}
    lines: list[str] = []  # what TensorFlow prints as it starts: no training's
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            lines = out.setdefault(line[len(MARK):], [])
        elif line.strip() and line != "trained":
            # Timestamps and addresses differ from run to run; the messages must not.
            lines.append(line.split("] ", 1)[-1])
    assert list(out) == list(EVERY), proc.stdout[-3000:]
    return out


@pytest.mark.parametrize("every", ["epoch", "1"])
def test_callback_adds_no_output(every, output):
    """Nothing, but with every=1 the one line on what logging every step costs."""
    # TensorFlow's own note on which kernel serves an op on this CPU ("oneDNN supports
    # DT_INT32 only on platforms with AVX-512..."): printed on some machines for an int32
    # transpose of the logging function's vectorized finalize, never by this project.
    plain = set(output["none"])
    extra = [line for line in output[every]
             if line not in plain and not line.startswith("oneDNN supports ")]
    if every == "1":
        notes = [line for line in extra if line.startswith("every=1: each step's logged point")]
        assert len(notes) == 1, extra
        extra.remove(notes[0])
    assert not extra, "\n".join(extra[:20])
