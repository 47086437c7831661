"""The variable and gradient views of a PyTorch model's trainable parameters: the window's
gradient sums in one flat float32 device buffer, the non-finite counts of the steps the
optimizer skipped, and the weights, copied to the host when a point is logged."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from tb_introspect.pipeline import params
from tb_introspect.pipeline.plan import Plan
from tb_introspect.pipeline.point import Point
from tb_introspect.torch import private
from tb_introspect.torch.modules import ParamSpec
from tb_introspect.torch.ranks import Ranks, host


class ParameterViews:
    """The gradient sums (``gradient`` view wanted, else None) and the host side that makes
    both views' blocks (``pipeline.params.Params``, rank 0 only)."""

    def __init__(self, plan: Plan, specs: Sequence[ParamSpec], device: torch.device,
                 ranks: Ranks) -> None:
        self.plan = plan
        self.specs = list(specs)
        self.ranks = ranks
        self.reads_weights = plan.want("variable")
        sums = plan.want("gradient")
        total = sum(p.size for p in self.specs)
        self.sums = torch.zeros(total, dtype=torch.float32, device=device) if sums else None
        # each parameter's slice of ``sums``, shaped like it (the optimizer hook adds into it)
        self._slices = ([self.sums[p.offset:p.offset + p.size].view(p.param.shape)
                         for p in self.specs] if sums else [])
        self.skipped = (torch.zeros((len(self.specs), 3), dtype=torch.float64, device=device)
                        if sums else None)
        self._host_side = params.Params(
            plan, self.weights() if self.reads_weights and ranks.writes else None,
            channels_first=True)

    def add(self) -> None:
        """Add the parameters' gradients to the sums (one fused add)."""
        accs, grads = [], []
        for spec, acc in zip(self.specs, self._slices, strict=True):
            g = spec.param.grad
            if g is None:
                continue
            if g.is_sparse:
                g = g.to_dense()
            accs.append(acc)
            grads.append(g.detach().float() if g.dtype != torch.float32 else g.detach())
        if accs:
            private.add_all(accs, grads)

    def end_step(self, counted: bool, has_optimizer: bool, optimizer_ran: bool) -> None:
        """A training step ended. ``counted``: its gradients count (not an ``every=N`` step
        between two points). Without an optimizer its gradients are added now; with one that
        never ran (``GradScaler`` found Inf/NaN), their non-finite counts only."""
        if self.sums is None or not counted:
            return
        if not has_optimizer:
            self.add()
        elif not optimizer_ran and any(p.param.grad is not None for p in self.specs):
            self._count_skipped()

    def _count_skipped(self) -> None:
        """The gradients' non-finite values; their sum is left out (it would be Inf)."""
        rows = []
        for spec in self.specs:
            g = spec.param.grad
            if g is None:
                rows.append(torch.zeros(3, dtype=torch.float64, device=self.skipped.device))
                continue
            g = g.detach()
            rows.append(torch.stack([torch.isnan(g).sum(), (g == math.inf).sum(),
                                     (g == -math.inf).sum()]).to(torch.float64))
        if rows:
            self.skipped.add_(torch.stack(rows))

    def add_blocks(self, out: Point, seed: int) -> None:
        """The window's gradient and variable blocks into ``out`` (rank 0), one host copy
        each; the sums start again on every rank."""
        sums = self._read_sums(out) if self.sums is not None else None
        if self.ranks.writes:
            weights = self.weights() if self.reads_weights else None
            self._host_side.add_blocks(out, weights, sums, seed=seed)

    def _read_sums(self, out: Point) -> list[np.ndarray] | None:
        """Each parameter's gradient sum (rank 0; None elsewhere), and the skipped steps'
        counts into ``out``."""
        sums = None
        if self.ranks.writes:
            flat = host(self.sums)
            out.skipped = host(self.skipped)
            sums = [flat[p.offset:p.offset + p.size].reshape(p.param.shape).copy()
                    for p in self.specs]
        self.sums.zero_()
        self.skipped.zero_()
        return sums

    def weights(self) -> list[np.ndarray]:
        """Every monitored weight, one device-to-host copy."""
        if not self.specs:
            return []
        with torch.no_grad():
            flat = torch.cat([p.param.detach().reshape(-1).float() for p in self.specs])
        copy = host(flat)
        return [copy[p.offset:p.offset + p.size].reshape(p.param.shape) for p in self.specs]
