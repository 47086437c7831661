"""Host-side logging shared by the Keras callback and the custom-loop ``Introspector``.

Decides when a point is due, drains the per-step metric ring buffer, writes
metric summaries (numpy-built protos, every drained step in one TensorFlow call) and keeps
event files flushed often enough for TensorBoard's live view.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from tensorboard.compat.proto import summary_pb2

from tb_introspect import summary_pb
from tb_introspect.collect.core import Collector, warn


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """True unless this is a non-chief worker of a multi-worker strategy."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not getattr(resolver, "task_type", None):
        return True
    ext = strategy.extended
    for attr in ("should_save_summary", "should_checkpoint"):
        if hasattr(ext, attr):
            return bool(getattr(ext, attr))
    kind, index = resolver.task_type, resolver.task_id
    return kind == "chief" or (kind == "worker" and index == 0)


def is_multi_worker(strategy: tf.distribute.Strategy) -> bool:
    resolver = getattr(strategy, "cluster_resolver", None)
    try:
        spec = resolver.cluster_spec().as_dict() if resolver is not None else {}
    except Exception:
        return False
    return sum(len(v) if isinstance(v, (list, dict)) else 1 for v in spec.values()) > 1


def make_writer(log_dir: str, flush_secs: float) -> Any:
    return tf.summary.create_file_writer(
        log_dir, max_queue=1000, flush_millis=int(flush_secs * 1000)
    )


