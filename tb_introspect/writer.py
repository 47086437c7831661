"""Numpy-only event writer for tb-introspect summaries (no TensorFlow).

Events go through the package's one ``pipeline.sink.EventSink`` (no TensorFlow; a local
directory or a bucket URL such as ``s3://bucket/runs/a``).

View summaries (format version 3): the statistics added with ``add_tensor_stats`` /
``add_stats_vector`` are held per step, and each view's VIEW_SUMMARY of a step is written
when a tensor of another step arrives, or on ``flush()`` / ``close()``. A flush therefore
closes its step's summaries: a tensor added at that step after the flush is written to its
own tag only (with a warning), so that no step gets two summary points. Protos written with
``add_summary`` are not summarised (``summary_pb.view_summary_pb`` builds one).
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Sequence
from types import TracebackType

import numpy as np
from tensorboard.compat.proto import event_pb2, summary_pb2

from tb_introspect import metadata, slots, stats_np, summary_pb
from tb_introspect.pipeline.sink import EventSink


def tensor_stats_pb_from_array(
    array,
    *,
    view: str,
    name: str,
    layer: str = "",
    depth: int = 0,
    cadence: str = "step",
    epoch: int = 0,
    quantiles: Sequence[float] = slots.DEFAULT_QUANTILES,
    sample_size: int | None = None,
    seed: int | None = None,
    extras: dict[str, float] | None = None,
) -> summary_pb2.Summary:
    """Compute the statistics of ``array`` with numpy (``stats_np``) and wrap them in a
    Summary (``summary_pb.tensor_stats_pb``), for ``add_summary`` or any other writer.

    ``sample_size=None`` (the default here) gives exact percentiles; ``extras``
    fills view slots such as ``update_ratio`` / ``cos_prev`` by name.
    """
    a = np.asarray(array)
    vec = stats_np.tensor_stats(
        a, view, quantiles=quantiles, sample_size=sample_size, seed=seed, name=name
    )
    vec = summary_pb.fill_slots(vec, view, quantiles, epoch=epoch, **(extras or {}))
    return summary_pb.tensor_stats_pb(
        vec, view=view, name=name, layer=layer, depth=depth, shape=a.shape,
        dtype=str(a.dtype), cadence=cadence, quantiles=quantiles,
    )


class NumpyWriter:
    """Writes tb-introspect summaries of numpy arrays to an event file in ``logdir``.

    Usable from any framework (PyTorch: pass ``tensor.detach().cpu().numpy()``).
    Each instance writes its own ``events.out.tfevents.*`` file. ``logdir`` may be a bucket
    URL (``s3://bucket/runs/a``): each ``flush`` then puts what is new as one more object,
    at most one per ``flush_secs`` (default 60 s; docs/hosting.md).
    """

    def __init__(self, logdir: str | os.PathLike, filename_suffix: str = "", *,
                 flush_secs: float | None = None) -> None:
        self.logdir = os.fspath(logdir)
        self._sink = EventSink(self.logdir, filename_suffix, upload_secs=flush_secs)
        self.path = self._sink.path
        # The step whose vectors are held for the view summaries: view -> tag -> vector, and
        # each view's quantiles and cadence; a step whose summaries are written is ``_done``.
        self._summaries = summary_pb.ViewSummaries()
        self._pending_lock = threading.Lock()
        self._pending_step: int | None = None
        self._pending: dict[str, dict[str, np.ndarray]] = {}
        self._pending_layout: dict[str, tuple[tuple[float, ...], str]] = {}
        self._done: int | None = None
        self._warned_late = False

    # ------------------------------------------------------------------ raw

    def _write_event(self, event: event_pb2.Event) -> None:
        if self._sink.closed:
            raise ValueError(f"NumpyWriter for {self.logdir!r} is closed")
        self._sink.add_event(event)

    def add_summary(
        self, summary: summary_pb2.Summary, step: int, wall_time: float | None = None
    ) -> None:
        """Write any ``Summary`` proto at ``step``."""
        self._write_event(
            event_pb2.Event(
                wall_time=time.time() if wall_time is None else wall_time,
                step=int(step),
                summary=summary,
            )
        )

    # ------------------------------------------------------------------ tb-introspect

    def add_tensor_stats(
        self,
        array,
        step: int,
        *,
        view: str,
        name: str,
        layer: str = "",
        depth: int = 0,
        cadence: str = "step",
        epoch: int = 0,
        quantiles: Sequence[float] = slots.DEFAULT_QUANTILES,
        sample_size: int | None = None,
        seed: int | None = None,
        extras: dict[str, float] | None = None,
    ) -> np.ndarray:
        """Compute and write the statistics of ``array``; returns the packed vector."""
        summary = tensor_stats_pb_from_array(
            array, view=view, name=name, layer=layer, depth=depth, cadence=cadence,
            epoch=epoch, quantiles=quantiles, sample_size=sample_size, seed=seed,
            extras=extras,
        )
        self.add_summary(summary, step)
        vector = summary_pb.vector_of(summary)
        self._hold(step, view, name, vector, quantiles, cadence)
        return vector

    def add_stats_vector(
        self,
        vector,
        step: int,
        *,
        view: str,
        name: str,
        layer: str = "",
        depth: int = 0,
        shape: Sequence[int | None] = (),
        dtype: str = "float32",
        cadence: str = "step",
        quantiles: Sequence[float] = slots.DEFAULT_QUANTILES,
    ) -> None:
        """Write an already packed statistics vector."""
        self.add_summary(
            summary_pb.tensor_stats_pb(
                vector, view=view, name=name, layer=layer, depth=depth, shape=shape,
                dtype=dtype, cadence=cadence, quantiles=quantiles,
            ),
            step,
        )
        self._hold(step, view, name, np.asarray(vector, dtype=np.float64).reshape(-1),
                   quantiles, cadence)

    def add_metric(self, name: str, value: float, step: int, *, epoch: int = 0,
                   loss: str = "") -> None:
        """Write one per-step value of a loss or metric; ``loss``: the training loss's
        description (``loss_field.loss_json``), for the ``loss`` metric."""
        self.add_summary(summary_pb.metric_pb(name, value, epoch=epoch, loss=loss), step)

    def add_metric_epoch(
        self, name: str, values: Sequence[float], step: int, *, epoch: int, loss: str = ""
    ) -> None:
        """Write the per-epoch band of the per-step ``values`` of a metric."""
        self.add_summary(summary_pb.metric_epoch_pb(name, values, epoch=epoch, loss=loss),
                         step)

    def add_activity(
        self,
        name: str,
        channel_rates: Sequence[float] | np.ndarray,
        step: int,
        *,
        spatial_rates: Sequence[float] | np.ndarray = (),
        samples: float,
        epoch: int,
        layer: str = "",
        depth: int = 0,
        shape: Sequence[int | None] = (),
    ) -> None:
        """Write one epoch's activation rate of each channel and spatial position of a layer
        output (``summary_pb.activity_value``: its metadata with the tag's first map in the
        file)."""
        self.add_summary(summary_pb.encode([self._summaries.activity(
            channel_rates, spatial_rates, name=name, samples=samples, epoch=epoch,
            layer=layer, depth=depth, shape=shape)]), step)

    # ------------------------------------------------------------------ view summaries

    def _hold(self, step: int, view: str, name: str, vector: np.ndarray,
              quantiles: Sequence[float], cadence: str) -> None:
        """Keep ``vector`` for the view summaries of ``step``."""
        step = int(step)
        with self._pending_lock:
            if step != self._pending_step:
                self._emit()
                if step == self._done:
                    if not self._warned_late:
                        self._warned_late = True
                        warnings.warn(
                            f"tb_introspect: {metadata.stats_tag(view, name)} added at step"
                            f" {step} after that step's view summaries were written (by"
                            " flush() or a tensor of another step): it is in its own tag only",
                            RuntimeWarning, stacklevel=3)
                    return
                self._pending_step = step
            layout = self._pending_layout.setdefault(view, (tuple(quantiles), cadence))
            # One matrix per view: a tensor of other percentile points stays out of it.
            if layout[0] == tuple(quantiles):
                self._pending.setdefault(view, {})[metadata.stats_tag(view, name)] = vector

    def _emit(self) -> None:
        """Write the held step's view summaries (caller holds ``_pending_lock``)."""
        step, pending, layout = self._pending_step, self._pending, self._pending_layout
        if step is None:
            return
        self._pending_step, self._pending, self._pending_layout = None, {}, {}
        self._done = step
        for view, vectors in pending.items():
            quantiles, cadence = layout[view]
            value = self._summaries.summary(
                view, list(vectors), np.stack(list(vectors.values())),
                quantiles=quantiles, cadence=cadence)
            if value is not None:
                self.add_summary(summary_pb.encode([value]), step)

    # ------------------------------------------------------------------ lifecycle

    def flush(self) -> None:
        """Write the held step's view summaries and flush the file."""
        with self._pending_lock:
            if not self._sink.closed:
                self._emit()
        self._sink.flush()

    def close(self) -> None:
        """Write the held step's view summaries and close the file (closed also when
        writing them fails)."""
        try:
            with self._pending_lock:
                if not self._sink.closed:
                    self._emit()
        finally:
            self._sink.close()

    def __enter__(self) -> NumpyWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
