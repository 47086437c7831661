"""The in-step engine's two costs, on CPU: one batch's state, and one logged point.

* ``stats.batch_state`` of one 2M-element activation ([64, 1024, 32], ReLU-like
  and normal data): what every monitored output and output gradient costs per
  accumulated step (every row counts); ``stats.activity_state``, what a step that is not a
  statistics step pays (``stats_every``), and a bare ``tf.reduce_sum``, the floor of one read;
* ``Collector.log`` of one point for MobileNetV2 (32x32, ``weights=None``):
  statistics of every variable, gradient sum and output state, plus writing.

Medians of ``--repeats`` runs after a warm-up call (tracing).

    python benchmarks/engine_bench.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tb_introspect import stats  # noqa: E402


def timed(fn, repeats: int) -> tuple[float, float]:
    """(median wall ms, median CPU ms) of ``fn()``, after one warm-up call."""
    fn()
    wall, cpu = [], []
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        wall.append(1e3 * (time.perf_counter() - t0))
        cpu.append(1e3 * (time.process_time() - c0))
    return statistics.median(wall), statistics.median(cpu)


def batch_state_rows(repeats: int) -> None:
    rng = np.random.default_rng(0)
    seed = tf.constant([1, 2], tf.int64)
    for kind, x in (("ReLU-like", np.maximum(rng.normal(size=(64, 1024, 32)), 0)),
                    ("normal", rng.normal(size=(64, 1024, 32)))):
        v = tf.Variable(x.astype("float32"))
        # A skipped step's exact activity counts, and the floor of any full read.
        for what, f in (("stats.batch_state", lambda t: stats.batch_state(t, 2048, seed)),
                        ("stats.activity_state", stats.activity_state),
                        ("tf.reduce_sum", tf.reduce_sum)):
            fn = tf.function(lambda v=v, f=f: f(v.read_value()), autograph=False)
            w, c = timed(lambda fn=fn: tf.nest.map_structure(lambda t: t.numpy(), fn()), repeats)
            print(f"| `{what}`, 2M elements, {kind} | {w:.1f} | {c:.1f} |", flush=True)


def log_row(repeats: int) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from overhead import dataset, make

    from tb_introspect.keras import Introspect

    model = make("mobilenetv2")
    cb = Introspect(tempfile.mkdtemp(prefix="tbi_engine_"), every="epoch")
    model.fit(dataset(2, 16), epochs=1, verbose=0, callbacks=[cb])
    c = cb.collector
    steps = iter(range(10**6))
    w, cpu = timed(lambda: c.log(next(steps), 0), repeats)
    tensors = len(c.var_specs) * 2 + len(c.out_specs) * 2
    print(f"| `Collector.log`, one point, MobileNetV2 ({tensors} tensors) | {w:.0f} | {cpu:.0f} |")
    cb.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=9)
    args = p.parse_args(argv)
    print(f"# CPU ({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}),"
          f" median of {args.repeats}")
    print("| what | wall ms | CPU ms |\n|---|---:|---:|")
    batch_state_rows(args.repeats)
    log_row(max(3, args.repeats // 3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