class HostLogger:
    """What happens between training steps: metric drains, due points, flushes."""

    def __init__(self, collector: Collector, writer: Any, flush_secs: float,
                 lockstep: bool = False):
        self.c = collector
        # Under a multi-worker strategy every read of the accumulators is a
        # collective: all workers must read at the same steps, so reads are
        # never triggered by (worker-local) wall-clock time.
        self.lockstep = bool(lockstep)
        self.writer = writer
        self.flush_secs = float(flush_secs)
        self.off: set[str] = set()
        self.epoch = 0
        self.epoch_values: dict[str, list[float]] = {}
        self.last_metric_step = 0
        self.last_log_step = 0
        self.since_drain = 0
        self._last_flush = time.monotonic()
        self._write_fn: tuple[Any, Callable] | None = None  # (the writer it captured, fn)

    def is_off(self, part: str) -> bool:
        """Whether ``part`` ("metrics", "statistics", "writing") was switched off by a failure."""
        return part in self.off

    def start(self, initial_step: int) -> None:
        self.last_metric_step = self.last_log_step = int(initial_step)

    # -------------------------------------------------------------- never break training

    def guard(self, part: str, fn: Callable, *args: Any) -> Any:
        """Run ``fn``; on error warn once and switch ``part`` off (training goes on)."""
        if part in self.off:
            return None
        try:
            return fn(*args)
        except Exception as e:
            if self._writer_broken(e):
                self.stop_writing(e)
                return None
            self.off.add(part)
            warn(f"{part} failed ({type(e).__name__}: {e}); {part} is off for the rest of"
                 " training, training goes on")
            return None

    def _writer_broken(self, error: Exception) -> bool:
        """Whether ``error`` says the event file cannot be written (full disk, size limit...).

        TensorFlow names the failing summary-writer op and the events file in
        the error; a flush that fails too says the same.
        """
        if self.writer is None or "writing" in self.off:
            return "writing" in self.off
        text = getattr(error, "message", None) or str(error)
        if isinstance(error, OSError) or _WRITER_ERROR.search(text):
            return True
        try:
            self.writer.flush()
        except Exception:
            return True
        return False

    def stop_writing(self, error: Exception) -> None:
        """One warning for a log directory that cannot be written; all logging stops.

        Every part writes through the same writer, so per-part warnings would
        repeat one cause several times, each with TensorFlow's graph traceback.
        """
        if "writing" in self.off:
            return
        self.off.update(("writing", "metrics", "statistics"))
        warn(f"cannot write to the log directory ({_short_error(error)}); logging is off"
             " for the rest of training, training goes on")

    # -------------------------------------------------------------- per execution

    def after_steps(self, steps: int, running: Mapping[str, Any] | None = None) -> None:
        """Call after ``steps`` training steps ran (one Keras execution, one custom step)."""
        self.since_drain += int(steps)
        flush_due = time.monotonic() - self._last_flush >= self.flush_secs
        # Drain before the ring buffer could wrap during the next execution, and
        # before each flush so that what is on disk is complete up to now.
        drain_now = flush_due and not self.lockstep
        if self.since_drain + int(steps) >= self.c.metric_rows or running or drain_now:
            self.guard("metrics", self.drain, running)
        if self.c.every != "epoch":
            self.guard("statistics", self._maybe_log_steps)
        if flush_due:
            self.flush()

    def _maybe_log_steps(self) -> None:
        step = self.c.current_step()
        n = int(self.c.every)
        last_sampled = step - step % n
        if last_sampled > self.last_log_step:
            self.c.log(last_sampled, self.epoch)
            self.last_log_step = last_sampled

    def drain(self, running: Mapping[str, Any] | None = None) -> None:
        """Write the per-step metric values buffered since the last drain.

        ``running`` holds metrics that are not running means (e.g. AUC): their
        current value is written at the current step.
        """
        self.since_drain = 0
        c = self.c
        step, total, count = c.read_metrics()
        rows = c.metric_rows
        batches = []
        for s in range(max(self.last_metric_step + 1, step - rows + 1), step + 1):
            row = (s - 1) % rows
            protos = []
            for m, name in enumerate(c.metric_names):
                n = count[row, m]
                if n <= 0:
                    continue
                value = float(total[row, m] / n)
                self.epoch_values.setdefault(name, []).append(value)
                protos.append(summary_pb.metric_pb(name, value, self.epoch))
            batches.append((s, protos))
        if running and step > self.last_metric_step:
            protos = []
            for name, value in running.items():
                v = as_float(value)
                if v is None:
                    continue
                self.epoch_values.setdefault(name, []).append(v)
                protos.append(summary_pb.metric_pb(name, v, self.epoch))
            batches.append((step, protos))
        self.write_steps(batches)
        self.last_metric_step = max(self.last_metric_step, step)

    # -------------------------------------------------------------- per epoch

    def begin_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        self.epoch_values = {}

    def end_epoch(self, epoch: int, epoch_metrics: Mapping[str, Any] | None = None) -> None:
        """Drain, write the epoch's statistics (epoch cadence) and metric bands, flush."""
        self.guard("metrics", self.drain)
        if self.c.every == "epoch":
            self.guard("statistics", self._log_epoch, epoch)
        self.guard("statistics", self._write_activity, epoch)
        self.guard("metrics", self._epoch_metrics, epoch, epoch_metrics)
        self.flush()

    def _log_epoch(self, epoch: int) -> None:
        self.c.log(self.c.current_step(), epoch)

    def _write_activity(self, epoch: int) -> None:
        self.c.write_activity(self.c.current_step(), epoch)

    def _epoch_metrics(self, epoch: int, extra: Mapping[str, Any] | None) -> None:
        step = self.c.current_step()
        protos = [
            summary_pb.metric_epoch_pb(name, values, epoch)
            for name, values in self.epoch_values.items() if values
        ]
        for name, value in (extra or {}).items():
            v = as_float(value)
            if v is not None:
                protos.append(summary_pb.metric_pb(name, v, epoch))
        self.write_protos(protos, step)

    # -------------------------------------------------------------- writing

    def write_protos(self, protos: list, step: int) -> None:
        self.write_steps([(step, protos)])

    def write_steps(self, batches: Sequence[tuple[int, list]]) -> None:
        """Write each ``(step, Summary protos)``: one event per step, all in one TensorFlow
        call (a call per step was most of a drain's time)."""
        batches = [(step, protos) for step, protos in batches if protos]
        if not batches or self.writer is None:
            return
        merged = [summary_pb2.Summary(value=[v for p in protos for v in p.value])
                  for _, protos in batches]
        if self._write_fn is None or self._write_fn[0] is not self.writer:
            self._write_fn = (self.writer, _steps_writer(self.writer))
        self._write_fn[1](tf.constant([m.SerializeToString() for m in merged]),
                          tf.constant([step for step, _ in batches], tf.int64))

    def flush(self) -> None:
        self._last_flush = time.monotonic()
        if self.writer is not None and "writing" not in self.off:
            try:
                self.writer.flush()
            except Exception as e:  # a flush failure must not end training either
                self.stop_writing(e)


def _steps_writer(writer: Any) -> Callable:
    """``(protos[N], steps[N])``: ``protos[i]`` written at ``steps[i]`` by ``writer``."""

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string),
                                  tf.TensorSpec([None], tf.int64)])
    def write(protos, steps):
        with writer.as_default():
            for i in tf.range(tf.size(steps)):
                tf.summary.experimental.write_raw_pb(protos[i], step=steps[i])

    return write


def as_float(value: Any) -> float | None:
    """A scalar value as a float (None for anything that is not a number)."""
    try:
        return float(np.asarray(value))
    except (TypeError, ValueError):
        return None


_WRITER_ERROR = re.compile(r"SummaryWriter|WriteRawProtoSummary|WriteSummary|tfevents|events file")


def _short_error(error: Exception) -> str:
    """One line of an error: TensorFlow's graph-execution tracebacks left out."""
    text = getattr(error, "message", None) or str(error)
    lines = [ln.strip() for ln in text.splitlines()]
    lines = [re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", ln) for ln in lines
             if ln and not ln.startswith(("File \"", "Detected at node", "Graph execution error",
                                          "[[{{node", "[Op:"))]
    short = " ".join(lines[:2]) or type(error).__name__
    return short if len(short) <= 300 else short[:297] + "..."
