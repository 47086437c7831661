"""Training overhead of the Introspect callback, on CPU: wall and CPU time, memory.

For each model, identical copies train side by side in one process: plain
``fit``, ``fit`` with TensorBoard's own histogram callback, and ``fit`` with
``Introspect`` at each cadence (default settings, all four views). The models: two CNNs,
the GPT-style model of ``torch_overhead.py`` and MobileNetV2. After a
warm-up epoch each (tracing), rounds of one epoch per variant are interleaved
(the order rotates every round and runs backwards every second one, so no variant
always follows the same one) and each figure is the median over rounds of the
per-round ratio to plain ``fit``. ``--control`` adds a second plain copy, whose ratio
to the first is what two identical copies differ by here. ``--jit`` adds a pair with
``jit_compile=True``, ``--jit-only`` runs that pair alone. ``--profile`` splits the
instrumented epoch into logging time (statistics at the logged points + writing) and
metric draining.
``--view-rows`` shows where the per-epoch cost comes from: rows with one or two
views, and the two output views with statistics from each epoch's first step
only (what the lean steps between statistics steps pay: the rectifiers' exact
activity counts). "added CPU ms/step" is the CPU time above plain ``fit``
divided by the epoch's steps, logging included. "stats steps" is the median
number of statistics steps per epoch that the overhead governor chose. The
memory table gives the in-step state, peak RSS, the first epoch's time against
plain ``fit``'s (tracing and compiling) and the compile time of each of the
callback's two train functions (statistics and lean). ``--step-functions`` times the
compiled train functions themselves, interleaved, outside ``fit``: plain, the callback's lean
step and its statistics step, per step: where a model's added time comes from, with no
callback, logging or epoch in between; ``--op-profile N`` adds the N TensorFlow op types whose
time (a profiler trace of the lean step and of the plain function) grows most. ``--probes``
adds the transformer probes' own cost: a per-epoch row with ``probes=False`` beside the
default's, and with ``--step-functions`` the statistics step without them.

    python benchmarks/overhead.py                      # the table of docs/benchmarks.md
    python benchmarks/overhead.py --models cnn --quick # a fast smoke run
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import resource
import statistics
import sys
import tempfile
import time
from typing import TYPE_CHECKING

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

if TYPE_CHECKING:  # imported where used: keras_backend_overhead.py's models need no TensorFlow
    import tensorflow as tf

from tb_introspect.keras import Introspect  # noqa: E402
from tb_introspect.pipeline import pipeline as host  # noqa: E402

TARGETS = {"epoch": 1.05, "16": 1.05, "1": 1.25}
ONCE = 10**9  # a stats_every no epoch reaches
SEQ, VOCAB = 64, 1000  # the GPT-style model's sequence and vocabulary


def cifar_cnn(head: str = "gap") -> keras.Model:
    """conv-BN-ReLU blocks with max-pooling; ``head`` "gap" (global pooling) or "flatten"
    (Flatten -> Dense 128, whose large kernel dominates the gradients)."""
    x = inp = keras.Input((32, 32, 3))
    if head == "gap":
        blocks = (32, 32, "pool", 64, 64, "pool", 128, "pool")
    else:  # the reference CNN: 3 x (conv-BN-ReLU-pool)
        blocks = (32, "pool", 64, "pool", 128, "pool")
    for f in blocks:
        if f == "pool":
            x = keras.layers.MaxPooling2D()(x)
            continue
        x = keras.layers.Conv2D(f, 3, padding="same", use_bias=False)(x)
        x = keras.layers.BatchNormalization()(x)
        x = keras.layers.ReLU()(x)
    if head == "gap":
        x = keras.layers.GlobalAveragePooling2D()(x)
    else:
        x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(128, activation="relu")(x)
    x = keras.layers.Dropout(0.2)(x)
    return keras.Model(inp, keras.layers.Dense(10)(x))


def tiny_cnn() -> keras.Model:
    """A smoke run's model (``tests/test_benchmarks.py``): one conv-BN-ReLU block, pooled, a
    head; quick to trace."""
    x = inp = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(8, 3, use_bias=False)(x)
    x = keras.layers.BatchNormalization()(x)
    x = keras.layers.ReLU()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inp, keras.layers.Dense(10)(x))


class PositionEmbedding(keras.layers.Layer):
    """A learned vector per position, added to the token embeddings."""

    def build(self, shape) -> None:
        self.table = self.add_weight(shape=tuple(shape[1:]), name="table",
                                     initializer=keras.initializers.RandomNormal(stddev=0.02))

    def call(self, x):
        return x + self.table


def gpt(vocab: int = VOCAB, seq: int = SEQ, width: int = 128, heads: int = 4, mlp: int = 512,
        blocks: int = 4) -> keras.Model:
    """torch_overhead.py's GPT-style model in Keras: token and position embeddings, pre-LN
    causal blocks (dropout 0.1, as ``nn.TransformerEncoderLayer``'s), a head."""
    tok = keras.Input((seq,), dtype="int32")
    x = PositionEmbedding()(keras.layers.Embedding(vocab, width)(tok))
    for _ in range(blocks):
        h = keras.layers.LayerNormalization()(x)
        h = keras.layers.MultiHeadAttention(heads, width // heads, dropout=0.1)(
            h, h, use_causal_mask=True)
        x = keras.layers.Add()([x, keras.layers.Dropout(0.1)(h)])
        h = keras.layers.LayerNormalization()(x)
        h = keras.layers.Dense(width)(keras.layers.Dense(mlp, activation="gelu")(h))
        x = keras.layers.Add()([x, keras.layers.Dropout(0.1)(h)])
    x = keras.layers.LayerNormalization()(x)
    return keras.Model(tok, keras.layers.Dense(vocab)(x))


#: name: (table name, model, batch size of its rows, output is logits)
MODELS = {
    "cnn": ("CIFAR-shaped CNN (GAP head)", lambda: cifar_cnn("gap"), 64, True),
    "flatten": ("CNN with Flatten -> Dense 128", lambda: cifar_cnn("flatten"), 64, True),
    "gpt": ("GPT-style (4 pre-LN causal blocks, width 128)", gpt, 32, True),
    "mobilenetv2": ("MobileNetV2 32x32, weights=None", lambda: keras.applications.MobileNetV2(
        weights=None, input_shape=(32, 32, 3), classes=10), 64, False),
    "resnet50": ("ResNet50 32x32, weights=None", lambda: keras.applications.ResNet50(
        weights=None, input_shape=(32, 32, 3), classes=10), 64, False),
    "tiny": ("tiny CNN (one conv block; smoke runs)", tiny_cnn, 16, True),
}


def make(kind: str, jit: bool = False) -> keras.Model:
    keras.utils.set_random_seed(0)
    model = MODELS[kind][1]()
    model.compile(
        keras.optimizers.Adam(1e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=MODELS[kind][3]),
        metrics=["accuracy"], jit_compile=jit,
    )
    return model


def dataset(steps: int, batch: int, kind: str = "cnn", autotune: bool = False
            ) -> tf.data.Dataset:
    """Random images and classes, or for "gpt" random tokens and their next tokens."""
    import tensorflow as tf

    rng = np.random.default_rng(0)
    if kind == "gpt":
        idx = rng.integers(0, VOCAB, (steps * batch, SEQ + 1)).astype("int32")
        x, y = idx[:, :-1], idx[:, 1:]
    else:
        x = rng.normal(size=(steps * batch, 32, 32, 3)).astype("float32")
        y = rng.integers(0, 10, steps * batch)
    # tf.data's autotune off unless asked: its optimization thread sleeps 10 ms, 20 ms, ...
    # doubling, and an epoch's iterator is released only at its next wake-up, so with it
    # every epoch longer than 5.11 s took 10.23 s and every one longer than that 20.47 s,
    # whatever ran in it (the sums of those sleeps): a quantised wall time, not the callback's.
    options = tf.data.Options()
    options.autotune.enabled = autotune
    return (tf.data.Dataset.from_tensor_slices((x, y)).batch(batch).cache()
            .with_options(options))


class Timers:
    """Wall time spent in the callback's logging and metric draining (for --profile)."""

    def __init__(self) -> None:
        self.log = self.drain = 0.0
        orig_log, orig_drain = host.Pipeline.log, host.Pipeline.drain

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

        host.Pipeline.log, host.Pipeline.drain = log, drain

    def reset(self) -> None:
        self.log = self.drain = 0.0


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def state_bytes(cb: Introspect) -> tuple[int, int]:
    """(bytes of every in-step accumulator, number of monitored tensors)."""
    front_end = cb.front_end
    total = sum(int(np.prod(v.shape)) * v.dtype.size for v in front_end.device_variables())
    return total, 2 * len(front_end.plan.variables) + 2 * len(front_end.plan.outputs)


def param_bytes(model: keras.Model) -> int:
    return sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
               for v in model.trainable_variables)


