"""A fake framework front-end for the pipeline's tests, and the helpers that read a run back.

``FakeFrontEnd`` answers the ``pipeline.FrontEnd`` protocol as a framework's front-end
does, with numpy arrays it makes instead of a model: a training step writes its per-replica
loss into a metric ring of ``metric_rows`` rows (row ``(step - 1) % rows``), adds its
gradients to the window's sums and, on a statistics step, folds each layer output (and
output gradient) into a ``stats_np`` state; the rectifier output's activity counts are taken
on every step with ``every="epoch"``. ``point()`` hands over the window as a
``pipeline.point.Point``: variable and gradient blocks from ``pipeline.params.Params``, the
output views' packed vectors from ``stats_np.finalize_many``. Everything after that (the
pipeline, the sink, the event files, the reader) is the real code.

It keeps what it made (``history``: one ``Window`` per point, ``truth``: every metric value
per step), so a test can compute the expected numbers with numpy on its own.

``read`` reads a run's event files in this process with the reader's own functions
(TensorBoard's loader would import TensorFlow here, seconds); ``read_logdir_elsewhere`` runs
``read.read_logdir`` and the ``diagnose`` rules in a subprocess without it.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import google_crc32c
import numpy as np
from tensorboard.compat.proto import event_pb2
from tensorboard.util import tensor_util

from tb_introspect import stats_np, summary_pb
from tb_introspect.pipeline.findings import WrittenRun
from tb_introspect.pipeline.options import Options
from tb_introspect.pipeline.params import Params
from tb_introspect.pipeline.pipeline import Pipeline
from tb_introspect.pipeline.plan import Monitored, Plan, is_sampled
from tb_introspect.pipeline.point import Block, Point
from tb_introspect.pipeline.sink import EventSink
from tb_introspect.read.series import RunSeries

#: The fake model's parameters: (name, layer, depth, shape).
VARIABLES = (("dense/kernel", "dense", 0, (3, 5)), ("dense/bias", "dense", 0, (5,)),
             ("conv/kernel", "conv", 1, (2, 3)))
#: Its layer outputs: (name, layer, depth, shape, rectifier). ``dense``: [batch, 5], no
#: positions; ``relu``: [batch, 4 positions, 3 channels], channel 0 always zero (dead).
OUTPUTS = (("dense", "dense", 0, (None, 5), False), ("relu", "relu", 1, (None, 4, 3), True))
BATCH = 6
METRICS = ("loss", "acc")


@dataclass
class Window:
    """What the fake made between two points (the test's ground truth)."""

    step: int = 0  # TensorBoard step the point was asked for (0: still open)
    steps: list[int] = field(default_factory=list)  # training steps of the window
    stats_steps: list[int] = field(default_factory=list)
    gsums: list[np.ndarray] = field(default_factory=list)
    weights: list[np.ndarray] = field(default_factory=list)  # at the point
    # view -> output index -> the arrays its statistics steps folded.
    outputs: dict[str, dict[int, list[np.ndarray]]] = field(default_factory=dict)
    # output index -> the arrays whose activity was counted.
    counted: dict[int, list[np.ndarray]] = field(default_factory=dict)


class FakeFrontEnd:
    """A framework front-end answering ``FrontEnd`` from numpy arrays (module docstring).

    ``fail``: the name of a method (``"point"``, ``"read_metrics"``) that raises from its
    ``fail_at``-th call on (1-based). ``nan_at``: a step whose gradients hold a NaN.
    ``skipped``: a ``[variables, 3]`` NaN/+Inf/-Inf count handed with every point."""

    def __init__(self, options: Options, *, metric_rows: int = 8, replicas: int = 2,
                 seed: int = 0, fail: str | None = None, fail_at: int = 1,
                 nan_at: int | None = None, skipped: np.ndarray | None = None) -> None:
        self.plan = Plan(
            options,
            variables=[Monitored("variable", n, layer, depth, shape, "float32")
                       for n, layer, depth, shape in VARIABLES],
            outputs=[Monitored("output", n, layer, depth, shape, "float32", exact=exact)
                     for n, layer, depth, shape, exact in OUTPUTS])
        self.metric_rows = metric_rows
        self.replicas = replicas
        self.rng = np.random.default_rng(seed)
        self.fail, self.fail_at, self.nan_at, self.skipped = fail, fail_at, nan_at, skipped
        self.calls: dict[str, int] = {"point": 0, "read_metrics": 0}
        #: Called at each point (a test's fake clock advancing by what the point "costs").
        self.on_point: Callable[[], None] | None = None
        self.step_count = 0
        self.total = np.zeros((metric_rows, len(METRICS)))
        self.count = np.zeros((metric_rows, len(METRICS)))
        #: Every metric value written to the ring: name -> {step: value}.
        self.truth: dict[str, dict[int, float]] = {m: {} for m in METRICS}
        self.weights = [self.rng.normal(size=shape) for _, _, _, shape in VARIABLES]
        self.params = Params(self.plan, self.weights, channels_first=False)
        #: The closed windows, one per point, and the open one.
        self.history: list[Window] = []
        self._open()

    # -------------------------------------------------------------- training

    def _open(self) -> None:
        self.window = Window(gsums=[np.zeros_like(w) for w in self.weights])
        self._states: dict[str, dict[int, dict]] = {}
        self._activity: dict[int, np.ndarray] = {}

    def _stats_step(self, step: int) -> bool:
        """``every=N``: the sampled steps; ``"epoch"``: the window's first step and every
        ``stats_every``-th after it."""
        if not self.plan.per_epoch:
            return bool(is_sampled(step, self.plan.every))
        return len(self.window.steps) % self.plan.stats_every == 0

    def step(self) -> None:
        """One training step."""
        s = self.step_count + 1
        stats = self._stats_step(s)
        w = self.window
        if stats or self.plan.per_epoch:  # with every=N only sampled steps are added
            grads = [self.rng.normal(scale=0.1, size=g.shape) for g in w.gsums]
            if s == self.nan_at:
                grads[0].flat[0] = np.nan
            for g, d in zip(w.gsums, grads, strict=True):
                g += d
        for wt in self.weights:
            wt -= 0.01 * self.rng.normal(size=wt.shape)
        outputs = {
            0: self.rng.normal(size=(BATCH, 5)) * np.array([1, 1, 1, 1, 0]),
            1: np.maximum(self.rng.normal(size=(BATCH, 4, 3)) + np.array([-50.0, 0.0, 0.5]), 0),
        }
        for j, x in outputs.items():
            spec = self.plan.outputs[j]
            if stats or self.plan.exact_activity(spec):
                w.counted.setdefault(j, []).append(x)
                channels, positions = self.output_widths()[j]
                blocks = x.reshape(x.shape[0], max(positions, 1), channels) != 0
                row = np.concatenate([[x.size], blocks.sum(axis=(0, 1)),
                                      blocks.sum(axis=(0, 2)) if positions else []])
                prev = self._activity.get(j)
                self._activity[j] = row if prev is None else prev + row
            if not stats:
                continue
            for view in self.plan.output_views:
                a = x if view == "output" else self.rng.normal(size=x.shape)
                w.outputs.setdefault(view, {}).setdefault(j, []).append(a)
                st = stats_np.tensor_state(a, sample_size=None)
                held = self._states.setdefault(view, {})
                held[j] = st if j not in held else stats_np.merge_states(held[j], st)
        # The metric ring: each replica's loss; "acc" on even steps only.
        row = (s - 1) % self.metric_rows
        self.total[row] = self.count[row] = 0.0
        losses = 1.0 / s + self.rng.normal(scale=0.01, size=self.replicas)
        self.total[row, 0], self.count[row, 0] = losses.sum(), self.replicas
        self.truth["loss"][s] = float(losses.mean())
        if s % 2 == 0:
            acc = self.rng.uniform(size=self.replicas)
            self.total[row, 1], self.count[row, 1] = acc.sum(), self.replicas
            self.truth["acc"][s] = float(acc.mean())
        w.steps.append(s)
        if stats:
            w.stats_steps.append(s)
        self.step_count = s

    # -------------------------------------------------------------- FrontEnd

    def _call(self, name: str) -> None:
        self.calls[name] += 1
        if self.fail == name and self.calls[name] >= self.fail_at:
            raise RuntimeError(f"the fake's {name} failed")

    def current_step(self) -> int:
        return self.step_count

    def read_metrics(self) -> tuple[int, list[str], np.ndarray, np.ndarray]:
        self._call("read_metrics")
        return self.step_count, list(METRICS), self.total.copy(), self.count.copy()

    def point(self, step: int) -> Point:
        self._call("point")
        if self.on_point is not None:
            self.on_point()
        w = self.window
        out = Point(window=len(w.steps), stats_steps=len(w.stats_steps),
                    activity={j: r.copy() for j, r in self._activity.items()},
                    skipped=self.skipped)
        want = self.plan.want
        self.params.add_blocks(out, self.weights if want("variable") else None,
                               w.gsums if want("gradient") else None, seed=step)
        for view in self.plan.output_views:
            held = self._states.get(view, {})
            specs = [self.plan.outputs[j] for j in sorted(held)]
            if specs:
                out.blocks.append(Block(view, specs, stats_np.finalize_many(
                    [held[j] for j in sorted(held)], view, quantiles=self.plan.options.quantiles)))
        w.step = step
        w.weights = [x.copy() for x in self.weights]
        self.history.append(w)
        self._open()
        return out

    def output_widths(self) -> dict[int, tuple[int, int]]:
        widths = {}
        for j, spec in enumerate(self.plan.outputs):
            shape = spec.shape
            widths[j] = (int(shape[-1]), int(np.prod(shape[1:-1])) if len(shape) >= 3 else 0)
        return widths


def make(log_dir: Path, *, every: str | int = "epoch", flush_secs: float = 3600.0,
         lockstep: bool = False, governor=None, views=None, options: dict | None = None,
         **fake) -> tuple[FakeFrontEnd, Pipeline]:
    """A fake front-end and a ``Pipeline`` writing to a real ``EventSink`` in ``log_dir``
    (``flush_secs`` long by default: no drain or flush on the clock unless a test asks)."""
    kw = dict(options or {})
    if views is not None:
        kw["views"] = views
    fe = FakeFrontEnd(Options.make(every=every, flush_secs=flush_secs, **kw), **fake)
    pipeline = Pipeline(fe, EventSink(log_dir), lockstep=lockstep, governor=governor)
    pipeline.start(0)
    pipeline.begin_epoch(0)
    return fe, pipeline


def train(fe: FakeFrontEnd, pipeline: Pipeline, steps: int, per_execution: int = 1) -> None:
    """``steps`` training steps, ``per_execution`` of them between two pipeline calls."""
    done = 0
    while done < steps:
        n = min(per_execution, steps - done)
        for _ in range(n):
            fe.step()
        pipeline.after_steps(n)
        done += n


def _masked_crc(data: bytes) -> bytes:
    """TFRecord's masked CRC-32C (its specification, not the sink's code)."""
    crc = google_crc32c.value(data)
    return struct.pack("<I", (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


def events(log_dir: Path) -> list[event_pb2.Event]:
    """Every event of the event files in ``log_dir`` (name order), each record's length and
    data checked against their masked CRC-32C. TensorBoard's own loader would import
    TensorFlow (seconds) in this process: ``read_logdir_elsewhere`` runs it in another."""
    out = []
    for path in sorted(Path(log_dir).glob("events.out.tfevents.*")):
        data, at = path.read_bytes(), 0
        while at < len(data):
            header = data[at:at + 8]
            (n,) = struct.unpack("<Q", header)
            assert data[at + 8:at + 12] == _masked_crc(header), f"{path}: bad length CRC"
            body = data[at + 12:at + 12 + n]
            assert data[at + 12 + n:at + 16 + n] == _masked_crc(body), f"{path}: bad CRC"
            out.append(event_pb2.Event.FromString(body))
            at += 16 + n
    return out


def read(log_dir: Path) -> RunSeries:
    """The run in ``log_dir`` as TensorBoard's data provider hands it to the reader: each
    tag's first metadata, its points decoded, assembled by the reader's own functions
    (``findings.WrittenRun``, what ``on_finding``'s rules read)."""
    run = WrittenRun()
    for e in events(log_dir):
        if e.HasField("summary"):
            run.add([(e.step, [summary_pb.Value(
                v.tag, tensor_util.make_ndarray(v.tensor),
                v.metadata if v.HasField("metadata") else None) for v in e.summary.value])],
                e.wall_time)
    return run.series()


#: Run in a subprocess by ``read_logdir_elsewhere``: TensorBoard's reader without TensorFlow
#: (``tb-introspect diagnose``'s switch), every series and the findings, as an npz file.
_READ_LOGDIR = """
import json, sys
import numpy as np
from tb_introspect.cli import _read_without_tensorflow
_read_without_tensorflow()
from tb_introspect import diagnose
from tb_introspect.read import read_logdir
(run,) = read_logdir(sys.argv[1]).values()
arrays = {}
for tag, s in run.all_series().items():
    arrays[tag + ":steps"], arrays[tag + ":values"] = s.steps, s.values
kinds = [[f.kind, f.first_step] for f in diagnose.find_issues(run)]
arrays["findings"] = np.array(json.dumps(kinds))
arrays["tensorflow"] = np.array("tensorflow" in sys.modules)
np.savez(sys.argv[2], **arrays)
"""


def read_logdir_elsewhere(log_dir: Path, tmp: Path) -> tuple[dict, list, bool]:
    """``read.read_logdir`` of ``log_dir`` in a subprocess (about a second):
    ``{tag: (steps, values)}``, the findings' ``[kind, first_step]``, and whether
    TensorFlow was imported there."""
    out = tmp / "read.npz"
    done = subprocess.run([sys.executable, "-c", _READ_LOGDIR, str(log_dir), str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    with np.load(out) as z:
        tags = {k.rsplit(":", 1)[0] for k in z.files if k.endswith(":steps")}
        series = {t: (z[t + ":steps"], z[t + ":values"]) for t in tags}
        return series, json.loads(str(z["findings"])), bool(z["tensorflow"])


def tensor(run: RunSeries, view: str, name: str):
    """The ``Series`` of tensor ``name`` of ``view``."""
    (s,) = [s for s in run.tensors.get(view, []) if s.info.name == name]
    return s
