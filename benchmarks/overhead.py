"""Overhead of the Introspect callback on a CIFAR-shaped CNN, on CPU.

Two identical models in one process, one plain and one with the callback; epochs
interleaved A B A B ... (each a ``fit(epochs=1)``, after a warm-up epoch that
absorbs tracing); the figure is the median of the per-pair time ratios B/A.
``--profile`` splits the instrumented epoch into train-function time, logging
time (statistics + writing) and host bookkeeping.

    python benchmarks/overhead.py                  # the README table
    python benchmarks/overhead.py --quick          # a fast smoke run
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tb_introspect.collect import core, host  # noqa: E402
from tb_introspect.keras import Introspect  # noqa: E402

TARGETS = {"epoch": 1.05, "1": 1.25, "16": 1.05}


def make_model(seed: int = 0) -> keras.Model:
    """conv-BN-ReLU blocks, max-pooling, dense head with dropout (CIFAR-10 shapes)."""
    keras.utils.set_random_seed(seed)
    x = inp = keras.Input((32, 32, 3))
    for f in (32, 32, "pool", 64, 64, "pool", 128, "pool"):
        if f == "pool":
            x = keras.layers.MaxPooling2D()(x)
            continue
        x = keras.layers.Conv2D(f, 3, padding="same", use_bias=False)(x)
        x = keras.layers.BatchNormalization()(x)
        x = keras.layers.ReLU()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dense(128, activation="relu")(x)
    x = keras.layers.Dropout(0.3)(x)
    out = keras.layers.Dense(10)(x)
    model = keras.Model(inp, out)
    model.compile(
        keras.optimizers.Adam(1e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def dataset(steps: int, batch: int) -> tf.data.Dataset:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * batch, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, steps * batch)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).cache()


class Timers:
    """Wall time spent in the callback's logging and host bookkeeping (for --profile)."""

    def __init__(self) -> None:
        self.log = 0.0
        self.drain = 0.0
        orig_log, orig_drain = core.Collector.log, host.HostLogger.drain

        def log(c, *a, **k):
            t = time.perf_counter()
            try:
                return orig_log(c, *a, **k)
            finally:
                self.log += time.perf_counter() - t

        def drain(h, *a, **k):
            t = time.perf_counter()
            try:
                return orig_drain(h, *a, **k)
            finally:
                self.drain += time.perf_counter() - t

        core.Collector.log, host.HostLogger.drain = log, drain

    def reset(self) -> None:
        self.log = self.drain = 0.0


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def accumulator_mb(cb: Introspect) -> float:
    c = cb.collector
    vs = [c.counter, c.metric_total, c.metric_count, *c.grad_acc, *c.grad_prev, *c.w_prev,
          *c.out_vars.values()]
    return sum(int(np.prod(v.shape)) * v.dtype.size for v in vs) / 2**20


def run(every: str, args: argparse.Namespace, timers: Timers) -> dict:
    ds = dataset(args.steps, args.batch)
    plain, inst = make_model(), make_model()
    cadence = every if every == "epoch" else int(every)
    log_dir = tempfile.mkdtemp(prefix="tbi_overhead_")
    kwargs = {}
    if args.step_sample_size:
        kwargs["step_sample_size"] = args.step_sample_size
    if args.output_budget:
        kwargs["output_budget"] = None if args.output_budget < 0 else args.output_budget
    cb = Introspect(log_dir, every=cadence, **kwargs)
    # Warm-up epochs: tracing, graph optimisation, first writes.
    plain.fit(ds, epochs=1, verbose=0)
    rss_plain = rss_mb()
    inst.fit(ds, epochs=1, verbose=0, callbacks=[cb])
    rss_inst = rss_mb()
    ratios, cpu_ratios, t_plain, t_inst, t_log, t_drain = [], [], [], [], [], []
    for i in range(args.pairs):
        times, cpu = {}, {}
        order = ("plain", "inst") if i % 2 == 0 else ("inst", "plain")
        for which in order:
            timers.reset()
            c0 = time.process_time()
            t = time.perf_counter()
            if which == "plain":
                plain.fit(ds, epochs=1, verbose=0)
            else:
                inst.fit(ds, epochs=1, verbose=0, callbacks=[cb])
            times[which] = time.perf_counter() - t
            cpu[which] = time.process_time() - c0
            if which == "inst":
                t_log.append(timers.log)
                t_drain.append(timers.drain)
        ratios.append(times["inst"] / times["plain"])
        cpu_ratios.append(cpu["inst"] / cpu["plain"])
        t_plain.append(times["plain"])
        t_inst.append(times["inst"])
    cb.close()
    return {
        "every": every,
        "ratio": statistics.median(ratios),
        "ratios": ratios,
        "cpu_ratio": statistics.median(cpu_ratios),
        "plain_s": statistics.median(t_plain),
        "inst_s": statistics.median(t_inst),
        "log_s": statistics.median(t_log),
        "drain_s": statistics.median(t_drain),
        "rss_plain": rss_plain,
        "rss_inst": rss_inst,
        "acc_mb": accumulator_mb(cb),
        "tensors": len(cb.collector.var_specs) * 2 + len(cb.collector.out_specs) * 2,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--every", default="epoch,16,1", help="cadences, comma separated")
    p.add_argument("--steps", type=int, default=40, help="steps per epoch")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--pairs", type=int, default=5, help="A/B epoch pairs per cadence")
    p.add_argument("--step-sample-size", type=int, default=0,
                   help="in-step percentile sample bound (0: the callback's default)")
    p.add_argument("--output-budget", type=int, default=0,
                   help="elements per output per step (0: default, -1: every row)")
    p.add_argument("--threads", type=int, default=0, help="TF intra/inter-op threads (0: TF's)")
    p.add_argument("--profile", action="store_true", help="print where the extra time goes")
    p.add_argument("--quick", action="store_true", help="smoke run: few steps, 1 pair")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.batch, args.pairs = 4, 32, 1
    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    timers = Timers()
    print(f"# CIFAR-shaped CNN, batch {args.batch}, {args.steps} steps/epoch, CPU "
          f"({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}), "
          f"median of {args.pairs} interleaved epoch pairs")
    print("| views | cadence | plain epoch s | instrumented epoch s | ratio (wall) |"
          " ratio (CPU time) | target | accumulators MiB |")
    print("|---|---|---|---|---|---|---|---|")
    results = []
    for every in args.every.split(","):
        r = run(every.strip(), args, timers)
        results.append(r)
        target = TARGETS.get(r["every"])
        goal = f"<= {target:.2f}x" if target else "-"
        cadence = "per epoch" if r["every"] == "epoch" else f"every {r['every']} steps"
        print(f"| all four | {cadence} | {r['plain_s']:.2f} | {r['inst_s']:.2f} |"
              f" {r['ratio']:.3f}x | {r['cpu_ratio']:.3f}x |"
              f" {goal} |"
              f" {r['acc_mb']:.1f} |", flush=True)
    print(f"\nPeak RSS: {results[0]['rss_plain']:.0f} MiB after the plain warm-up,"
          f" {max(r['rss_inst'] for r in results):.0f} MiB after instrumented ones"
          " (one process, both models).")
    if args.profile:
        print("\n| cadence | per-pair ratios | logging s/epoch | metric drain s/epoch |"
              " monitored tensors |")
        print("|---|---|---|---|---|")
        for r in results:
            ratios = " ".join(f"{x:.2f}" for x in r["ratios"])
            print(f"| {r['every']} | {ratios} | {r['log_s']:.3f} | {r['drain_s']:.3f} |"
                  f" {r['tensors']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
