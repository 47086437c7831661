"""The in-step engine's two costs, on CPU: one batch's state, and one logged point.

* ``stats.batch_state`` of one 2M-element activation ([64, 1024, 32], ReLU-like
  and normal data): what every monitored output and output gradient costs per
  accumulated step (every row counts); ``stats.activity_state``, what a step that is not a
  statistics step pays (``stats_every``), and a bare ``tf.reduce_sum``, the floor of one read;
* other ways to count the non-zero values of every column of the same activation
  (ReLU-like), interleaved with ``activity_state``;
* one logged point (``Pipeline.log``: computed, written) for the GAP CNN, MobileNetV2 and
  ResNet50 (32x32, ``weights=None``; ``--log-model``): the device copies on the training
  thread (one traced function: reads, a merge across replicas, resets), then on the
  pipeline's worker the statistics of every variable, gradient sum and output state
  (numpy) and writing; and the first point, which traces the reading function;
  ``--profile-points N`` adds where a later point's time goes (cProfile of N points, the
  worker's part run on the calling thread);
* the XLA compile of a step holding N ``batch_state`` computations (each in a fresh
  process: seconds to the first result, peak RSS), why ``step.XLA_STEP_TENSORS`` exists.

Medians of ``--repeats`` runs after a warm-up call (tracing); ResNet50's later points a
third as many (at least 3).

    python benchmarks/engine_bench.py
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import subprocess
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


#: Elements of the activation the batch-state and counting rows read: [64, 1024, 32].
ELEMENTS = 64 * 1024 * 32


def _shape(elements: int) -> tuple[int, int, int]:
    """A [64, P, 32] activation of about ``elements`` values."""
    return 64, max(elements // (64 * 32), 1), 32


def _size(elements: int) -> str:
    n = int(np.prod(_shape(elements)))
    return f"{n / 2**20:g}M" if n >= 2**20 else f"{n / 2**10:g}K"


def batch_state_rows(repeats: int, elements: int = ELEMENTS) -> None:
    rng = np.random.default_rng(0)
    seed = tf.constant([1, 2], tf.int64)
    shape = _shape(elements)
    for kind, x in (("ReLU-like", np.maximum(rng.normal(size=shape), 0)),
                    ("normal", rng.normal(size=shape))):
        v = tf.Variable(x.astype("float32"))
        # A skipped step's exact activity counts, and the floor of any full read.
        for what, f in (("stats.batch_state", lambda t: stats.batch_state(t, 2048, seed)),
                        ("stats.activity_state", stats.activity_state),
                        ("tf.reduce_sum", tf.reduce_sum)):
            fn = tf.function(lambda v=v, f=f: f(v.read_value()), autograph=False)
            w, c = timed(lambda fn=fn: tf.nest.map_structure(lambda t: t.numpy(), fn()), repeats)
            print(f"| `{what}`, {_size(elements)} elements, {kind} | {w:.1f} | {c:.1f} |",
                  flush=True)


def counting_rows(repeats: int, elements: int = ELEMENTS) -> None:
    """Per-column non-zero counts of a [64, 32768] ReLU-like activation, interleaved."""
    x = np.maximum(np.random.default_rng(0).normal(size=_shape(elements)), 0).astype("float32")
    v = tf.Variable(x.reshape(64, -1))

    def cast_sum(t):
        return tf.reduce_sum(tf.cast(tf.not_equal(t, 0.0), tf.float32), axis=0)

    ways = {
        "stats.activity_state (x / x, matrix-vector sum)":
            lambda t: stats.activity_state(t)["channel_nnz"],
        "sign, column norm (batch_state's)": lambda t: tf.square(
            tf.norm(tf.sign(t), axis=0)),
        "divide_no_nan(x, x), column sum":
            lambda t: tf.reduce_sum(tf.math.divide_no_nan(t, t), axis=0),
        "not_equal, cast, column sum": cast_sum,
        "ones @ cast(not_equal)": lambda t: tf.matmul(
            tf.ones([1, 64]), tf.cast(tf.not_equal(t, 0.0), tf.float32)),
        "tf.math.count_nonzero(axis=0)": lambda t: tf.math.count_nonzero(t, axis=0),
        "not_equal, cast, column sum under XLA": tf.function(cast_sum, jit_compile=True),
    }
    fns = {k: tf.function(lambda f=f: tf.reduce_sum(f(v.read_value())), autograph=False)
           for k, f in ways.items()}
    wall: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        fn()
    for _ in range(repeats):
        for k, fn in fns.items():
            c0, t0 = time.process_time(), time.perf_counter()
            fn().numpy()
            wall[k].append(1e3 * (time.perf_counter() - t0))
            cpu[k].append(1e3 * (time.process_time() - c0))
    for k in fns:
        print(f"| counts, {k} | {statistics.median(wall[k]):.1f} |"
              f" {statistics.median(cpu[k]):.1f} |", flush=True)


def xla_compile_child(n: int) -> None:
    """Compile and run one XLA function holding ``n`` ``batch_state`` computations of
    differently shaped tensors (as a model's layer outputs are); print s and peak MiB."""
    xs = [tf.random.normal((8, 4 + i, 16 + i % 5)) for i in range(n)]

    @tf.function(jit_compile=True)
    def step(xs, flag):
        def stat(x, i):
            return tf.cond(flag, lambda: stats.batch_state(x, 2048, tf.constant([1, i],
                                                                              tf.int64))["m2"],
                           lambda: tf.constant(0.0, tf.float64))
        return tf.add_n([stat(x, i) for i, x in enumerate(xs)])

    t0 = time.perf_counter()
    step(xs, tf.constant(True)).numpy()
    # VmHWM, not ru_maxrss: the latter keeps the parent's peak across exec.
    with open("/proc/self/status") as f:
        peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024
    print(f"{time.perf_counter() - t0:.1f} {peak:.0f}")


def xla_compile_rows(sizes: tuple[int, ...], in_process: bool = False) -> None:
    print("\n| XLA step with N `batch_state` | compile + first run s | peak RSS MiB |")
    print("|---:|---:|---:|")
    for n in sizes:
        if in_process:  # a smoke run: this process's peak, TensorFlow already imported
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                xla_compile_child(n)
            s, mib = out.getvalue().split()[-2:]
            print(f"| {n} | {s} | {mib} |", flush=True)
            continue
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--xla-compile-child",
                            str(n)], capture_output=True, text=True, timeout=1800)
        s, mib = r.stdout.split()[-2:] if r.returncode == 0 else ("failed", "-")
        print(f"| {n} | {s} | {mib} |", flush=True)


