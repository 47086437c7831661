"""Time the full statistics of one tensor against tfp.stats.percentile.

Usage: python benchmarks/stats_bench.py [--sizes 1000 100000 4000000] [--repeats 15]

For each tensor size and data kind, the variants run interleaved in one
process (one call of each per round, after a warm-up call) and the table shows
median wall times. The baseline computes only the same percentiles (9 value
percentiles of the finite values and 9 percentiles of log10|x| of the finite
non-zero values) with ``tfp.stats.percentile``, i.e. full sorts; tb_introspect
computes every statistic of ``docs/statistics.md``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tb_introspect import metadata, stats, stats_np  # noqa: E402

Q = list(metadata.DEFAULT_QUANTILES)


def make_data(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "normal":
        return rng.normal(size=n).astype(np.float32)
    if kind == "relu":  # 80% exact zeros, like a sparse ReLU output
        x = np.abs(rng.normal(size=n)).astype(np.float32)
        x[rng.random(n) < 0.8] = 0.0
        return x
    raise ValueError(kind)


def variants():
    out = {}
    try:
        import tensorflow_probability as tfp
    except Exception as e:  # noqa: BLE001 - optional dependency, any import failure
        print(f"(tensorflow-probability not importable: {e}; no baseline)", file=sys.stderr)
        tfp = None

    if tfp is not None:

        @tf.function
        def tfp_percentiles(x):
            flat = tf.reshape(x, [-1])
            finite = tf.boolean_mask(flat, tf.math.is_finite(flat))
            mags = tf.abs(tf.boolean_mask(finite, tf.not_equal(finite, 0)))
            vq = tfp.stats.percentile(finite, Q, interpolation="linear")
            lq = tfp.stats.percentile(tf.math.log(mags) / np.log(10.0), Q, interpolation="linear")
            return tf.concat([tf.cast(vq, tf.float64), tf.cast(lq, tf.float64)], 0)

        out["tfp.stats.percentile (value+log)"] = lambda x: tfp_percentiles(x).numpy()

    graph = tf.function(lambda x: stats.tensor_stats(x, "output"))
    xla = tf.function(lambda x: stats.tensor_stats(x, "output"), jit_compile=True)
    out["tb_introspect tf.function"] = lambda x: graph(x).numpy()
    out["tb_introspect jit_compile (XLA)"] = lambda x: xla(x).numpy()
    out["tb_introspect numpy twin"] = lambda x: stats_np.tensor_stats(x.numpy(), "output")
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 100_000, 4_000_000])
    ap.add_argument("--kinds", nargs="+", default=["normal", "relu"])
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args(argv)

    rng = np.random.default_rng(0)
    fns = variants()
    base = next((k for k in fns if k.startswith("tfp")), None)
    print(
        f"# tb_introspect stats benchmark: TF {tf.__version__},"
        f" {platform.processor() or platform.machine()},"
        f" {os.cpu_count()} CPUs, sample_size={stats.DEFAULT_SAMPLE_SIZE}, median of {args.repeats}"
    )
    print()
    print("| elements | data | variant | median ms | speed-up vs tfp |")
    print("|---:|---|---|---:|---:|")
    for kind in args.kinds:
        for n in args.sizes:
            x = tf.constant(make_data(kind, n, rng))
            times: dict[str, list[float]] = {k: [] for k in fns}
            for fn in fns.values():  # warm-up: tracing and compilation
                fn(x)
            for _ in range(args.repeats):
                for name, fn in fns.items():
                    t0 = time.perf_counter()
                    fn(x)
                    times[name].append(time.perf_counter() - t0)
            med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
            for name, ms in med.items():
                speed = f"{med[base] / ms:.1f}x" if base else "-"
                print(f"| {n:,} | {kind} | {name} | {ms:.1f} | {speed} |", flush=True)


if __name__ == "__main__":
    main()
