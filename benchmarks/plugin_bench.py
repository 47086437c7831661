"""Time the Introspect plugin's routes through real TensorBoard processes.

Writes one run with N monitored tensors x 4 views x S steps (numpy path, no
TensorFlow), starts ``tensorboard`` with each loader (``--load_fast=false`` /
``true``), waits until every point is loaded, then times each route over HTTP:
the first (cold) call and the median of warm repeats. Prints a Markdown table.

Then, for the first opening of a run after a data change, it appends one
point to the run (a new event file), waits until TensorBoard lists it, and
times the routes of the tab's first screen in order (``./run``, which reads
the run's sample in bounded calls, then ``./overview``, and one tag at full
resolution, as after a drag-zoom); medians over --cold repeats. Reports the
TensorBoard process tree's RSS against the event files' bytes.

    python benchmarks/plugin_bench.py                 # 200 tensors x 4 views x 1,000 steps
    python benchmarks/plugin_bench.py --tensors 20 --steps 100 --loaders true
    python benchmarks/plugin_bench.py --preset 5m     # 195 x 4 x 6,400 = 5M points
    python benchmarks/plugin_bench.py --format-version 2   # a run without view summaries
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))  # the tests package: reuse its process helpers

from tb_introspect import metadata, slots, summary_pb  # noqa: E402
from tb_introspect.plugin.introspect_plugin import LISTING_TTL_S  # noqa: E402
from tb_introspect.writer import NumpyWriter  # noqa: E402
from tests.plugin.plugin_testlib import fetch, get_json, tensorboard, wait_for  # noqa: E402

TARGETS_MS = {"runs": 100, "series (1 tag)": 50, "overview": 300,
              "after a data change: run + overview": 1500,
              "after a data change: 1 tag, full resolution": 300}
#: ResNet50's 781 tags over the four views, 6,400 points each.
PRESETS = {"5m": (195, 6400)}


def _tensor(vec: np.ndarray) -> tensor_pb2.TensorProto:
    # Built directly (not make_tensor_proto): writing 800k points must take seconds.
    return tensor_pb2.TensorProto(
        dtype=types_pb2.DT_DOUBLE,
        tensor_shape=tensor_shape_pb2.TensorShapeProto(
            dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=vec.size)]
        ),
        tensor_content=vec.astype("<f8").tobytes(),
    )


def _crc32c_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(0x82F63B78), table >> 1)
    return table.astype(np.uint32)


_TABLE = _crc32c_table()


def masked_crc32c_rows(rows: np.ndarray) -> np.ndarray:
    """Masked CRC-32C (TFRecord framing) of every row of a uint8 matrix, vectorised.

    TensorBoard's own record writer computes CRCs in pure Python (about 1 MB/s);
    running the table loop across thousands of equally long records at once is
    what makes writing the 280 MB benchmark run take seconds, not minutes.
    """
    crc = np.full(rows.shape[0], 0xFFFFFFFF, dtype=np.uint32)
    for i in range(rows.shape[1]):
        crc = _TABLE[(crc ^ rows[:, i]) & 0xFF] ^ (crc >> 8)
    crc ^= np.uint32(0xFFFFFFFF)
    masked = ((crc >> 15) | (crc << 17)).astype(np.uint64) + 0xA282EAD8
    return (masked & 0xFFFFFFFF).astype(np.uint32)


def write_records(f, records: list[bytes]) -> None:
    """Append TFRecord-framed ``records`` (in order) to the open file ``f``."""
    n = len(records)
    lengths = np.array([len(r) for r in records], dtype=np.uint64)
    headers = lengths.astype("<u8").view(np.uint8).reshape(n, 8)
    header_crc = masked_crc32c_rows(headers)
    data_crc = np.zeros(n, dtype=np.uint32)
    for length in np.unique(lengths):  # equal lengths share one vectorised pass
        idx = np.flatnonzero(lengths == length)
        rows = np.frombuffer(b"".join(records[i] for i in idx), dtype=np.uint8)
        data_crc[idx] = masked_crc32c_rows(rows.reshape(len(idx), int(length)))
    hc, dc = header_crc.astype("<u4"), data_crc.astype("<u4")
    f.write(b"".join(
        headers[i].tobytes() + hc[i].tobytes() + records[i] + dc[i].tobytes() for i in range(n)
    ))


def _as_version(meta: summary_pb2.SummaryMetadata, version: int) -> summary_pb2.SummaryMetadata:
    """``meta`` with its PluginData's format version set to ``version``."""
    data = metadata.parse_plugin_data(meta.plugin_data.content)
    data.version = version
    meta.plugin_data.content = data.SerializeToString()
    return meta


