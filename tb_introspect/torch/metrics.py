"""The per-step metric values (loss and the others ``step`` is given), held until the
pipeline drains them: a step keeps a device copy of each value (tensors stay on the device,
unread), and a drain stacks them into one device tensor, copied to the host once."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from tb_introspect.torch.ranks import Ranks

#: Steps of per-step metric values held between two copies to the host.
METRIC_ROWS = 1024


class MetricRing:
    """A row per step (``step % rows``), a column per metric name in order of first sight;
    ``counts`` (host) marks the cells a step wrote. A step only keeps its values (a device
    write per value cost a small model's step tens of microseconds); ``read`` builds the
    ``[rows, names]`` totals from them."""

    def __init__(self, device: torch.device, rows: int = METRIC_ROWS) -> None:
        self.rows = rows
        self.device = device
        self.names: list[str] = []
        self.counts = np.zeros((rows, 0))
        self._cells: list[dict[int, torch.Tensor | float]] = [{} for _ in range(rows)]

    def record(self, steps_done: int, values: dict[str, Any]) -> None:
        """Keep step ``steps_done + 1``'s ``values`` (numbers, or one-value tensors)."""
        row = steps_done % self.rows
        cells = self._cells[row] = {}
        self.counts[row] = 0
        for name, value in values.items():
            if name not in self.names:
                self.names.append(name)
                self.counts = np.concatenate([self.counts, np.zeros((self.rows, 1))], axis=1)
            m = self.names.index(name)
            if isinstance(value, torch.Tensor):
                if value.numel() != 1:
                    raise ValueError(f"metric {name!r} is a tensor of shape"
                                     f" {tuple(value.shape)}; a metric is one number")
                # A copy, not the tensor: code after step() may change it in place (an
                # all-reduce of the loss, a mul_, an optimizer reusing a buffer), and the
                # value logged must be the one given. On the device: no host sync.
                cells[m] = value.detach().clone()
            else:
                cells[m] = float(value)
            self.counts[row, m] = 1

    def read(self, ranks: Ranks) -> tuple[list[str], np.ndarray, np.ndarray]:
        """(names, totals, counts) on the host, every rank's summed (a collective); no
        device sync while no metric was recorded."""
        if not self.names:
            return [], self.counts.copy(), self.counts.copy()
        return list(self.names), ranks.summed(self._totals()), self.counts * ranks.world

    def _totals(self) -> torch.Tensor:
        """``[rows, names]`` float64 on the device: the kept tensors stacked per dtype (one
        op each), the numbers added from the host."""
        numbers = np.zeros((self.rows, len(self.names)))
        kept: dict[tuple[torch.dtype, torch.device], tuple[list, list]] = {}
        for row, cells in enumerate(self._cells):
            for m, value in cells.items():
                if isinstance(value, float):
                    numbers[row, m] = value
                else:
                    at, values = kept.setdefault((value.dtype, value.device), ([], []))
                    at.append(row * len(self.names) + m)
                    values.append(value.reshape(()))
        totals = torch.from_numpy(numbers).to(self.device).reshape(-1)
        for at, values in kept.values():
            index = torch.tensor(at, device=self.device)
            totals.index_copy_(0, index, torch.stack(values).to(self.device, torch.float64))
        return totals.reshape(self.rows, len(self.names))
