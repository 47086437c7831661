"""Event-file bytes per logged point, without and with the view summaries (format 3).

Writes real runs and reads their event files back: a Keras training of the CIFAR-shaped
CNN (``overhead.py``'s ``cnn``, the ``Introspect`` callback), the same CNN in PyTorch
(``torch_overhead.py``'s reference CNN, ``Introspector``) and the plugin benchmark's
generated run (``plugin_bench.write_bench_run``, 195 tensors per view). A training run's
"without" figure is its event files less the VIEW_SUMMARY values (the per-tensor values
are the same either way); the generated run is written at format versions 2 and 3. Prints
a Markdown table; the target is at most 10 % more bytes per point.

    python benchmarks/format_bytes.py
    python benchmarks/format_bytes.py --steps 16 --bench-steps 5 --keras-model flatten  # smoke
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from tensorboard.backend.event_processing import event_file_loader  # noqa: E402
from tensorboard.compat.proto import event_pb2  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from tb_introspect import metadata  # noqa: E402

TARGET = 1.10
#: TFRecord framing around each event: length (8), its CRC (4), the data's CRC (4).
FRAMING = 16
SUMMARY_PREFIX = metadata.summary_tag("variable").rsplit("/", 1)[0] + "/"


def event_bytes(run_dir: str) -> tuple[int, int, int]:
    """(bytes of the run's event files, the bytes they would have without the VIEW_SUMMARY
    values, logged points: the steps with view summaries). The package's pipeline (Keras
    and PyTorch) puts a point's summaries into one event with the per-tensor values, so each event
    is measured again with its summary values left out."""
    total = without = 0
    steps: set[int] = set()
    for name in sorted(os.listdir(run_dir)):
        path = os.path.join(run_dir, name)
        total += os.path.getsize(path)
        for raw in event_file_loader.RawEventFileLoader(path).Load():
            event = event_pb2.Event.FromString(raw)
            values = event.summary.value
            keep = [v for v in values if not v.tag.startswith(SUMMARY_PREFIX)]
            if len(keep) == len(values):
                without += len(raw) + FRAMING
                continue
            steps.add(event.step)
            if keep:
                del values[:]
                values.extend(keep)
                without += len(event.SerializeToString()) + FRAMING
    return total, without, len(steps)


def keras_run(root: str, steps: int, every: int, kind: str = "cnn") -> str:
    import overhead

    from tb_introspect.keras import Introspect

    model = overhead.make(kind)
    log_dir = os.path.join(root, "keras")
    model.fit(overhead.dataset(steps, 32), epochs=1, verbose=0,
              callbacks=[Introspect(log_dir, every=every)])
    return log_dir


def torch_run(root: str, steps: int, every: int) -> str:
    import torch
    import torch_overhead

    from tb_introspect.torch import Introspector

    torch.manual_seed(0)
    model = torch_overhead.reference_cnn()
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    log_dir = os.path.join(root, "torch")
    with Introspector(log_dir, model, opt, every=every) as intro:
        for _ in range(steps):
            x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            intro.step(loss=loss)
        intro.end_epoch()
    return log_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=64, help="training steps (batch 32)")
    parser.add_argument("--every", type=int, default=4, help="a logged point every N steps")
    parser.add_argument("--bench-tensors", type=int, default=195)
    parser.add_argument("--bench-steps", type=int, default=20)
    parser.add_argument("--keras-model", default="cnn",
                        help="overhead.py's model for the Keras row (flatten: a quicker trace)")
    args = parser.parse_args(argv)

    import plugin_bench

    root = tempfile.mkdtemp(prefix="introspect-bytes-")
    rows = []
    try:
        for label, run in ((f"Keras {args.keras_model}, Introspect",
                            lambda *a: keras_run(*a, kind=args.keras_model)),
                           ("PyTorch CNN, Introspector", torch_run)):
            total, without, points = event_bytes(run(root, args.steps, args.every))
            rows.append((f"{label} (every={args.every})", points, without / points,
                         total / points))
        sizes = {}
        for version in (2, 3):
            run_dir = os.path.join(root, f"bench_v{version}")
            plugin_bench.write_bench_run(run_dir, args.bench_tensors, args.bench_steps,
                                         format_version=version)
            sizes[version] = sum(os.path.getsize(os.path.join(run_dir, f))
                                 for f in os.listdir(run_dir))
        rows.append((f"plugin_bench run, {args.bench_tensors} tensors x 4 views",
                     args.bench_steps, sizes[2] / args.bench_steps,
                     sizes[3] / args.bench_steps))
    finally:
        shutil.rmtree(root, ignore_errors=True)

    print("| run | logged points | bytes/point without summaries | with (format 3) | growth |")
    print("|---|---:|---:|---:|---:|")
    worst = 0.0
    for label, points, before, after in rows:
        worst = max(worst, after / before)
        print(f"| {label} | {points} | {before:,.0f} | {after:,.0f} |"
              f" +{100 * (after / before - 1):.1f} % |")
    print(f"\nlargest growth: +{100 * (worst - 1):.1f} % (target: at most"
          f" +{100 * (TARGET - 1):.0f} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