def write_bench_run(run_dir: str, tensors: int, steps: int, steps_per_epoch: int = 100,
                    format_version: int = metadata.PROTO_VERSION) -> int:
    """Write the benchmark run, one event per tag and step as tf.summary does; returns points.

    ``format_version`` 3 and later add each view's VIEW_SUMMARY at every step, as the
    package's writers do; 2 writes the run without them (its metadata saying version 2).
    The run has no probes (no attention layer, no head), so 4 differs from 3 in its version only.
    """
    if format_version not in (2, 3, 4):
        raise ValueError(f"format_version {format_version}: 2, 3 or 4")
    os.makedirs(run_dir, exist_ok=True)
    rng = np.random.default_rng(0)
    layers = [f"layer_{i:03d}" for i in range(tensors)]
    tags, metas = {}, {}
    for view in slots.VIEWS:
        for depth, layer in enumerate(layers):
            tags[(view, layer)] = metadata.stats_tag(view, f"{layer}/kernel")
            metas[(view, layer)] = _as_version(metadata.create_tensor_stats_metadata(
                view=view, name=f"{layer}/kernel", layer=layer, depth=depth, shape=(64, 64)),
                format_version)
    loss_meta = _as_version(metadata.create_metric_metadata("loss"), format_version)
    summaries = summary_pb.ViewSummaries()
    widths = {v: len(slots.tensor_stats_fields(v)) for v in slots.VIEWS}
    cols = {f: i for i, f in enumerate(slots.tensor_stats_fields("variable"))}
    # A healthy tensor of 4,096 values: no NaN/Inf; the other slots stay random in [0, 1].
    fixed = {"count": 4096, "finite_count": 4096, "nan_count": 0, "posinf_count": 0,
             "neginf_count": 0}
    scale = 10.0 ** -np.linspace(0, 4, tensors)  # orders of magnitude across depth
    path = os.path.join(run_dir, f"events.out.tfevents.{int(time.time())}.bench")
    points = 0
    with open(path, "wb") as f:
        write_records(f, [event_pb2.Event(wall_time=time.time(),
                                          file_version="brain.Event:2").SerializeToString()])
        batch: list[bytes] = []
        for step in range(steps):
            epoch = step // steps_per_epoch
            wall = 1e9 + step
            for view in slots.VIEWS:
                block = rng.uniform(0, 1, size=(tensors, widths[view]))
                for name, value in fixed.items():
                    block[:, cols[name]] = value
                block[:, cols["epoch"]] = epoch
                block[:, cols["rms"]] = scale * (1 + 0.1 * rng.standard_normal(tensors))
                for i, layer in enumerate(layers):
                    value = summary_pb2.Summary.Value(tag=tags[(view, layer)],
                                                      tensor=_tensor(block[i]))
                    if step == 0:  # metadata on a tag's first point is enough for both loaders
                        value.metadata.CopyFrom(metas[(view, layer)])
                    batch.append(event_pb2.Event(step=step, wall_time=wall, summary=summary_pb2
                                                 .Summary(value=[value])).SerializeToString())
                    points += 1
                if format_version >= 3:
                    value = summaries.summary(view, [tags[(view, la)] for la in layers], block)
                    batch.append(event_pb2.Event(step=step, wall_time=wall, summary=summary_pb
                                                 .encode([value])).SerializeToString())
            loss = summary_pb2.Summary.Value(tag=metadata.metric_tag("loss"),
                                             tensor=_tensor(np.array([epoch, 2.0 / (1 + step)])))
            if step == 0:
                loss.metadata.CopyFrom(loss_meta)
            batch.append(event_pb2.Event(step=step, wall_time=wall, summary=summary_pb2.Summary(
                value=[loss])).SerializeToString())
            if (step + 1) % steps_per_epoch == 0:
                band = summary_pb.metric_epoch_pb(
                    "loss", 2.0 / (1 + np.arange(step + 1 - steps_per_epoch, step + 1)), epoch)
                _as_version(band.value[0].metadata, format_version)
                batch.append(event_pb2.Event(step=step, wall_time=wall,
                                             summary=band).SerializeToString())
            if len(batch) >= 50_000 or step == steps - 1:
                write_records(f, batch)
                batch = []
    return points