def variants(args: argparse.Namespace) -> list[tuple[str, bool, object]]:
    """(label, jit, callback factory); the first is the baseline."""
    if args.jit_only:  # the XLA pair alone: plain fit and the per-epoch callback
        return [("plain fit, jit_compile=True", True, None),
                ("Introspect(every='epoch'), jit_compile=True", True,
                 lambda d: Introspect(d, every="epoch"))]
    out = [("plain fit", False, None),
           ("keras TensorBoard(histogram_freq=1)", False,
            lambda d: keras.callbacks.TensorBoard(d, histogram_freq=1))]
    if args.control:
        out.append(("plain fit, a second copy", False, None))
    for every in args.every.split(","):
        cadence = every if every == "epoch" else int(every)
        label = "Introspect(every='epoch')" if every == "epoch" else f"Introspect(every={every})"
        out.append((label, False, lambda d, c=cadence: Introspect(d, every=c)))
    for n in filter(None, args.stats_every.split(",")):  # sampled statistics steps
        out.append((f"Introspect(every='epoch', stats_every={n})", False,
                    lambda d, n=int(n): Introspect(d, every="epoch", stats_every=n)))
    if args.view_rows:  # where the per-epoch cost comes from
        for views in (("variable", "gradient"), ("output",), ("output_gradient",)):
            out.append((f"Introspect(every='epoch', views={'+'.join(views)})", False,
                        lambda d, v=views: Introspect(d, every="epoch", views=v)))
        # Statistics on each epoch's first step only: what the other steps pay alone,
        # the exact activity counts (output) and the capture of output gradients.
        for view in ("output", "output_gradient"):
            out.append((f"Introspect(every='epoch', views={view}, stats_every=epoch)", False,
                        lambda d, v=view: Introspect(d, every="epoch", views=(v,),
                                                     stats_every=ONCE)))
    if args.probes:  # the default row less the transformer probes
        out.append(("Introspect(every='epoch', probes=False)", False,
                    lambda d: Introspect(d, every="epoch", probes=False)))
    if args.jit:
        out.append(("plain fit, jit_compile=True", True, None))
        out.append(("Introspect(every='epoch'), jit_compile=True", True,
                    lambda d: Introspect(d, every="epoch")))
    return out


