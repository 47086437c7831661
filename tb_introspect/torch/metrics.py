"""The per-step metric values (loss and the others ``step`` is given), held until the
pipeline drains them: a step keeps a device copy of each value (tensors stay on the device,
unread), and a drain stacks them into one device tensor, copied to the host once."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from tb_introspect.pipeline.metrics import METRIC_ROWS, MetricCells
from tb_introspect.torch.ranks import Ranks


class MetricRing(MetricCells):
    """``MetricCells`` whose tensors stay on the device (a device write per value cost a
    small model's step tens of microseconds); ``read`` stacks them."""

    def __init__(self, device: torch.device, rows: int = METRIC_ROWS) -> None:
        super().__init__(rows)
        self.device = device

    def keep(self, name: str, value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return float(value)
        if value.numel() != 1:
            raise ValueError(f"metric {name!r} is a tensor of shape"
                             f" {tuple(value.shape)}; a metric is one number")
        # A copy, not the tensor: code after step() may change it in place (an
        # all-reduce of the loss, a mul_, an optimizer reusing a buffer), and the
        # value logged must be the one given. On the device: no host sync.
        return value.detach().clone()

    def read(self, ranks: Ranks) -> tuple[list[str], np.ndarray, np.ndarray]:
        """(names, totals, counts) on the host, every rank's summed (a collective); no
        device sync while no metric was recorded."""
        if not self.names:
            return [], self.counts.copy(), self.counts.copy()
        return list(self.names), ranks.summed(self._totals()), self.counts * ranks.world

    def _totals(self) -> torch.Tensor:
        """``[rows, names]`` float64 on the device: the kept tensors stacked per dtype (one
        op each), the numbers added from the host."""
        numbers, cells = self.numbers()
        kept: dict[tuple[torch.dtype, torch.device], tuple[list, list]] = {}
        for at, value in cells:
            index, values = kept.setdefault((value.dtype, value.device), ([], []))
            index.append(at)
            values.append(value.reshape(()))
        totals = torch.from_numpy(numbers).to(self.device)
        for at, values in kept.values():
            index = torch.tensor(at, device=self.device)
            totals.index_copy_(0, index, torch.stack(values).to(self.device, torch.float64))
        return totals.reshape(self.rows, len(self.names))
