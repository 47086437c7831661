"""What a run written straight to a bucket costs: uploads, bytes, and the first screen.

A real S3 server on 127.0.0.1 (moto's server mode, the test extra). Two measurements:

1. **Uploads while training.** The PyTorch ``Introspector`` (all four views, the reference
   CNN of ``torch_overhead.py`` narrowed to 8/16/32 channels, batch 32, ``--step-ms`` of
   sleep per step standing in for a slower step) trains into ``s3://`` and, once more, into a
   local folder. Every request the writer sends is counted by a botocore hook (the probe,
   the puts). Reported: objects put, requests per epoch, bytes put per logged point, and the
   bucket's bytes against the local event file's (what an object store's "append" by
   re-upload would cost is the sum of every flush's file size, also shown).
2. **The first screen of a rolled run.** The same records in one object and in ``--objects``
   objects; a TensorBoard without TensorFlow on each bucket prefix: seconds until the run
   list shows the last step (every object read once) and the ``./overview`` answer time.

    python benchmarks/bucket_bench.py                 # the figures of docs/benchmarks.md
    python benchmarks/bucket_bench.py --quick         # a fast smoke run
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.remote.s3_support import keys, s3_server  # noqa: E402

BUCKET = "bench"


class Requests:
    """Counts the S3 requests of every boto3 client made after it (one botocore hook)."""

    def __init__(self) -> None:
        import boto3

        boto3.setup_default_session()
        self.calls: dict[str, int] = {}
        self.bytes = 0
        events = boto3.DEFAULT_SESSION.events
        events.register("before-call.s3", self._count)
        events.register("before-parameter-build.s3.PutObject", self._body)

    def _count(self, model, **_) -> None:
        self.calls[model.name] = self.calls.get(model.name, 0) + 1

    def _body(self, params, **_) -> None:
        self.bytes += len(params["Body"])

    def total(self) -> int:
        return sum(self.calls.values())


def train(log_dir: str, epochs: int, steps: int, step_ms: float, every, flush: float) -> int:
    """The narrowed reference CNN for ``epochs`` x ``steps``; the points logged."""
    import torch
    from torch import nn

    from tb_introspect.torch import Introspector

    torch.manual_seed(0)
    layers: list[nn.Module] = []
    c_in = 3
    for c in (8, 16, 32):
        layers += [nn.Conv2d(c_in, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(),
                   nn.MaxPool2d(2)]
        c_in = c
    model = nn.Sequential(*layers, nn.Flatten(), nn.Linear(32 * 4 * 4, 32), nn.ReLU(),
                          nn.Linear(32, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
    with Introspector(log_dir, model, opt, every=every, flush_secs=flush) as intro:
        for _ in range(epochs):
            for _ in range(steps):
                loss = nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                intro.step(loss=loss)
                time.sleep(step_ms / 1000)
            intro.end_epoch()
    return epochs if every == "epoch" else epochs * steps // every


def uploads(args, client) -> list[str]:
    rows = ["| cadence | epoch (s) | flush_secs | points | objects | requests/epoch |"
            " bytes/point | bucket bytes | local file bytes | re-upload bytes |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for every in args.every:
        every = every if every == "epoch" else int(every)
        counter = Requests()
        prefix = f"train/{every}"
        t0 = time.monotonic()
        points = train(f"s3://{BUCKET}/{prefix}", args.epochs, args.steps, args.step_ms, every,
                       args.flush)
        epoch_s = (time.monotonic() - t0) / args.epochs
        names = keys(client, BUCKET, prefix + "/")
        sizes = [client.head_object(Bucket=BUCKET, Key=k)["ContentLength"] for k in names]
        with tempfile.TemporaryDirectory() as local:
            train(local, args.epochs, args.steps, 0, every, args.flush)
            local_bytes = sum(p.stat().st_size for p in Path(local).iterdir())
        # A writer that re-uploads its one growing file at each upload puts every prefix.
        reupload = sum(sum(sizes[:i + 1]) - 40 * i for i in range(len(sizes)))
        rows.append(
            f"| {every} | {epoch_s:.1f} | {args.flush:g} | {points} | {len(names)} |"
            f" {counter.total() / args.epochs:.1f} | {counter.bytes / points:,.0f} |"
            f" {sum(sizes):,} | {local_bytes:,} | {reupload:,} |")
    return rows


def first_screen(args, client) -> list[str]:
    from tensorboard.compat.proto import summary_pb2

    from tb_introspect import summary_pb
    from tb_introspect.writer import NumpyWriter, tensor_stats_pb_from_array
    from tests.browser.browser_support import tensorboard

    rng = np.random.default_rng(0)
    # One step's statistics (every step the same: what is timed is reading, not the values).
    stats = summary_pb2.Summary()
    for t in range(args.tensors):
        stats.value.extend(tensor_stats_pb_from_array(
            rng.normal(size=(16, 16)), view="gradient", name=f"layer{t}/kernel",
            layer=f"layer{t}", depth=t).value)
    rows = ["| objects | bytes | TensorBoard start to the run listed at its last step (s) |"
            " ./overview (ms) |", "|---|---|---|---|"]
    for objects in (1, args.objects):
        prefix = f"screen{objects}/run"
        # One object per flush (no interval); one flush in all for the single object.
        writer = NumpyWriter(f"s3://{BUCKET}/{prefix}", flush_secs=0.0)
        roller = writer._sink._roller
        every = max(args.points // objects, 1)
        for step in range(1, args.points + 1):
            writer.add_summary(stats, step)
            writer.add_summary(summary_pb.metric_pb("loss", 1.0 / step), step)
            if objects > 1 and step % every == 0 and step < args.points:
                put = roller.objects
                writer.flush()
                while roller.objects == put:  # the thread put it
                    time.sleep(0.002)
        writer.close()
        names = keys(client, BUCKET, prefix + "/")
        size = sum(client.head_object(Bucket=BUCKET, Key=k)["ContentLength"] for k in names)
        t0 = time.monotonic()
        with tensorboard(f"s3://{BUCKET}/screen{objects}", wait_runs=1) as tb:
            while tb.get_json("runs")["runs"][0]["max_step"] != args.points:
                if time.monotonic() - t0 > 600:
                    raise TimeoutError(f"{prefix}: not read in 10 minutes")
                time.sleep(0.05)
            listed = time.monotonic() - t0
            t1 = time.monotonic()
            tb.get_json("overview?run=run")
            overview_ms = (time.monotonic() - t1) * 1000
        rows.append(f"| {len(names)} | {size:,} | {listed:.1f} | {overview_ms:.0f} |")
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=100, help="steps per epoch")
    parser.add_argument("--step-ms", type=float, default=50.0, help="sleep per step (ms)")
    parser.add_argument("--flush", type=float, default=5.0, help="flush_secs")
    parser.add_argument("--every", nargs="+", default=["epoch", "25"])
    parser.add_argument("--objects", type=int, default=200, help="objects of the rolled run")
    parser.add_argument("--points", type=int, default=400)
    parser.add_argument("--tensors", type=int, default=20)
    parser.add_argument("--only", choices=("uploads", "screen"), help="one measurement")
    parser.add_argument("--quick", action="store_true", help="a fast smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.epochs, args.steps, args.step_ms, args.flush = 2, 5, 0.0, 0.05
        args.objects, args.points, args.tensors, args.every = 5, 10, 2, ["epoch", "5"]
    with s3_server() as s3:
        client = s3.client()
        client.create_bucket(Bucket=BUCKET)
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        if args.only != "screen":
            print("\n".join(uploads(args, client)), flush=True)
            print()
        if args.only != "uploads":
            print("\n".join(first_screen(args, client)), flush=True)


if __name__ == "__main__":
    main()