def batch_size(kind: str, args: argparse.Namespace) -> int:
    return args.batch or MODELS[kind][2]


def run_model(kind: str, args: argparse.Namespace, timers: Timers) -> list[dict]:
    ds = dataset(args.steps, batch_size(kind, args), kind, args.autotune)
    vs = variants(args)
    models, cbs = [], []
    rss0 = rss_mib()
    for _label, jit, factory in vs:
        models.append(make(kind, jit))
        cbs.append([factory(tempfile.mkdtemp(dir=args.scratch))] if factory else [])
    rows = [{"label": label, "wall": [], "cpu": [], "cpu_ms": [], "log": [], "drain": [],
             "stats": []} for label, _, _ in vs]
    for row, m, cb in zip(rows, models, cbs, strict=True):  # warm-up: tracing, first writes
        t0 = time.perf_counter()
        m.fit(ds, epochs=1, verbose=0, callbacks=cb)
        row["first_epoch_s"] = time.perf_counter() - t0
    rss1 = rss_mib()
    base = {"plain": 0, "jit": next((i for i, v in enumerate(vs) if v[1]), None)}
    for r in range(args.pairs):
        order = list(range(len(vs)))
        order = order[r % len(order):] + order[:r % len(order)]
        wall, cpu = {}, {}
        for i in order[::-1] if r % 2 else order:
            timers.reset()
            c0, t0 = time.process_time(), time.perf_counter()
            models[i].fit(ds, epochs=1, verbose=0, callbacks=cbs[i])
            wall[i], cpu[i] = time.perf_counter() - t0, time.process_time() - c0
            rows[i]["log"].append(timers.log)
            rows[i]["drain"].append(timers.drain)
            gov = [c.governor for c in cbs[i] if isinstance(c, Introspect)]
            if gov:
                rows[i]["stats"].append(gov[0].last_window[0])
        for i, (_, jit, _) in enumerate(vs):
            b = base["jit"] if jit else base["plain"]
            rows[i]["wall"].append(wall[i] / wall[b])
            rows[i]["cpu"].append(cpu[i] / cpu[b])
            rows[i]["cpu_ms"].append(1e3 * (cpu[i] - cpu[b]) / args.steps)
            rows[i].setdefault("epoch_s", []).append(wall[i])
    for row, cb in zip(rows, cbs, strict=True):
        ours = [c for c in cb if isinstance(c, Introspect)]
        row["state"] = state_bytes(ours[0]) if ours and ours[0].front_end else None
        row["compile"] = dict(ours[0].governor.compile_seconds) if ours else {}
        for c in ours:
            c.close()
    params = param_bytes(models[0])
    return [dict(row, model=kind, params=params, rss0=rss0, rss1=rss1) for row in rows]


