"""The per-step metric values (loss and the others ``step`` is given), held on the device
in a ring of rows until the pipeline drains them: a step writes no host copy."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from tb_introspect.torch.ranks import Ranks

#: Steps of per-step metric values held on the device between two copies to the host.
METRIC_ROWS = 1024


class MetricRing:
    """A row per step (``step % rows``), a column per metric name in order of first sight;
    ``counts`` (host) marks the cells a step wrote."""

    def __init__(self, device: torch.device, rows: int = METRIC_ROWS) -> None:
        self.rows = rows
        self.names: list[str] = []
        self.totals = torch.zeros((rows, 0), dtype=torch.float64, device=device)
        self.counts = np.zeros((rows, 0))

    def record(self, steps_done: int, values: dict[str, Any]) -> None:
        """Write step ``steps_done + 1``'s ``values`` (tensors stay on the device)."""
        row = steps_done % self.rows
        self.counts[row] = 0
        for name, value in values.items():
            if name not in self.names:
                self._add_column(name)
            m = self.names.index(name)
            cell = self.totals[row, m]
            if isinstance(value, torch.Tensor):
                cell.copy_(value.detach().reshape(()))
            else:
                cell.fill_(float(value))
            self.counts[row, m] = 1

    def _add_column(self, name: str) -> None:
        self.names.append(name)
        self.totals = torch.cat([self.totals, self.totals.new_zeros((self.rows, 1))], dim=1)
        self.counts = np.concatenate([self.counts, np.zeros((self.rows, 1))], axis=1)

    def read(self, ranks: Ranks) -> tuple[list[str], np.ndarray, np.ndarray]:
        """(names, totals, counts) on the host, every rank's summed (a collective); no
        device sync while no metric was recorded."""
        if not self.names:
            return [], self.counts.copy(), self.counts.copy()
        return list(self.names), ranks.summed(self.totals), self.counts * ranks.world
