"""What the Keras callback adds to a fresh process's first ``fit``: tracing and compiling
its step functions, its set-up, its first points.

Each measurement is a fresh Python process that imports TensorFlow and Keras, builds and
compiles the model, then times one ``fit`` of one epoch (8 steps of batch 64 by default):
plain, or with ``Introspect()`` (default settings, all four views; importing
``tb_introspect.keras`` and making the callback are inside the timed span, as a user pays
them). CPU is the process's CPU time (every thread), wall its wall time. Processes
alternate (plain, callback, plain, ...), and each figure is the median of ``--repeats``.
The callback's rows also give the wall time of its two train functions' first calls
(tracing and compiling: statistics / lean; the governor's ``compile_seconds``).

The models are those of ``overhead.py`` (defined again here: the plain process must not
import ``tb_introspect``): the reference CNN (3 x conv-BN-ReLU-pool, Flatten, Dense 128),
``keras.applications.MobileNetV2`` and ``ResNet50`` at 32x32x3, ``weights=None`` (nothing
is downloaded).

    python benchmarks/first_fit.py                          # the table of docs/benchmarks.md
    python benchmarks/first_fit.py --models cnn --repeats 1 # a fast smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

#: The most CPU-seconds the callback may add to a first fit (the tracing of every step
#: variant included).
TARGETS = {"cnn": 1.5, "mobilenetv2": 6.0, "resnet50": 12.0}
NAMES = {"cnn": "reference CNN", "mobilenetv2": "MobileNetV2 32x32",
         "resnet50": "ResNet50 32x32", "tiny": "tiny CNN (one conv block; smoke runs)"}


def _model(kind: str):
    import keras

    keras.utils.set_random_seed(0)
    if kind == "tiny":  # overhead.py's tiny_cnn
        x = inp = keras.Input((32, 32, 3))
        x = keras.layers.Conv2D(8, 3, use_bias=False)(x)
        x = keras.layers.BatchNormalization()(x)
        x = keras.layers.ReLU()(x)
        x = keras.layers.GlobalAveragePooling2D()(x)
        model, logits = keras.Model(inp, keras.layers.Dense(10)(x)), True
    elif kind == "cnn":  # overhead.py's cifar_cnn("flatten")
        x = inp = keras.Input((32, 32, 3))
        for f in (32, 64, 128):
            x = keras.layers.Conv2D(f, 3, padding="same", use_bias=False)(x)
            x = keras.layers.BatchNormalization()(x)
            x = keras.layers.ReLU()(x)
            x = keras.layers.MaxPooling2D()(x)
        x = keras.layers.Flatten()(x)
        x = keras.layers.Dense(128, activation="relu")(x)
        x = keras.layers.Dropout(0.2)(x)
        model, logits = keras.Model(inp, keras.layers.Dense(10)(x)), True
    else:
        app = {"mobilenetv2": keras.applications.MobileNetV2,
               "resnet50": keras.applications.ResNet50}[kind]
        model, logits = app(weights=None, input_shape=(32, 32, 3), classes=10), False
    model.compile(keras.optimizers.Adam(1e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=logits),
                  metrics=["accuracy"])
    return model


def child(kind: str, with_callback: bool, steps: int, batch: int) -> dict:
    """One fresh process's first fit (the parent runs this through ``--child``)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import tensorflow as tf  # noqa: F401 - imported before the timed span, in both

    model = _model(kind)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * batch, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, steps * batch)
    with tempfile.TemporaryDirectory() as log_dir:
        c0, t0 = time.process_time(), time.perf_counter()
        callbacks = []
        if with_callback:
            from tb_introspect.keras import Introspect

            callbacks = [Introspect(log_dir)]
        model.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False,
                  callbacks=callbacks)
        for cb in callbacks:
            cb.close()
        out = {"cpu": time.process_time() - c0, "wall": time.perf_counter() - t0}
        if callbacks:
            compiled = callbacks[0].governor.compile_seconds
            out["stats_s"], out["lean_s"] = compiled.get(True), compiled.get(False)
    return out


def run_child(kind: str, with_callback: bool, args: argparse.Namespace) -> dict:
    if args.in_process:  # a smoke run: TensorFlow is imported once, not a first fit
        return child(kind, with_callback, args.steps, args.batch)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", kind,
           "--steps", str(args.steps), "--batch", str(args.batch)]
    if with_callback:
        cmd.append("--callback")
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"{kind} child exited {r.returncode}:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _median(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(values) if values else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="cnn,mobilenetv2,resnet50")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--in-process", action="store_true",
                   help="fit in this process instead of fresh ones (a smoke run of the"
                        " benchmark's own code: not a first fit's figures)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--callback", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.callback, args.steps, args.batch)))
        return 0
    rows = []
    for kind in args.models.split(","):
        plain, intro = [], []
        for _ in range(args.repeats):  # alternating: a load change hits both alike
            plain.append(run_child(kind, False, args))
            intro.append(run_child(kind, True, args))
            print(f"{kind}: plain {plain[-1]}, Introspect {intro[-1]}", file=sys.stderr,
                  flush=True)
        rows.append((kind, plain, intro))
    print(f"\nFirst fit in a fresh process: 1 epoch of {args.steps} steps, batch {args.batch},"
          f" median of {args.repeats}\n")
    print("| model | plain fit: CPU / wall | with `Introspect()`: CPU / wall | added CPU |"
          " added wall | first call: statistics / lean step | target (added CPU) |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for kind, plain, intro in rows:
        pc, pw = _median(plain, "cpu"), _median(plain, "wall")
        ic, iw = _median(intro, "cpu"), _median(intro, "wall")
        # added: the median of each alternating pair's difference
        dc = statistics.median(i["cpu"] - q["cpu"] for q, i in zip(plain, intro, strict=True))
        dw = statistics.median(i["wall"] - q["wall"] for q, i in zip(plain, intro, strict=True))
        st, le = _median(intro, "stats_s"), _median(intro, "lean_s")
        first = f"{st:.1f} / {le:.1f} s" if st is not None and le is not None else ""
        target = TARGETS.get(kind)
        goal = "-" if target is None else f"<= {target:g} s: {'met' if dc <= target else 'missed'}"
        print(f"| {NAMES.get(kind, kind)} | {pc:.1f} / {pw:.1f} s | {ic:.1f} / {iw:.1f} s |"
              f" {dc:+.1f} s | {dw:+.1f} s | {first} | {goal} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