def step_function_rows(kind: str, args: argparse.Namespace) -> None:
    """Per-step CPU and wall time of plain ``fit``'s train function and of the callback's
    lean (with and without the rectifier counts) and statistics functions, interleaved over
    ``--pairs`` rounds of 16 steps each."""
    ds = dataset(args.steps, batch_size(kind, args), kind, args.autotune)
    fns = {}
    model = make(kind)
    model.fit(ds, epochs=1, verbose=0)
    fns["plain train function"] = model.train_function
    cb = Introspect(tempfile.mkdtemp(dir=args.scratch))
    make(kind).fit(ds, epochs=1, verbose=0, callbacks=[cb])
    fns["lean step"], fns["statistics step"] = cb._lean_fn, cb._instrumented_fn
    fns["lean step, counts off"] = cb._bare_fn  # the governor's bare execution
    if args.probes:
        off = Introspect(tempfile.mkdtemp(dir=args.scratch), probes=False)
        make(kind).fit(ds, epochs=1, verbose=0, callbacks=[off])
        fns["statistics step, probes=False"] = off._instrumented_fn
    batches = iter(ds.repeat())
    for fn in fns.values():
        for _ in range(2):
            fn(batches)
    steps = 16
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    wall: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(args.pairs):
        for name in names[r % len(names):] + names[:r % len(names)]:
            c0, t0 = time.process_time(), time.perf_counter()
            for _ in range(steps):
                fns[name](batches)
            cpu[name].append(1e3 * (time.process_time() - c0) / steps)
            wall[name].append(1e3 * (time.perf_counter() - t0) / steps)
    base = statistics.median(cpu[names[0]]), statistics.median(wall[names[0]])
    for name in names:
        c, w = statistics.median(cpu[name]), statistics.median(wall[name])
        print(f"| {MODELS[kind][0]} | {name} | {c:.1f} | {w:.1f} | {c - base[0]:+.1f} |"
              f" {w - base[1]:+.1f} |", flush=True)
    if args.op_profile:
        plain, lean = (op_times(fns[n], batches, args.scratch)
                       for n in ("plain train function", "lean step"))
        print(f"\n{MODELS[kind][0]}: TensorFlow op time per step (profiler trace of 5 steps),"
              " the lean step against the plain train function, largest differences first")
        print("| op | plain ms | lean ms | added ms | ops per step: plain / lean |")
        print("|---|---:|---:|---:|---|")
        ops = sorted(set(plain) | set(lean), key=lambda o: plain.get(o, (0, 0))[0]
                     - lean.get(o, (0, 0))[0])
        for op in ops[:args.op_profile]:
            (pt, pn), (lt, ln) = plain.get(op, (0.0, 0.0)), lean.get(op, (0.0, 0.0))
            print(f"| {op} | {pt:.2f} | {lt:.2f} | {lt - pt:+.2f} | {pn:.0f} / {ln:.0f} |")
    cb.close()