def touch_run(run_dir: str, step: int) -> None:
    """Append one loss point at ``step`` (a new event file): the run's fingerprint changes."""
    writer = NumpyWriter(run_dir, filename_suffix=".touch")
    writer.add_summary(summary_pb.metric_pb("loss", 0.5, 0), step, wall_time=1e9 + step)
    writer.close()


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and its descendants (the Rust data server is a child)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(name))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo += children.get(p, [])
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


def time_cold(tb, run_dir: str, steps: int, tag: str, repeats: int) -> list:
    """Medians of the first-screen routes, each first call after a data change."""
    times: dict[str, list[float]] = {"run": [], "overview": [], "findings": [], "full": []}
    for _ in range(repeats):
        step = max(steps, get_json(tb.url("runs"))["runs"][0]["max_step"] + 1)
        touch_run(run_dir, step)
        wait_for(lambda s=step: get_json(tb.url("runs"))["runs"][0]["max_step"] >= s,
                 timeout=600, interval=0.2)
        time.sleep(LISTING_TTL_S + 0.1)  # a listing from before the point is not reused
        # The tab's order: the first screen, then the findings (read from every tensor's tag
        # when the overview came from view summaries, else already in the overview).
        for key, route in (("run", "run?run=bench"), ("overview", "overview?run=bench"),
                           ("findings", "findings?run=bench"),
                           ("full", f"series?run=bench&tag={tag}")):
            t = time.perf_counter()
            status, _, body = fetch(tb.url(route), gzip_ok=True, keep_compressed=True,
                                    timeout=1800)
            assert status == 200, (route, status, body[:200])
            times[key].append((time.perf_counter() - t) * 1000)
    med = {k: statistics.median(v) for k, v in times.items()}
    nan = float("nan")
    return [
        ("after a data change: run (bounded sampled read)", med["run"], nan, nan, 0),
        ("after a data change: overview (from that read)", med["overview"], nan, nan, 0),
        ("after a data change: run + overview", med["run"] + med["overview"], nan, nan, 0),
        ("after a data change: then findings", med["findings"], nan, nan, 0),
        ("after a data change: 1 tag, full resolution", med["full"], nan, nan, 0),
    ]


def time_route(url: str, repeats: int, isolated: int) -> tuple[float, float, float, int]:
    """(first call, warm median, isolated median) in ms, and the gzip body size.

    "warm": calls back to back, as the frontend's bursts make them; "isolated":
    each call after the plugin's tag-listing reuse window has passed, so every
    call pays the data provider's listing round trip again.
    """
    def once() -> tuple[float, int]:
        t = time.perf_counter()
        status, _, body = fetch(url, gzip_ok=True, keep_compressed=True, timeout=1800)
        elapsed = (time.perf_counter() - t) * 1000
        assert status == 200, (url, status, body[:200])
        return elapsed, len(body)

    first, size = once()
    warm = [once()[0] for _ in range(repeats)]
    spaced = []
    for _ in range(isolated):
        time.sleep(LISTING_TTL_S + 0.1)
        spaced.append(once()[0])
    nan = float("nan")
    return (first, statistics.median(warm) if warm else nan,
            statistics.median(spaced) if spaced else nan, size)


