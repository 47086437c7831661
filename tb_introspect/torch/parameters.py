"""The variable and gradient views of a PyTorch model's trainable parameters: the window's
gradient sums in one flat float32 device buffer, the non-finite counts of the steps the
optimizer skipped, and the weights, copied to the host when a point is logged.

A parameter split over ranks (a ``DTensor``: FSDP2, tensor parallelism; ``sharding``) is
read as the block this rank holds: its gradient sum is the block's, and at a point every
rank hands its blocks' states and partial sums (``pipeline.params.Params.local_vector``)
to the point's one exchange; rank 0 merges them. Whole parameters (one process, DDP's
replicas) are read on rank 0 only."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from tb_introspect.pipeline import params
from tb_introspect.pipeline.failures import Part
from tb_introspect.pipeline.plan import Plan
from tb_introspect.pipeline.point import Point
from tb_introspect.torch import private, sharding
from tb_introspect.torch.modules import ParamSpec
from tb_introspect.torch.ranks import Ranks, host_copy


class ParameterViews:
    """The gradient sums (``gradient`` view wanted, else None) and the host side that makes
    both views' blocks (``pipeline.params.Params``)."""

    def __init__(self, plan: Plan, specs: Sequence[ParamSpec], device: torch.device,
                 ranks: Ranks) -> None:
        self.plan = plan
        self.specs = list(specs)
        self.ranks = ranks
        try:
            reason = sharding.unreadable([f"{s.layer}.{s.name}" for s in self.specs],
                                         [s.param for s in self.specs])
            shards = [sharding.shard(s.param) for s in self.specs] if reason is None else []
        except ValueError as e:
            reason, shards = (f"a parameter's {e} cannot be read; the variable and gradient"
                              " views are off (layer outputs go on)"), []
        if reason is not None:
            plan.failures.warn_once("unreadable parameters", reason)
            for view in ("variable", "gradient"):
                plan.failures.switch_off(Part(view))
            self.specs, plan.variables = [], []
        self.shards = shards
        self.sharded = any(sh is not None for sh in shards)
        # DTensor gradients (a mesh of one process holds whole blocks, still as DTensors)
        self.dtensors = any(sharding.is_dtensor(s.param) for s in self.specs)
        self.reads_weights = plan.want("variable") and reason is None
        sums = plan.want("gradient") and reason is None
        local = [sharding.local(p.param) for p in self.specs]
        self.local_shapes = [tuple(t.shape) for t in local]
        sizes = [t.numel() for t in local]
        self.offsets = np.cumsum([0, *sizes])[:-1].tolist()
        self.sizes = sizes
        self.sums = torch.zeros(sum(sizes), dtype=torch.float32, device=device) if sums else None
        # each parameter's slice of ``sums``, shaped like its local block (the optimizer
        # hook adds into it)
        self._slices = ([self.sums[o:o + n].view(shape) for o, n, shape in
                         zip(self.offsets, sizes, self.local_shapes, strict=True)]
                        if sums else [])
        self.skipped = (torch.zeros((len(self.specs), 3), dtype=torch.float64, device=device)
                        if sums else None)
        # every rank keeps its blocks of the sharded parameters; rank 0 the whole ones
        self.local_reads = ranks.writes or self.sharded
        self._host_side = params.Params(
            plan, self.weights() if self.reads_weights and self.local_reads else None,
            channels_first=True, shards=shards or None)

    def add(self) -> None:
        """Add the parameters' gradients to the sums (one fused add)."""
        if not self.dtensors:  # the common case, checked in one pass: a small model's
            # step is a few milliseconds, and this runs on every one of them
            grads = [s.param.grad for s in self.specs]
            if all(g is not None and g.dtype == torch.float32 and not g.is_sparse
                   for g in grads):
                private.add_all(self._slices, [g.detach() for g in grads])
                return
        accs, grads = [], []
        for spec, acc in zip(self.specs, self._slices, strict=True):
            g = spec.param.grad
            if g is None:
                continue
            if self.dtensors:
                g = sharding.local(g)
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
            g = sharding.local(g).detach()
            rows.append(torch.stack([torch.isnan(g).sum(), (g == math.inf).sum(),
                                     (g == -math.inf).sum()]).to(torch.float64))
        if rows:
            self.skipped.add_(torch.stack(rows))

    def local_payload(self, seed: int) -> tuple[np.ndarray, tuple]:
        """Every rank, at a point: this rank's share of the point's exchange (its sharded
        blocks' states and partial sums, and their skipped steps' counts; empty when no
        parameter is sharded), and the host copies ``add_blocks`` reads (weights, sums,
        skipped counts: taken now, as the next steps change the parameters). The sums
        start again."""
        weights = sums = skipped = None
        if self.local_reads:
            weights = self.weights() if self.reads_weights else None
            if self.sums is not None:
                flat = host_copy(self.sums)
                sums = [flat[o:o + n].reshape(shape) for o, n, shape in
                        zip(self.offsets, self.sizes, self.local_shapes, strict=True)]
                skipped = host_copy(self.skipped)
        if self.sums is not None:
            self.sums.zero_()
            self.skipped.zero_()
        pending = (weights, sums, skipped)
        if not self.sharded:
            return np.zeros(0), pending
        vec = self._host_side.local_vector(weights, sums, seed)
        if skipped is None:
            return vec, pending
        # each parameter's non-finite counts once: a block from each rank whose copy
        # counts, a whole parameter from rank 0
        keep = np.array([(sh.counts if sh is not None else self.ranks.writes)
                         for sh in self.shards], dtype=np.float64)
        return np.concatenate([vec, (skipped * keep[:, None]).reshape(-1)]), pending

    def add_blocks(self, out: Point, copies: np.ndarray | None, seed: int,
                   pending: tuple | None) -> None:
        """The writing rank: the window's gradient and variable blocks into ``out``, from
        its own copies (``pending``, from ``local_payload``) and (sharded parameters) every
        rank's ``local_payload`` (``copies``: ``[ranks, length]``). Runs beside training."""
        weights, sums, skipped = pending or (None, None, None)
        if not self.ranks.writes:
            return
        shared = None
        if self.sharded and copies is not None:
            if skipped is not None:
                n = skipped.size
                skipped = copies[:, copies.shape[1] - n:].sum(axis=0).reshape(skipped.shape)
                copies = copies[:, :copies.shape[1] - n]
            shared = copies
        if skipped is not None:
            out.skipped = skipped
        self._host_side.add_blocks(out, weights, sums, seed=seed, shared=shared)

    def weights(self) -> list[np.ndarray]:
        """Every monitored weight (this rank's block of a sharded one), one device-to-host
        copy."""
        if not self.specs:
            return []
        with torch.no_grad():
            flat = torch.cat([sharding.local(p.param).detach().reshape(-1).float()
                              for p in self.specs])
        # a new tensor on a CPU: its own memory is the copy (``host`` would copy again)
        copy = flat.numpy() if flat.device.type == "cpu" else host_copy(flat)
        return [copy[o:o + n].reshape(shape) for o, n, shape in
                zip(self.offsets, self.sizes, self.local_shapes, strict=True)]
