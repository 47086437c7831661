"""Time the statistics the training path computes against tfp.stats.percentile.

Usage: python benchmarks/stats_bench.py [--sizes 1000 100000 4000000] [--repeats 15]
       python benchmarks/stats_bench.py --numpy-only  # the numpy twin's table alone

For each tensor size and data kind, the variants run interleaved in one process
(one call of each per round, after a warm-up call) and the table shows median
wall times. The variants are what training runs, with the callback's default
sample sizes:

* **step**: what a statistics step pays for one layer output, its state
  (``kernels.activation_parts_fn``, i.e. ``stats.batch_state``, with a
  ``step_sample_size`` sample) folded into an accumulator (``stats.merge_pair``);
* **activity step**: what every other step pays for a rectifier output
  (``stats.activity_state``);
* **output point**: the logged point of that output: its accumulated state copied to the
  host and finalized there by the numpy twin (``stats.finalize_rows``);
* **tensor_stats**: the summary op, one tensor's state finalized with a 2^18 sample.

A second table times the numpy twin's exact statistics of one tensor
(``stats_np.tensor_stats``, what a logged point computes for each weight and gradient sum,
in Keras as in PyTorch)
with its percentiles from sorts and from ``np.partition``: which is the faster depends on the
CPU, and ``stats_np`` times both once per process to choose (``stats_np.quantiles.PARTITION``).

The baseline computes only the same percentiles (9 value percentiles of the finite
values and 9 percentiles of log10|x| of the finite non-zero values) with
``tfp.stats.percentile``, i.e. full sorts; every variant computes every statistic of
``docs/statistics.md`` (the step variants: the state they are computed from).
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

from tb_introspect import slots, stats  # noqa: E402
from tb_introspect.keras import kernels  # noqa: E402
from tb_introspect.pipeline import options  # noqa: E402

Q = tuple(slots.DEFAULT_QUANTILES)
STEP_K = options.DEFAULT_STEP_SAMPLE_SIZE
LOG_K = options.DEFAULT_LOG_SAMPLE_SIZE
CHANNELS = 32


def make_data(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "normal":
        return rng.normal(size=n).astype(np.float32)
    if kind == "relu":  # 80% exact zeros, like a sparse ReLU output
        x = np.abs(rng.normal(size=n)).astype(np.float32)
        x[rng.random(n) < 0.8] = 0.0
        return x
    raise ValueError(kind)


def tfp_variant():
    try:
        import tensorflow_probability as tfp
    except Exception as e:  # noqa: BLE001 - optional dependency, any import failure
        print(f"(tensorflow-probability not importable: {e}; no baseline)", file=sys.stderr)
        return None

    @tf.function
    def tfp_percentiles(x):
        flat = tf.reshape(x, [-1])
        finite = tf.boolean_mask(flat, tf.math.is_finite(flat))
        mags = tf.abs(tf.boolean_mask(finite, tf.not_equal(finite, 0)))
        vq = tfp.stats.percentile(finite, Q, interpolation="linear")
        lq = tfp.stats.percentile(tf.math.log(mags) / np.log(10.0), Q, interpolation="linear")
        return tf.concat([tf.cast(vq, tf.float64), tf.cast(lq, tf.float64)], 0)

    return lambda x: tfp_percentiles(x).numpy()


def variants(n: int) -> dict:
    """The training path's variants for a tensor of ``n`` elements (a [B, P, C] output)."""
    out = {}
    tfp = tfp_variant()
    if tfp is not None:
        out["tfp.stats.percentile (value+log)"] = tfp
    positions = max(n // (64 * CHANNELS), 1)
    seed = tf.constant([1, 2], tf.int64)
    parts = kernels.activation_parts_fn(3, "float32", STEP_K, False)
    activity = tf.function(stats.activity_state, autograph=False)

    def canonical(x):
        return tf.reshape(x, [-1, positions, CHANNELS])

    @tf.function
    def step(x, acc):
        new = {k: v[tf.newaxis] for k, v in parts(canonical(x), seed).items()}
        return stats.merge_pair(acc, new)

    @tf.function
    def activity_step(x):
        return activity(canonical(x))["channel_nnz"]

    def output_point(acc):
        return stats.finalize_rows({k: v.numpy() for k, v in acc.items()}, "output",
                                   quantiles=Q)

    @tf.function
    def one_tensor(x):
        return stats.tensor_stats(x, "output")

    empty = stats.empty_state([None, positions, CHANNELS], sample_size=STEP_K)
    acc = {k: v[tf.newaxis] for k, v in empty.items()}
    box = {}

    def run_step(x):
        box["acc"] = step(x, acc)
        return box["acc"]["count"].numpy()

    out["step: batch_state + merge"] = run_step
    out["activity step: activity_state"] = lambda x: activity_step(x).numpy()
    out["output point: finalize"] = lambda x: output_point(box.get("acc") or step(x, acc))
    out["tensor_stats (summary op)"] = lambda x: one_tensor(x).numpy()
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 4_000_000])
    ap.add_argument("--kinds", nargs="+", default=["normal", "relu"])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--numpy-only", action="store_true",
                    help="only the numpy twin's table (sort against partition)")
    args = ap.parse_args(argv)

    rng = np.random.default_rng(0)
    if args.numpy_only:
        numpy_rows(args.repeats, rng)
        return
    print(
        f"# tb_introspect stats benchmark: TF {tf.__version__},"
        f" {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs,"
        f" step_sample_size={STEP_K}, sample_size={LOG_K}, median of {args.repeats}"
    )
    print()
    print("| elements | data | variant | median ms | speed-up vs tfp |")
    print("|---:|---|---|---:|---:|")
    for n in args.sizes:
        n = max(n // (64 * CHANNELS), 1) * 64 * CHANNELS  # whole [64, P, 32] batches
        fns = variants(n)
        base = next((k for k in fns if k.startswith("tfp")), None)
        for kind in args.kinds:
            x = tf.constant(make_data(kind, n, rng))
            times: dict[str, list[float]] = {k: [] for k in fns}
            for fn in fns.values():  # warm-up: tracing
                fn(x)
            for _ in range(args.repeats):
                for name, fn in fns.items():
                    t0 = time.perf_counter()
                    fn(x)
                    times[name].append(time.perf_counter() - t0)
            med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
            for name, ms in med.items():
                speed = f"{med[base] / ms:.1f}x" if base else "-"
                print(f"| {n:,} | {kind} | {name} | {ms:.2f} | {speed} |", flush=True)
    numpy_rows(args.repeats, rng)


def numpy_rows(repeats: int, rng: np.random.Generator) -> None:
    """``stats_np.tensor_stats`` of one tensor, percentiles by sort or by partition."""
    from tb_introspect import stats_np

    threshold = stats_np.quantiles.PARTITION_FROM
    chosen = stats_np.quantiles.partition_wins()
    print(f"\n(this CPU: arrays of {stats_np.quantiles.PARTITION_FROM:,} values or more are"
          f" {'partitioned' if chosen else 'sorted'})")
    print("\n| elements | numpy twin, exact | sort ms | partition ms |")
    print("|---:|---|---:|---:|")
    try:
        for n in (10**4, 2**16, 2**18):
            x = rng.normal(size=n).astype(np.float32)
            times: dict[str, list[float]] = {"sort": [], "partition": []}
            for _ in range(max(repeats, 3)):
                for way in times:
                    stats_np.quantiles.PARTITION = way == "partition"
                    stats_np.quantiles.PARTITION_FROM = 0
                    t0 = time.perf_counter()
                    stats_np.tensor_stats(x, "gradient", sample_size=None)
                    times[way].append(time.perf_counter() - t0)
            med = {w: float(np.median(v)) * 1e3 for w, v in times.items()}
            print(f"| {n:,} | `tensor_stats` | {med['sort']:.2f} | {med['partition']:.2f} |",
                  flush=True)
    finally:
        stats_np.quantiles.PARTITION, stats_np.quantiles.PARTITION_FROM = chosen, threshold
    magnitude_rows(repeats, rng)


def magnitude_rows(repeats: int, rng: np.random.Generator) -> None:
    """The log10|x| order statistics of a group of sorted rows of one width (a point's
    samples): sorted again by magnitude, or found by ``_Magnitudes``' binary search; the
    smaller groups are sorted (``stats_np.quantiles.SORT_MAGNITUDES_UP_TO``)."""
    from tb_introspect import stats_np

    bound = stats_np.quantiles.SORT_MAGNITUDES_UP_TO
    p = np.asarray(Q) / 100.0
    print(f"\n(groups of at most {bound:,} values are sorted by magnitude)")
    print("\n| rows x width | sort ms | binary search ms |")
    print("|---:|---:|---:|")
    try:
        for rows, width in ((8, 256), (12, 2048), (32, 2048), (2, 16384), (6, 16384),
                            (2, 65536)):
            samples = [rng.normal(size=width) for _ in range(rows)]
            at = np.repeat(p[None, :] * (width - 1), rows, 0)
            magnitudes = stats_np.Sorted(samples).magnitudes()
            times: dict[str, list[float]] = {"sort": [], "search": []}
            for _ in range(max(repeats, 3)):
                for way in times:
                    stats_np.quantiles.SORT_MAGNITUDES_UP_TO = 2**62 if way == "sort" else 0
                    t0 = time.perf_counter()
                    magnitudes.select(at, np.log10)
                    times[way].append(time.perf_counter() - t0)
            med = {w: float(np.median(v)) * 1e3 for w, v in times.items()}
            print(f"| {rows} x {width:,} | {med['sort']:.3f} | {med['search']:.3f} |",
                  flush=True)
    finally:
        stats_np.quantiles.SORT_MAGNITUDES_UP_TO = bound


if __name__ == "__main__":
    main()
