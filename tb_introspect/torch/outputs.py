"""The layer outputs' and output gradients' statistics states on the device: one float64
buffer per view, a segment per monitored output (``state``), laid out as each output is
first seen, folded into by the hooks and read once per logged point."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from tb_introspect import stats_np
from tb_introspect.pipeline.failures import Failures, Part
from tb_introspect.pipeline.plan import Plan
from tb_introspect.pipeline.point import Block, Point
from tb_introspect.stats_np import segments
from tb_introspect.torch import private, state
from tb_introspect.torch.modules import OutputSpec
from tb_introspect.torch.ranks import host_copy

_ADDITIVE = len(segments.ADDITIVE_SLOTS)


class OutputStates:
    """The ``output`` and ``output_gradient`` views' buffers (those the plan wants), their
    empty copies a point resets them to, and the rectifier outputs' lean-step tallies.

    ``grad_scaler`` (a ``GradScaler``) unscales the output gradients; ``gradient_scale``
    multiplies them (DDP: a rank's share of the mean loss)."""

    def __init__(self, plan: Plan, specs: Sequence[OutputSpec], device: torch.device, *,
                 grad_scaler: Any = None, gradient_scale: float = 1.0) -> None:
        self.plan = plan
        self.failures: Failures = plan.failures
        self.specs = list(specs)
        self.views = plan.output_views
        self.device = device
        self.grad_scaler = grad_scaler
        self.gradient_scale = gradient_scale
        self.buffers = {v: torch.zeros(0, dtype=torch.float64, device=device)
                        for v in self.views}
        self.empty = {v: b.clone() for v, b in self.buffers.items()}
        self.tallies: dict[str, state.ActivityTally] = {}
        # the shape each exact output's lean calls are counted at by ``_count``
        self._counted: dict[str, torch.Size] = {}
        self.folds_output = "output" in self.buffers
        self.folds_gradients = "output_gradient" in self.buffers
        # Each (view, output) has its own draws' seed, advanced by each statistics fold:
        # seeds by call, not by order, so that a reentrant checkpoint's recompute, folded in
        # backward, draws what the plain pass would. Seeds in a step run consecutively
        # (``state._host_draws`` makes them in blocks of consecutive seeds).
        self._salt_stride = max(1, len(self.views) * len(self.specs))
        self.salts: dict[tuple[str, str], torch.Tensor] = {}
        self.arange = torch.arange(plan.options.step_sample_size, device=device)
        # The non-finite rule (``Phase``) is read on a CPU only: one sum tells there,
        # where a GPU would make each lean step wait for the device.
        self.checks_finite = device.type == "cpu"
        self.nonfinite_seen = False
        #: Outputs whose statistics fold also takes the kurtosis (set by the probes while
        #: their layer hooks are on), and what it took: name -> (the output folded, its
        #: kurtosis), until the probe of the same call reads it.
        self.kurtosis_of: set[str] = set()
        self.kurtosis: dict[str, tuple[torch.Tensor, float]] = {}

    def add(self, spec: OutputSpec, x: torch.Tensor, full: bool) -> bool:
        """Fold one call's output ``x`` (``full``: a statistics step's every part, else the
        activity counts). A lean step's output with NaN or Inf values is folded whole and
        marked for ``take_nonfinite`` (CPU only). False: left out, as its shape is not the
        first call's."""
        if not full and x.shape == self._counted.get(spec.name) and self._count(spec, x):
            return True
        if not spec.segments:
            self._add_segments(spec, x)
        seg = spec.segments[self.views[0]]
        if segments.widths(x.shape, spec.channels_first) != (seg.channels, seg.positions):
            self.failures.warn_once(f"shape {spec.name}", f"layer output {spec.name}: shape"
                                    f" {tuple(x.shape)} differs from the first call's"
                                    f" {spec.shape}; calls of that shape are left out")
            return False
        if self.folds_output and not self.failures.is_off("output", spec.name):
            finite = False
            if not full and self.checks_finite and not torch.compiler.is_compiling():
                finite = state.is_finite(x)
                if not finite:
                    full = self.nonfinite_seen = True
            salt = self.salts["output", spec.name]
            kurtosis = state.fold(self.buffers["output"], spec.segments["output"], x,
                                  salt.add_(self._salt_stride) if full else salt, full,
                                  self.arange, self.tallies.get(spec.name), finite=finite,
                                  kurtosis=full and spec.name in self.kurtosis_of)
            if kurtosis is not None:
                self.kurtosis[spec.name] = (x, kurtosis)
            if (finite and spec.name in self.tallies and x.dtype == torch.float32
                    and self.tallies[spec.name].accepts(x, spec.segments["output"])):
                self._counted[spec.name] = x.shape  # its next lean calls: ``_count``
        return True

    def _count(self, spec: OutputSpec, x: torch.Tensor) -> bool:
        """A lean call's exact activity counts the short way: an eager CPU float32 output
        of a shape a lean call already counted (``add`` checked it all then), finite. Its
        three kernels cost a small output less than the checks around them. False:
        ``add``'s way."""
        if torch.compiler.is_compiling() or self.failures.is_off("output", spec.name):
            return False
        xf = x.detach()
        if not math.isfinite(xf.sum()):
            return False  # the non-finite rule: ``add`` folds it whole
        self.tallies[spec.name].add(self.buffers["output"], spec.segments["output"], xf,
                                    finite=True)
        return True

    def take_nonfinite(self) -> bool:
        """Whether a lean step's output held NaN or Inf since the last call."""
        seen, self.nonfinite_seen = self.nonfinite_seen, False
        return seen

    def gradient_hook(self, spec: OutputSpec) -> Callable[[torch.Tensor], None]:
        """The tensor hook that folds ``spec``'s output gradient (made here so that it folds
        with no call in between)."""
        def hook(grad: torch.Tensor) -> None:
            try:
                if self.grad_scaler is not None:
                    scale = private.scaler_scale(self.grad_scaler)
                    if scale is not None:
                        grad = grad.float() / scale.to(grad.device)
                if self.gradient_scale != 1.0:
                    grad = grad * self.gradient_scale
                state.fold(self.buffers["output_gradient"], spec.segments["output_gradient"],
                           grad, self.salts["output_gradient", spec.name].add_(
                               self._salt_stride), True, self.arange)
            except Exception as e:  # never break training
                self.failures.fail(Part("output_gradient", spec.name), e)
        return hook

    def _add_segments(self, spec: OutputSpec, x: torch.Tensor) -> None:
        """Append the segments of a layer output seen for the first time to the buffers."""
        spec.shape = segments.channels_last_shape(x.shape, spec.channels_first)
        spec.dtype = str(x.dtype).replace("torch.", "")
        for view in self.views:
            seg = segments.layout(x.shape, spec.channels_first,
                               self.plan.options.step_sample_size)
            seg.offset = self.buffers[view].numel()
            empty = torch.from_numpy(seg.empty()).to(self.device)
            self.buffers[view] = torch.cat([self.buffers[view], empty])
            self.empty[view] = torch.cat([self.empty[view], empty])
            spec.segments[view] = seg
            first = self.views.index(view) * len(self.specs) + self.specs.index(spec)
            self.salts[view, spec.name] = torch.tensor(first, device=self.device)
        if spec.exact and "output" in spec.segments:
            self.tallies[spec.name] = state.ActivityTally()

    def widths(self) -> dict[int, tuple[int, int]]:
        """Channels and positions of each output seen so far, by index."""
        widths = {}
        for j, spec in enumerate(self.specs):
            seg = spec.segments.get(self.views[0]) if self.views else None
            if seg is not None:
                widths[j] = (seg.channels, seg.positions)
        return widths

    def local_payload(self) -> tuple[np.ndarray, dict[str, int]]:
        """This rank's buffers, one host copy (every view's, in ``views`` order), and each
        view's length in it (an output first seen later lies beyond); the buffers start
        again."""
        for spec in self.specs:
            tally = self.tallies.get(spec.name)
            if tally is not None:
                tally.settle(self.buffers["output"], spec.segments["output"])
        lengths = {v: self.buffers[v].numel() for v in self.views}
        if not self.views:
            return np.zeros(0), lengths
        # a new tensor, which no reset below touches: its host copy needs no second copy
        flat = torch.cat([self.buffers[v] for v in self.views])
        copy = (flat.numpy() if flat.device.type == "cpu" else host_copy(flat))
        for view in self.views:
            self.buffers[view].copy_(self.empty[view])
        return copy, lengths

    def add_blocks(self, out: Point, copies: np.ndarray, lengths: dict[str, int]) -> None:
        """The window's blocks and activity into ``out`` (the writing rank), from every
        rank's ``local_payload`` (``[ranks, length]``; ``lengths``: its views' lengths),
        the ranks' segments merged. Runs beside training: reads host copies only."""
        at = 0
        for view in self.views:
            n = lengths.get(view, 0)
            view_copies = copies[:, at:at + n]
            at += n
            if not n:
                continue
            specs, states = [], []
            for j, spec in enumerate(self.specs):
                seg = spec.segments.get(view)
                if (seg is None or seg.offset + seg.length > n
                        or not self.plan.writes(view, spec)):
                    continue
                merged = segments.merge_ranks(view_copies[:, seg.offset:seg.offset + seg.length],
                                           seg)
                activity = _ADDITIVE - 1  # act_count, then the channel and position counts
                if merged[0] == 0 and merged[activity] == 0:
                    continue  # not called in this window
                if view == "output":
                    out.activity[j] = merged[activity:_ADDITIVE + seg.channels
                                             + seg.positions].copy()
                if merged[0] == 0:
                    continue
                specs.append(spec)
                states.append(segments.to_state(merged, seg, activity_rates=view == "output"))
            if specs:
                out.blocks.append(Block(view, specs, stats_np.finalize_many(
                    states, view, quantiles=self.plan.options.quantiles)))
