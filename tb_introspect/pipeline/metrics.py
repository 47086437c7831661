"""Per-step losses and metrics: the ring a step writes on the device, read on the host.

A collector keeps ``rows`` steps of per-metric totals and counts on its device (row
``(step - 1) % rows``), so a training step never waits for the host. The host copies the
ring now and then (``Ring``) and writes each step's value, ``total / count``; a metric's
values of a window (an epoch, or ``window=N`` steps) become its band at the window's end.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tb_introspect import summary_pb

#: Steps of per-step metric values a front-end holds between two copies to the host.
METRIC_ROWS = 1024


class MetricCells:
    """The per-step metric values a front-end keeps until the pipeline drains them: a row
    per step (``step % rows``), a column per metric name in order of first sight;
    ``counts`` marks the cells a step wrote. A value stays as the front-end keeps it
    (``keep``: a device copy of a tensor, unread); ``totals`` makes the ``[rows, names]``
    host matrix of them."""

    def __init__(self, rows: int = METRIC_ROWS) -> None:
        self.rows = rows
        self.names: list[str] = []
        self.counts = np.zeros((rows, 0))
        self.cells: list[dict[int, Any]] = [{} for _ in range(rows)]

    def keep(self, name: str, value: Any) -> Any:
        """What the cell holds of ``value`` (a number here; a front-end's tensors)."""
        return float(value)

    def record(self, steps_done: int, values: Mapping[str, Any]) -> None:
        """Keep step ``steps_done + 1``'s ``values``."""
        row = steps_done % self.rows
        cells = self.cells[row] = {}
        self.counts[row] = 0
        for name, value in values.items():
            if name not in self.names:
                self.names.append(name)
                self.counts = np.concatenate([self.counts, np.zeros((self.rows, 1))], axis=1)
            m = self.names.index(name)
            cells[m] = self.keep(name, value)
            self.counts[row, m] = 1

    def numbers(self) -> tuple[np.ndarray, list[tuple[int, Any]]]:
        """The ``[rows * names]`` totals of the cells that hold numbers, and the flat index
        and value of every other cell (a front-end's tensors)."""
        numbers = np.zeros(self.rows * len(self.names))
        kept = []
        for row, cells in enumerate(self.cells):
            for m, value in cells.items():
                at = row * len(self.names) + m
                if isinstance(value, float):
                    numbers[at] = value
                else:
                    kept.append((at, value))
        return numbers, kept


class Ring:
    """The host side of a collector's metric ring: what was read, the epoch's values."""

    def __init__(self) -> None:
        self.last_step = 0  # the last step whose values were written
        self.epoch_values: dict[str, list[float]] = {}  # of the window
        #: The training loss's description (``loss_field.loss_json``), written in the
        #: metadata of the ``loss`` metric; set by the front-end before the first step.
        self.loss_info = ""

    def start(self, step: int) -> None:
        self.last_step = int(step)

    def begin_window(self) -> None:
        """A new window (an epoch, or ``window=N`` steps): its band starts empty."""
        self.epoch_values = {}

    begin_epoch = begin_window

    def steps(self, names: Sequence[str], step: int, total: np.ndarray, count: np.ndarray,
              epoch: int, running: Mapping[str, Any] | None = None
              ) -> list[tuple[int, list[summary_pb.Value]]]:
        """``(step, values)`` of every step after the last read up to ``step``, from a
        copy of the ring (``total``, ``count``: ``[rows, metrics]``). ``running`` holds
        metrics that are not running means (an AUC): their current value, at ``step``."""
        rows = total.shape[0]
        batches = []
        for s in range(max(self.last_step + 1, step - rows + 1), step + 1):
            row = (s - 1) % rows
            values = []
            for m, name in enumerate(names):
                n = count[row, m]
                if n > 0:
                    values.append(self._value(name, float(total[row, m] / n), epoch))
            batches.append((s, values))
        if running and step > self.last_step:
            batches.append((step, [self._value(name, v, epoch) for name, value in
                                   running.items() if (v := as_float(value)) is not None]))
        self.last_step = max(self.last_step, step)
        return batches

    def _value(self, name: str, value: float, epoch: int) -> summary_pb.Value:
        self.epoch_values.setdefault(name, []).append(value)
        return summary_pb.metric_value(name, value, epoch, self._loss(name))

    def _loss(self, name: str) -> str:
        return self.loss_info if name == "loss" else ""

    def epoch_bands(self, epoch: int, extra: Mapping[str, Any] | None = None
                    ) -> list[summary_pb.Value]:
        """Each metric's band over the window (an epoch's, or ``window=N`` steps'), and
        ``extra`` values (``val_loss``) as written."""
        out = [summary_pb.metric_epoch_value(name, values, epoch, self._loss(name))
               for name, values in self.epoch_values.items() if values]
        for name, value in (extra or {}).items():
            v = as_float(value)
            if v is not None:
                out.append(summary_pb.metric_value(name, v, epoch))
        return out


def as_float(value: Any) -> float | None:
    """A scalar (a number, a numpy or framework tensor of one value) as a float; None for
    anything else."""
    try:
        if hasattr(value, "detach"):  # a torch tensor: its mean, on the host
            value = value.detach().float().mean().item()
        array = np.asarray(value)
        # float() of a shape-(1,) array is a TypeError since numpy 2.4: take its one value.
        return float(array.item() if array.size == 1 else array)
    except (TypeError, ValueError, RuntimeError):
        return None