def op_times(fn, batches, scratch: str, steps: int = 5) -> dict[str, tuple[float, float]]:
    """{TensorFlow op type: (ms per step, ops per step)} from a profiler trace of ``steps``
    calls of ``fn`` (the host plane's op events, ``name:Type``, by type)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2  # the trace's format

    folder = tempfile.mkdtemp(dir=scratch)
    import tensorflow as tf

    tf.profiler.experimental.start(folder)
    for _ in range(steps):
        fn(batches)
    tf.profiler.experimental.stop()
    space = xplane_pb2.XSpace()
    for path in glob.glob(os.path.join(folder, "**", "*.xplane.pb"), recursive=True):
        with open(path, "rb") as f:
            space.ParseFromString(f.read())
    out: dict[str, list[float]] = {}
    for plane in space.planes:
        if "host" not in plane.name.lower():
            continue
        for line in plane.lines:
            for ev in line.events:
                name = plane.event_metadata[ev.metadata_id].name
                op = name.rsplit(":", 1)[-1]
                # An op is "name:Type"; the runtime's own events are "Scope::Step",
                # "Function: __inference_..." or have no colon.
                if ":" not in name or "::" in name or not op.isidentifier():
                    continue
                acc = out.setdefault(op, [0.0, 0.0])
                acc[0] += ev.duration_ps / 1e9 / steps
                acc[1] += 1 / steps
    return {op: (t, n) for op, (t, n) in out.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="cnn,flatten,gpt,mobilenetv2",
                   help=f"comma separated, of {', '.join(MODELS)}")
    p.add_argument("--every", default="epoch,16,1", help="cadences, comma separated")
    p.add_argument("--steps", type=int, default=96, help="steps per epoch")
    p.add_argument("--batch", type=int, default=0, help="0: the model's (64, GPT 32)")
    p.add_argument("--pairs", type=int, default=5, help="interleaved rounds (median over them)")
    p.add_argument("--jit", action=argparse.BooleanOptionalAction, default=True,
                   help="add plain and per-epoch rows with jit_compile=True")
    p.add_argument("--jit-only", action="store_true",
                   help="only the jit_compile=True rows (plain and per-epoch)")
    p.add_argument("--stats-every", default="",
                   help="add per-epoch rows with these stats_every values, comma separated")
    p.add_argument("--view-rows", action="store_true",
                   help="add per-epoch rows with one or two views only")
    p.add_argument("--profile", action="store_true", help="logging and drain time per epoch")
    p.add_argument("--step-functions", action="store_true",
                   help="time the compiled train functions (plain, lean, statistics) instead")
    p.add_argument("--op-profile", type=int, default=0, metavar="N",
                   help="with --step-functions: the N ops whose time the lean step adds most")
    p.add_argument("--probes", action="store_true",
                   help="add rows without the transformer probes (their own cost)")
    p.add_argument("--control", action="store_true",
                   help="add a second plain copy: what two identical copies differ by")
    p.add_argument("--quick", action="store_true", help="smoke run: 4 steps, 1 round, no jit")
    p.add_argument("--autotune", action="store_true",
                   help="tf.data's autotune on, as by default (epochs past 5.11 s quantised)")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.batch, args.pairs, args.jit = 4, 16, 1, False
    # The runs' event files, removed at the end.
    with tempfile.TemporaryDirectory(prefix="tbi_overhead_") as args.scratch:
        return run(args)


def run(args: argparse.Namespace) -> int:
    kinds = [k.strip() for k in args.models.split(",")]
    batch = args.batch or ", ".join(f"{k} {MODELS[k][2]}" for k in kinds)
    if args.step_functions:
        print(f"# CPU ({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}), batch"
              f" {batch}, medians of {args.pairs} interleaved rounds of 16 steps")
        print("| model | function | CPU ms/step | wall ms/step | added CPU | added wall |")
        print("|---|---|---:|---:|---:|---:|")
        for kind in kinds:
            step_function_rows(kind, args)
        return 0
    timers = Timers()
    print(f"# CPU ({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}), batch {batch},"
          f" {args.steps} steps/epoch, median of {args.pairs} interleaved rounds, default settings")
    print("| model | configuration | epoch s | wall | CPU | added CPU ms/step | stats steps |"
          " target |" + (" logging s/epoch | drain s/epoch |" if args.profile else ""))
    print("|---|---|---:|---:|---:|---:|---:|---|" + ("---:|---:|" if args.profile else ""))
    memory = []
    for kind in kinds:
        rows = run_model(kind, args, timers)
        for row in rows:
            m = re.search(r"\(every='?(\w+)'?", row["label"])
            every = m.group(1) if m else None
            partial = "jit" in row["label"] or "views=" in row["label"]
            target = None if partial else TARGETS.get(every)
            goal = f"<= {target:.2f}x" if target else "-"
            line = (f"| {MODELS[kind][0]} | {row['label']} |"
                    f" {statistics.median(row['epoch_s']):.2f} |"
                    f" {statistics.median(row['wall']):.2f}x |"
                    f" {statistics.median(row['cpu']):.2f}x |"
                    f" {statistics.median(row['cpu_ms']):.1f} |"
                    f" {statistics.median(row['stats']) if row['stats'] else '-'} |"
                    f" {goal} |")
            if args.profile:
                line += (f" {statistics.median(row['log']):.3f} |"
                         f" {statistics.median(row['drain']):.3f} |")
            print(line, flush=True)
            if row["label"].startswith("plain fit") and "second copy" not in row["label"]:
                memory.append((kind, row))
            elif row["state"] and row["label"] in ("Introspect(every='epoch')",
                                                    "Introspect(every='epoch'), jit_compile=True"):
                memory.append((kind, row))
    print("\n| model | configuration | trainable params MiB | in-step state MiB |"
          " target MiB (3 x params + 64) | peak RSS MiB: plain models / after warm-up |"
          " first epoch s | compile s: statistics / lean function |")
    print("|---|---|---:|---:|---:|---|---:|---|")
    mib = 2**20
    for kind, row in memory:
        total = row["state"][0] if row["state"] else 0
        comp = row.get("compile") or {}
        compiled = (f"{comp[True]:.1f} / {comp[False]:.1f}" if len(comp) == 2 else "-")
        print(f"| {MODELS[kind][0]} | {row['label']} | {row['params'] / mib:.1f} |"
              f" {total / mib:.1f} | {3 * row['params'] / mib + 64:.0f} |"
              f" {row['rss0']:.0f} / {row['rss1']:.0f} | {row['first_epoch_s']:.1f} |"
              f" {compiled} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
