"""Time the aligned (tensor x step) matrices of one view, the overview's and the rules' input.

``read.series.Aligned.raws`` builds the matrices of several fields in one pass over each
tensor's points; building them a field at a time (``raw`` per field) re-reads every
tensor's whole row block once per field. Both are timed side by side, interleaved, on a
synthetic view (numpy only), and the median and the ratio are printed, with
``overview.view_overview`` (which uses ``raws``) for scale.

    python benchmarks/align_bench.py                     # 300 tensors x 2,000 steps
    python benchmarks/align_bench.py --tensors 100 --steps 500 --repeats 9
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from tb_introspect import slots
from tb_introspect.plugin import overview
from tb_introspect.read.series import Series, TagInfo, align

FIELDS = ("rms", "epoch", *slots.ACTIVITY_FIELDS, *slots.NONFINITE_FIELDS)


def synthetic_view(tensors: int, steps: int) -> list[Series]:
    """``tensors`` gradient series; every tenth one logged at every other step only."""
    rng = np.random.default_rng(0)
    fields = slots.tensor_stats_fields("gradient")
    out = []
    for i in range(tensors):
        at = np.arange(1, steps + 1) if i % 10 else np.arange(1, steps + 1, 2)
        info = TagInfo(tag=f"g{i}", kind="tensor_stats", version=1, name=f"g{i}",
                       fields=fields, view="gradient", layer=f"l{i // 2}", depth=i // 2)
        out.append(Series(info, at, np.zeros(len(at)), rng.random((len(at), len(fields)))))
    return out


def one_pass(series: list[Series]) -> None:
    align("gradient", series).raws(FIELDS)


def per_field(series: list[Series]) -> None:
    a = align("gradient", series)
    for name in FIELDS:
        a.raw(name)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=300)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    series = synthetic_view(args.tensors, args.steps)
    times: dict[str, list[float]] = {"raws (one pass)": [], "raw per field": [],
                                     "view_overview": []}
    jobs = [("raws (one pass)", one_pass), ("raw per field", per_field),
            ("view_overview", overview.view_overview)]
    for r in range(args.repeats):
        for name, job in jobs if r % 2 else jobs[::-1]:  # interleaved, alternating order
            start = time.perf_counter()
            job(series)
            times[name].append(time.perf_counter() - start)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{args.tensors} tensors x {args.steps} steps, {len(FIELDS)} fields,"
          f" median of {args.repeats} interleaved runs:")
    for name, t in med.items():
        print(f"  {name:<16} {1e3 * t:8.1f} ms")
    print(f"  per field / one pass: {med['raw per field'] / med['raws (one pass)']:.2f}x")


if __name__ == "__main__":
    main()