def log_rows(repeats: int, names: list[str], profile: int = 0) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from overhead import make

    from tb_introspect.keras import Introspect

    for name in names:
        model = make(name)
        with tempfile.TemporaryDirectory(prefix="tbi_engine_") as logdir:
            _log_rows(model, Introspect(logdir, every="epoch"),
                      max(3, repeats // 3) if name == "resnet50" else repeats, name, profile)


def _log_rows(model, cb, repeats: int, name: str, profile: int = 0) -> None:
    from overhead import dataset

    from tb_introspect.pipeline.pipeline import Pipeline

    # The fit's one point, at the epoch's end, is the first: it traces the logging function.
    # A point is its device copies on the training thread, then its host part (statistics,
    # summaries, writes) on the pipeline's worker: timed until the worker is done (CPU
    # time is every thread's).
    first, log = [], Pipeline.log

    def first_log(host, *a, **k):
        c0, t0 = time.process_time(), time.perf_counter()
        log(host, *a, **k)
        thread = (time.perf_counter() - t0, time.process_time() - c0)
        host.worker.wait()
        first.append((*thread, time.perf_counter() - t0, time.process_time() - c0))

    Pipeline.log = first_log
    try:
        model.fit(dataset(2, 16), epochs=1, verbose=0, callbacks=[cb])
    finally:
        Pipeline.log = log
    plan, pipeline = cb.front_end.plan, cb.pipeline
    steps = iter(range(10**6))
    on_thread = []

    def one_point():
        c0, t0 = time.process_time(), time.perf_counter()
        pipeline.log(next(steps))
        on_thread.append((1e3 * (time.perf_counter() - t0), 1e3 * (time.process_time() - c0)))
        pipeline.worker.wait()

    w, cpu = timed(one_point, repeats)
    tw, tc = (statistics.median(x) for x in zip(*on_thread[1:], strict=True))
    tensors = len(plan.variables) * 2 + len(plan.outputs) * 2
    label = f"{name} ({tensors} tensors)"
    fw, fc, tw0, tc0 = (1e3 * v for v in first[0])
    print(f"| `Pipeline.log`, the first point (traced), {label} | {tw0:.0f} | {tc0:.0f} |")
    print(f"| the same, on the training thread | {fw:.0f} | {fc:.0f} |")
    print(f"| `Pipeline.log`, one later point, {label} | {w:.0f} | {cpu:.0f} |")
    print(f"| the same, on the training thread | {tw:.0f} | {tc:.0f} |", flush=True)
    if profile:
        profile_points(pipeline, steps, profile, name)
    cb.close()


def profile_points(pipeline, steps, points: int, name: str, top: int = 25) -> None:
    """The functions that take most of ``points`` later points' time (cProfile's own time;
    the worker's part runs on this thread so that cProfile sees it)."""
    import cProfile
    import pstats

    pipeline.worker.wait()
    pipeline.worker.threaded = False
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(points):
        pipeline.log(next(steps))
    profiler.disable()
    pipeline.worker.threaded = True
    print(f"\n{name}: {points} later points, cProfile, by own time")
    pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(top)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--xla-sizes", default="4,16,32",
                   help="numbers of batch_state computations in the XLA compile rows")
    p.add_argument("--log-model", default="cnn,mobilenetv2,resnet50",
                   help="the models of the logged-point rows, comma separated (of"
                        " overhead.py's)")
    p.add_argument("--only-points", action="store_true",
                   help="only the logged-point rows")
    p.add_argument("--profile-points", type=int, default=0, metavar="N",
                   help="with the logged-point rows: cProfile of N later points per model")
    p.add_argument("--elements", type=int, default=ELEMENTS,
                   help="elements of the batch-state and counting rows' activation")
    p.add_argument("--in-process", action="store_true",
                   help="compile the XLA rows in this process instead of fresh ones (a smoke"
                        " run of the benchmark's own code: not a fresh process's figures)")
    p.add_argument("--xla-compile-child", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.xla_compile_child:
        xla_compile_child(args.xla_compile_child)
        return 0
    print(f"# CPU ({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}),"
          f" median of {args.repeats}")
    print("| what | wall ms | CPU ms |\n|---|---:|---:|")
    if not args.only_points:
        batch_state_rows(args.repeats, args.elements)
        counting_rows(2 * args.repeats, args.elements)
    log_rows(args.repeats, [m for m in args.log_model.split(",") if m], args.profile_points)
    if not args.only_points:
        xla_compile_rows(tuple(int(n) for n in args.xla_sizes.split(",") if n),
                         args.in_process)
    return 0


if __name__ == "__main__":
    sys.exit(main())
