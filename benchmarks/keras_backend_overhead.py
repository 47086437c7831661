"""Training overhead of ``Introspect`` on Keras's PyTorch or JAX backend (``KERAS_BACKEND``).

The reference CNN of ``overhead.py`` (``--models cnn``; ``tiny`` for a smoke run), identical
copies side by side in one process: plain ``fit`` and ``fit`` with ``Introspect`` at each
cadence (default settings, all four views), after a warm-up epoch each; rounds of one epoch
per variant, interleaved (the order rotates every round); each figure is the median over
rounds of the per-round ratio to plain ``fit``, wall and CPU. Keras picks its backend once
per process: where this process has started Keras on another backend, the script runs
itself in a child process.

    python benchmarks/keras_backend_overhead.py --backend torch  # the tables of
    python benchmarks/keras_backend_overhead.py --backend jax    # docs/benchmarks.md
    python benchmarks/keras_backend_overhead.py --model tiny --steps 2 --rounds 1  # smoke run
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

CONFIGS = ("plain fit", "Introspect(every='epoch')", "Introspect(every=16)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("torch", "jax"), default="torch")
    p.add_argument("--model", choices=("cnn", "tiny"), default="cnn")
    p.add_argument("--steps", type=int, default=96, help="steps per epoch")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    if "keras" not in sys.modules:  # Keras starts on the backend asked for in this process
        os.environ["KERAS_BACKEND"] = args.backend
    import keras

    if keras.config.backend() != args.backend:
        # This process's Keras runs on another backend: a child process that starts on
        # the one asked for runs the benchmark, its table on this process's stdout.
        r = subprocess.run([sys.executable, os.path.abspath(__file__), *(argv or sys.argv[1:])],
                           env={**os.environ, "KERAS_BACKEND": args.backend},
                           capture_output=True, text=True)
        print(r.stdout, end="", flush=True)
        if r.returncode:
            print(r.stderr[-4000:], file=sys.stderr)
        return r.returncode
    return run(args)


def run(args: argparse.Namespace) -> int:
    import keras
    import numpy as np

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from overhead import cifar_cnn, tiny_cnn

    from tb_introspect.keras import Introspect

    rng = np.random.default_rng(0)
    n = args.steps * args.batch
    x = rng.normal(size=(n, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, n)
    folder = tempfile.mkdtemp(prefix=f"keras_{args.backend}_overhead_")
    models, callbacks = {}, {}
    for name in CONFIGS:
        keras.utils.set_random_seed(0)
        model = cifar_cnn("flatten") if args.model == "cnn" else tiny_cnn()
        model.compile(keras.optimizers.Adam(1e-3),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        models[name] = model
        every = {"Introspect(every='epoch')": "epoch", "Introspect(every=16)": 16}.get(name)
        callbacks[name] = [] if every is None else [
            Introspect(os.path.join(folder, str(every)), every=every)]

    def epoch(name: str) -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        models[name].fit(x, y, batch_size=args.batch, epochs=1, verbose=0, shuffle=False,
                         callbacks=callbacks[name])
        return time.perf_counter() - wall, time.process_time() - cpu

    for name in CONFIGS:  # warm-up: the first point's setup, the first calls and compiles
        epoch(name)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in CONFIGS}
    for r in range(args.rounds):
        order = CONFIGS[r % len(CONFIGS):] + CONFIGS[:r % len(CONFIGS)]
        for name in order:
            times[name].append(epoch(name))
    if args.backend == "torch":
        import torch

        engine = f"PyTorch {torch.__version__} ({torch.get_num_threads()} threads"
    else:
        import jax

        engine = f"JAX {jax.__version__} ({jax.default_backend()}"
    print(f"# Keras {keras.__version__} on {engine}, {os.cpu_count()} cores,"
          f" load {os.getloadavg()[0]:.1f}),"
          f" {args.model}, batch {args.batch}, {args.steps} steps/epoch,"
          f" median of {args.rounds} interleaved rounds")
    print("| configuration | plain epoch s | wall | CPU | added CPU ms/step |")
    print("|---|---:|---:|---:|---:|")
    plain = times["plain fit"]
    for name in CONFIGS[1:]:
        pairs = list(zip(times[name], plain, strict=True))
        wall = statistics.median(t[0] / b[0] for t, b in pairs)
        cpu = statistics.median(t[1] / b[1] for t, b in pairs)
        added = statistics.median((t[1] - b[1]) / args.steps * 1e3 for t, b in pairs)
        print(f"| `{name}` | {statistics.median(b[0] for b in plain):.2f} | {wall:.2f}x |"
              f" {cpu:.2f}x | {added:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
