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
from tensorboard.compat.proto import summary_pb2

from tb_introspect import summary_pb


class Ring:
    """The host side of a collector's metric ring: what was read, the epoch's values."""

    def __init__(self) -> None:
        self.last_step = 0  # the last step whose values were written
        self.epoch_values: dict[str, list[float]] = {}  # of the window
        #: The training loss's description (``metadata.loss_json``), written in the
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
              ) -> list[tuple[int, list[summary_pb2.Summary]]]:
        """``(step, summaries)`` of every step after the last read up to ``step``, from a
        copy of the ring (``total``, ``count``: ``[rows, metrics]``). ``running`` holds
        metrics that are not running means (an AUC): their current value, at ``step``."""
        rows = total.shape[0]
        batches = []
        for s in range(max(self.last_step + 1, step - rows + 1), step + 1):
            row = (s - 1) % rows
            protos = []
            for m, name in enumerate(names):
                n = count[row, m]
                if n > 0:
                    protos.append(self._value(name, float(total[row, m] / n), epoch))
            batches.append((s, protos))
        if running and step > self.last_step:
            batches.append((step, [self._value(name, v, epoch) for name, value in
                                   running.items() if (v := as_float(value)) is not None]))
        self.last_step = max(self.last_step, step)
        return batches

    def _value(self, name: str, value: float, epoch: int) -> summary_pb2.Summary:
        self.epoch_values.setdefault(name, []).append(value)
        return summary_pb.metric_pb(name, value, epoch, self._loss(name))

    def _loss(self, name: str) -> str:
        return self.loss_info if name == "loss" else ""

    def epoch_bands(self, epoch: int, extra: Mapping[str, Any] | None = None
                    ) -> list[summary_pb2.Summary]:
        """Each metric's band over the window (an epoch's, or ``window=N`` steps'), and
        ``extra`` values (``val_loss``) as written."""
        protos = [summary_pb.metric_epoch_pb(name, values, epoch, self._loss(name))
                  for name, values in self.epoch_values.items() if values]
        for name, value in (extra or {}).items():
            v = as_float(value)
            if v is not None:
                protos.append(summary_pb.metric_pb(name, v, epoch))
        return protos


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