def bench_loader(
    logdir: str, load_fast: str, tensors: int, steps: int, repeats: int, isolated: int,
    cold: int = 3, poll: float = 2.0,
) -> list:
    rows = []
    t0 = time.perf_counter()
    run_dir = os.path.join(logdir, "bench")
    with tensorboard("--logdir", logdir, load_fast=load_fast, timeout=600) as tb:
        def loaded():
            runs = get_json(tb.url("runs"))["runs"]
            return runs and runs[0]["max_step"] >= steps - 1 and \
                sum(runs[0]["views"].values()) == 4 * tensors

        wait_for(loaded, timeout=3600, interval=poll)
        # TensorBoard may still be ingesting the last points of some tags.
        read_ms: list[float] = []

        def complete():
            # Each call after new points reads the run's sample (slow on a busy machine).
            t = time.perf_counter()
            doc = get_json(tb.url("run?run=bench"), timeout=1800)
            read_ms.append((time.perf_counter() - t) * 1000)
            # num_points is null past the sample's 1,000 points; the last step is exact.
            return all(t["last_step"] == steps - 1 and t["num_points"] in (None, steps)
                       for v in doc["views"].values() for t in v)

        wait_for(complete, timeout=3600, interval=poll)
        load_s = time.perf_counter() - t0
        tag = metadata.stats_tag("gradient", "layer_100/kernel" if tensors > 100
                                 else "layer_000/kernel")
        routes = [
            ("runs", "runs"),
            ("run (contents)", "run?run=bench"),
            ("series (1 tag)", f"series?run=bench&tag={tag}"),
            ("series (1 tag, rms only)", f"series?run=bench&tag={tag}&field=rms"),
            ("overview", "overview?run=bench"),
        ]
        # The loading checks above read the run in full (the last of them timed in
        # read_ms); a new max_points value re-renders the overview from that cached read.
        rerender = time_route(tb.url("overview?run=bench&max_points=1999"), 0, 0)
        for label, route in routes:
            rows.append((load_fast, label, *time_route(tb.url(route), repeats, isolated)))
        nan = float("nan")
        rows.append((load_fast, "run, first read of the run's sample", read_ms[-1], nan, nan, 0))
        rows.append((load_fast, "overview, re-rendered from the cached read", *rerender))
        if cold:
            rows += [(load_fast, *r) for r in time_cold(tb, run_dir, steps, tag, cold)]
        rss = tree_rss_bytes(tb.proc.pid)
        files = sum(os.path.getsize(os.path.join(run_dir, f)) for f in os.listdir(run_dir))
        rows.append((load_fast, f"TensorBoard RSS {rss / 2**30:.2f} GiB for "
                     f"{files / 2**30:.2f} GiB of event files ({rss / files:.1f}x)",
                     nan, nan, nan, 0))
        print(f"[load_fast={load_fast}] TensorBoard start + full load: {load_s:.1f} s",
              file=sys.stderr)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=200, help="monitored tensors per view")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=15, help="warm repeats per route")
    parser.add_argument("--isolated", type=int, default=5,
                        help="repeats per route spaced past the listing reuse window")
    parser.add_argument("--loaders", default="false,true", help="--load_fast values to test")
    parser.add_argument("--cold", type=int, default=3,
                        help="repeats of the first-screen routes after a data change")
    parser.add_argument("--preset", choices=sorted(PRESETS),
                        help="5m: 195 tensors x 4 views x 6,400 steps (sets --tensors/--steps)")
    parser.add_argument("--logdir", help="reuse/keep this logdir (default: a temporary one)")
    parser.add_argument("--format-version", type=int, choices=(2, 3, 4),
                        default=metadata.PROTO_VERSION,
                        help="3: with the view summaries (default); 2: without them")
    parser.add_argument("--poll", type=float, default=2.0,
                        help="seconds between checks while TensorBoard loads the run (each"
                             " check reads the run's sample)")
    args = parser.parse_args(argv)
    if args.preset:
        args.tensors, args.steps = PRESETS[args.preset]

    logdir = args.logdir or tempfile.mkdtemp(prefix="introspect-bench-")
    run_dir = os.path.join(logdir, "bench")
    try:
        if not os.path.isdir(run_dir):
            t = time.perf_counter()
            points = write_bench_run(run_dir, args.tensors, args.steps,
                                     format_version=args.format_version)
            size = sum(os.path.getsize(os.path.join(run_dir, f)) for f in os.listdir(run_dir))
            print(f"wrote {points:,} points ({size / 2**20:.0f} MiB) in "
                  f"{time.perf_counter() - t:.1f} s", file=sys.stderr)
        rows = []
        for load_fast in args.loaders.split(","):
            rows += bench_loader(logdir, load_fast, args.tensors, args.steps, args.repeats,
                                 args.isolated, args.cold, args.poll)
    finally:
        if not args.logdir:
            shutil.rmtree(logdir, ignore_errors=True)

    print(f"\n{args.tensors} tensors x 4 views x {args.steps} steps, format version "
          f"{args.format_version}; medians of "
          f"{args.repeats} back-to-back and {args.isolated} isolated calls over HTTP\n")
    print("| loader | route | first call (ms) | warm median (ms) | isolated median (ms) |"
          " target (ms) | gzip size |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for load_fast, label, first, warm, spaced, size in rows:
        loader = "Rust" if load_fast == "true" else "Python"
        cells = [f"{v:.1f}" if v == v else "—" for v in (first, warm, spaced)]
        kib = f"{size / 1024:,.0f} KiB" if size else "—"
        print(f"| {loader} | {label} | {' | '.join(cells)} | {TARGETS_MS.get(label, '')} |"
              f" {kib} |")


if __name__ == "__main__":
    main()
