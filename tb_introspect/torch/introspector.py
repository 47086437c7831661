"""``Introspector``: the four views of a PyTorch training loop, in the tab's format.

Where each view comes from:

* layer outputs: a forward hook on every leaf module (module order gives the depth); a
  module called several times per forward pass adds every call;
* output gradients: a tensor hook on each captured output, on statistics steps;
* gradients: ``optimizer.register_step_pre_hook``, so they are read after
  ``DistributedDataParallel``'s all-reduce and ``GradScaler``'s unscale; a step the
  scaler skips adds its gradients' non-finite counts only;
* weights: read when a point is logged.

Between logged points everything stays on the device: gradient sums in one flat float32
buffer, the two output views' states in one float64 buffer each (``state``), losses in a
ring buffer. A logged point copies each buffer to the host once, merges ranks (rank 0
writes), and finalizes with numpy.
"""

from __future__ import annotations

import logging
import math
import os
import re
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from tb_introspect import metadata, summary_pb
from tb_introspect.collect.governor import Governor
from tb_introspect.collect.options import (
    DEFAULT_LOG_SAMPLE_SIZE,
    DEFAULT_OVERHEAD,
    DEFAULT_STATS_EVERY,
    DEFAULT_STEP_SAMPLE_SIZE,
    Options,
    check_log_dir,
)
from tb_introspect.torch import modules, params, state
from tb_introspect.writer import NumpyWriter

logger = logging.getLogger("tb_introspect")

_OUTPUT_VIEWS = ("output", "output_gradient")
#: Steps of per-step metric values held on the device between two copies to the host.
METRIC_ROWS = 1024
#: One tensor's statistics at a logged point: (view, tag, packed vector, Summary proto).
_Stats = tuple[str, str, np.ndarray, Any]


class Introspector:
    """Per-layer statistics of a PyTorch model while it trains, written to ``log_dir``.

    Call ``step(loss=...)`` after each optimizer step and ``end_epoch()`` after each
    epoch; ``close()`` at the end (or use it as a context manager), which also removes every
    hook. ``every`` is ``"epoch"`` (gradients summed over the epoch, outputs over all its
    batches, weights at its end) or ``N`` (the statistics of every N-th step). The other
    arguments are those of the Keras callback (``tb_introspect.keras.Introspect``);
    ``grad_scaler`` (a ``torch.amp.GradScaler``) unscales the output gradients.

    With ``every="epoch"``, layer outputs and output gradients get their statistics on each
    epoch's first step and then at most every ``stats_every``-th step, as rarely as keeps
    the time they add within ``overhead`` (a share of the plain step time, measured on the
    host; None: exactly every ``stats_every``-th step). The rectifier outputs' activity
    (dead rates, activity maps) counts every step.

    Example:
        >>> import tempfile, torch
        >>> from tb_introspect.torch import Introspector
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
        ...                             torch.nn.Linear(8, 1))
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> with Introspector(tempfile.mkdtemp(), model, opt, every="epoch") as intro:
        ...     for epoch in range(2):
        ...         for _ in range(5):
        ...             loss = ((model(torch.randn(16, 4)) - 1) ** 2).mean()
        ...             opt.zero_grad(); loss.backward(); opt.step()
        ...             intro.step(loss=loss)
        ...         intro.end_epoch()
    """

    def __init__(
        self,
        log_dir: str | os.PathLike,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        every: str | int = "epoch",
        *,
        views: Sequence[str] = metadata.VIEWS,
        sample_size: int = DEFAULT_LOG_SAMPLE_SIZE,
        step_sample_size: int = DEFAULT_STEP_SAMPLE_SIZE,
        stats_every: int = DEFAULT_STATS_EVERY,
        quantiles: Sequence[float] = metadata.DEFAULT_QUANTILES,
        flush_secs: float = 5.0,
        seed: int = 0,
        grad_scaler: Any = None,
        overhead: float | None = DEFAULT_OVERHEAD,
        initial_step: int = 0,
        initial_epoch: int = 0,
    ):
        self.options = Options.make(views, every, sample_size, step_sample_size, quantiles,
                                    flush_secs, seed, stats_every, overhead=overhead)
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError("optimizer must be a torch.optim.Optimizer or None,"
                            f" got {type(optimizer).__name__}")
        log_dir = os.fspath(log_dir)
        if "://" in log_dir:
            raise ValueError(f"log_dir {log_dir!r}: the PyTorch writer writes local"
                             " directories only")
        self.every = self.options.every
        self.stats_every = self.options.stats_every if self.every == "epoch" else 1
        self.quantiles = self.options.quantiles
        self.model = modules.unwrap(model)
        # DDP averages the ranks' gradients: the loss it trains is the mean of the ranks'
        # losses, so a rank's output gradient of that loss is its own divided by the ranks.
        self._out_grad_scale = 1.0
        self.optimizer = optimizer
        self.grad_scaler = grad_scaler
        self.rank, self.world = _rank_and_world()
        if isinstance(model, nn.parallel.DistributedDataParallel):
            self._out_grad_scale = 1.0 / self.world
        self.log_dir = check_log_dir(log_dir)
        self.writer = NumpyWriter(self.log_dir) if self.rank == 0 else None
        self._summaries = summary_pb.ViewSummaries()

        self.step_count = int(initial_step)
        self.epoch = int(initial_epoch)
        self._window = 0  # steps since the last logged point
        self._stat_steps = 0  # statistics steps among them
        # Which steps are statistics steps: the Keras callback's governor, fed with the host
        # time between two ``step`` calls.
        per_epoch = self.every == "epoch"
        self.governor = Governor(self.options.overhead if per_epoch else None,
                                 self.stats_every)
        self._t_last: float | None = None
        self._last_log = self.step_count
        self.off: set[str] = set()
        self._warned: set[str] = set()
        self._handles: list[Any] = []
        self._closed = False

        self.params = modules.param_specs(self.model)
        first = self.params[0].param if self.params else next(self.model.buffers(), None)
        self.device = first.device if first is not None else torch.device("cpu")
        self._salt = torch.zeros((), dtype=torch.int64, device=self.device)
        self._arange = torch.arange(self.options.step_sample_size, device=self.device)
        self._setup_params()
        self._setup_outputs()
        self._metric_names: list[str] = []
        self._metric_ring = torch.zeros((METRIC_ROWS, 0), dtype=torch.float64,
                                        device=self.device)
        self._pending: list[tuple[int, int, list[int]]] = []  # (step, epoch, metric columns)
        self._epoch_values: dict[str, list[float]] = {}
        self._phase = self._phase_of(self.step_count + 1)

    # ------------------------------------------------------------------ setup

    def _setup_params(self) -> None:
        want_g, want_v = "gradient" in self.options.views, "variable" in self.options.views
        total = sum(p.size for p in self.params)
        self._grad_buf = (torch.zeros(total, dtype=torch.float32, device=self.device)
                          if want_g else None)
        self._grad_views = ([self._grad_buf[p.offset:p.offset + p.size].view(p.param.shape)
                             for p in self.params] if want_g else [])
        self._skipped = (torch.zeros((len(self.params), 3), dtype=torch.float64,
                                     device=self.device) if want_g else None)
        self._grad_prev: list[np.ndarray] | None = None
        self._w_prev = self._read_weights() if want_v and self.rank == 0 else None
        self._grad_seen = False
        if want_g and self.optimizer is not None:
            self._handles.append(self.optimizer.register_step_pre_hook(self._pre_step))

    def _setup_outputs(self) -> None:
        self._out_views = [v for v in _OUTPUT_VIEWS if v in self.options.views]
        self.outputs = (modules.output_specs(self.model, self._is_named_rectifier)
                        if self._out_views else [])
        self._bufs = {v: torch.zeros(0, dtype=torch.float64, device=self.device)
                      for v in self._out_views}
        self._empty = {v: b.clone() for v, b in self._bufs.items()}
        self._epoch_activity: dict[str, np.ndarray] = {}
        self._compile_skipped = False
        for spec in self.outputs:
            self._handles.append(spec.module.register_forward_hook(self._forward_hook(spec)))

    def _is_named_rectifier(self, layer: str) -> bool:
        named = getattr(self.options, "rectifiers", None)
        if named is None:
            return False
        if isinstance(named, str):
            return re.fullmatch(named, layer) is not None
        return layer in named

    # ------------------------------------------------------------------ in the step

    def _phase_of(self, step: int) -> str:
        """What the forward passes of ``step`` (1-based) contribute: "stats" (every
        statistic), "activity" (the rectifier outputs' non-zero counts only) or "off"."""
        if self.every == "epoch":
            return "stats" if self.governor.choose() else "activity"
        return "stats" if step % int(self.every) == 0 else "off"

    def _time_step(self) -> None:
        """The host time of the step that just ended, for the governor (not timed across
        an epoch end: evaluation and logging run there)."""
        now = self.governor.clock()
        if self.every == "epoch":
            seconds = None if self._t_last is None else now - self._t_last
            self.governor.ran(self._phase == "stats", seconds)
        self._t_last = now

    def _counted(self) -> bool:
        """Training forward passes only: evaluation (``no_grad``, ``eval()``) is not."""
        return torch.is_grad_enabled() and self.model.training

    def _forward_hook(self, spec: modules.OutputSpec) -> Callable:
        def hook(module: nn.Module, inputs: Any, output: Any) -> None:
            if self._phase == "off" or not self._counted():
                return
            x = modules.first_tensor(output)
            if x is None or not (x.is_floating_point() and x.dim() >= 1):
                return
            try:
                self._on_output(spec, x)
            except Exception as e:  # never break training
                self._fail(f"output {spec.name}", e)
        return hook

    def _on_output(self, spec: modules.OutputSpec, x: torch.Tensor) -> None:
        full = self._phase == "stats"
        if not (full or spec.exact):
            return
        if not spec.segments:
            self._add_segments(spec, x)
        seg = spec.segments[self._out_views[0]]
        if state.widths(x.shape, spec.channels_first) != (seg.channels, seg.positions):
            self._warn_once(f"shape {spec.name}", f"layer output {spec.name}: shape"
                            f" {tuple(x.shape)} differs from the first call's {spec.shape};"
                            " calls of that shape are left out")
            return
        if "output" in self._bufs and f"output {spec.name}" not in self.off:
            state.fold(self._bufs["output"], spec.segments["output"], x,
                       self._salt.add_(1), full, self._arange)
        if (full and "output_gradient" in self._bufs and x.requires_grad
                and f"output_gradient {spec.name}" not in self.off):
            if torch.compiler.is_compiling():
                self._compile_skipped = True  # warned from the host, in step()
            else:
                x.register_hook(self._grad_hook(spec))

    def _grad_hook(self, spec: modules.OutputSpec) -> Callable:
        def hook(grad: torch.Tensor) -> None:
            try:
                if self.grad_scaler is not None:
                    scale = getattr(self.grad_scaler, "_scale", None)
                    if scale is not None:
                        grad = grad.float() / scale.to(grad.device)
                if self._out_grad_scale != 1.0:
                    grad = grad * self._out_grad_scale
                state.fold(self._bufs["output_gradient"], spec.segments["output_gradient"],
                           grad, self._salt.add_(1), True, self._arange)
            except Exception as e:
                self._fail(f"output_gradient {spec.name}", e)
        return hook

    def _add_segments(self, spec: modules.OutputSpec, x: torch.Tensor) -> None:
        """Append the segments of a layer output seen for the first time to the buffers."""
        spec.shape = state.channels_last_shape(x.shape, spec.channels_first)
        spec.dtype = str(x.dtype).replace("torch.", "")
        for view in self._out_views:
            seg = state.layout(x.shape, spec.channels_first, self.options.step_sample_size)
            seg.offset = self._bufs[view].numel()
            empty = seg.empty(self.device)
            self._bufs[view] = torch.cat([self._bufs[view], empty])
            self._empty[view] = torch.cat([self._empty[view], empty])
            spec.segments[view] = seg

    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._grad_seen = True
        if self._phase != "off" and "gradient view" not in self.off:
            try:
                self._add_gradients()
            except Exception as e:
                self._fail("gradient view", e)

    def _add_gradients(self) -> None:
        accs, grads = [], []
        for spec, acc in zip(self.params, self._grad_views, strict=True):
            g = spec.param.grad
            if g is None:
                continue
            if g.is_sparse:
                g = g.to_dense()
            accs.append(acc)
            grads.append(g.detach().float() if g.dtype != torch.float32 else g.detach())
        if accs:
            torch._foreach_add_(accs, grads)

    def _count_skipped(self) -> None:
        """A step whose optimizer never ran (``GradScaler`` found Inf/NaN): its gradients'
        non-finite values are counted, their sum is left out (it would be Inf)."""
        rows = []
        for spec in self.params:
            g = spec.param.grad
            if g is None:
                rows.append(torch.zeros(3, dtype=torch.float64, device=self.device))
                continue
            g = g.detach()
            rows.append(torch.stack([torch.isnan(g).sum(), (g == math.inf).sum(),
                                     (g == -math.inf).sum()]).to(torch.float64))
        if rows:
            self._skipped.add_(torch.stack(rows))

    def step(self, loss: Any = None, **metrics: Any) -> None:
        """After each optimizer step: records the step's ``loss`` and other scalar
        ``metrics`` (tensors stay on the device), writes a point when one is due."""
        if self._closed:
            return
        if "statistics" not in self.off:
            self._guard("gradient view", self._gradients_of_step)
        values = dict(metrics)
        if loss is not None:
            values = {"loss": loss, **values}
        self._guard("metrics", self._record_metrics, values)
        self._time_step()
        if self._phase == "stats":
            self._stat_steps += 1
        self.step_count += 1
        self._window += 1
        if self._compile_skipped:
            self._warn_once("compile", "torch.compile: output gradients are not captured"
                            " inside a compiled graph (AOT autograd cannot compile a tensor hook"
                            " that updates the statistics); the output_gradient view is off"
                            " under compile, the other views go on")
        if self.every != "epoch":
            last = self.step_count - self.step_count % int(self.every)
            if last > self._last_log:
                self.governor.timed_log(self._guard, "statistics", self._log, last)
        if len(self._pending) >= METRIC_ROWS:
            self._guard("metrics", self._drain)
        self._phase = self._phase_of(self.step_count + 1)

    def _gradients_of_step(self) -> None:
        if self._grad_buf is None:
            return
        if self.optimizer is None:
            if self._phase != "off":
                self._add_gradients()
        elif not self._grad_seen and self._phase != "off" and any(
                p.param.grad is not None for p in self.params):
            self._count_skipped()
        self._grad_seen = False

    def _record_metrics(self, values: dict[str, Any]) -> None:
        cols = []
        for name, value in values.items():
            if name not in self._metric_names:
                self._metric_names.append(name)
                ring = self._metric_ring
                self._metric_ring = torch.cat(
                    [ring, torch.zeros((METRIC_ROWS, 1), dtype=ring.dtype, device=ring.device)],
                    dim=1)
            m = self._metric_names.index(name)
            row = len(self._pending) % METRIC_ROWS
            cell = self._metric_ring[row, m]
            if isinstance(value, torch.Tensor):
                cell.copy_(value.detach().reshape(()))
            else:
                cell.fill_(float(value))
            cols.append(m)
        self._pending.append((self.step_count + 1, self.epoch, cols))

    # ------------------------------------------------------------------ host side

    def end_epoch(self, **metrics: Any) -> None:
        """After each epoch: the epoch's statistics (``every="epoch"``), activity maps and
        metric bands; ``metrics`` (e.g. ``val_loss=0.3``) are written at this step."""
        if self._closed:
            return
        self._guard("metrics", self._drain)
        if self.every == "epoch" and self.step_count > self._last_log:
            self.governor.timed_log(self._guard, "statistics", self._log, self.step_count)
        self._guard("statistics", self._write_activity)
        self._guard("metrics", self._write_epoch_metrics, metrics)
        self._flush()
        self.epoch += 1
        self._epoch_values = {}
        self._t_last = None
        self.governor.begin_window()
        self._phase = self._phase_of(self.step_count + 1)

    def _log(self, step: int) -> None:
        """One logged point at TensorBoard ``step``: copy, merge ranks, finalize, write,
        reset. Every rank calls it at the same steps (the output buffers are gathered)."""
        self._guard("metrics", self._drain)
        point: list[_Stats] = []
        point += self._output_protos()
        if self._grad_buf is not None:
            point += self._gradient_protos()
        if "variable" in self.options.views and self.rank == 0:
            point += self._variable_protos()
        self._last_log = step
        self._window = self._stat_steps = 0
        self._write([pb for _, _, _, pb in point] + self._view_summaries(point), step)

    def _view_summaries(self, point: list[_Stats]) -> list:
        """Each view's VIEW_SUMMARY of one logged point."""
        protos = []
        for view in metadata.VIEWS:
            stats = [(tag, vec) for v, tag, vec, _ in point if v == view]
            summary = self._summaries.summary(
                view, [tag for tag, _ in stats], [vec for _, vec in stats],
                quantiles=self.quantiles, cadence=self._cadence)
            if summary is not None:
                protos.append(summary)
        return protos

    def _gathered(self, buf: torch.Tensor) -> np.ndarray:
        """``[ranks, length]``: every rank's copy of ``buf`` on rank 0 (one host copy)."""
        if self.world > 1:
            import torch.distributed as dist

            parts = [torch.empty_like(buf) for _ in range(self.world)]
            dist.all_gather(parts, buf.contiguous())
            return _host(torch.stack(parts))
        return _host(buf)[None]

    def _output_protos(self) -> list[_Stats]:
        protos: list[_Stats] = []
        for view in self._out_views:
            buf = self._bufs[view]
            host = self._gathered(buf) if buf.numel() else None
            buf.copy_(self._empty[view])
            if host is None or self.rank != 0:
                continue
            for spec in self.outputs:
                seg = spec.segments.get(view)
                if seg is None or f"{view} {spec.name}" in self.off:
                    continue
                merged = state.merge_ranks(host[:, seg.offset:seg.offset + seg.length], seg)
                if merged[0] == 0 and merged[len(state.ADD) - 1] == 0:
                    continue  # not called in this window
                if view == "output":
                    self._add_activity(spec, seg, merged)
                if merged[0] == 0:
                    continue
                vec = state.finalize(merged, seg, view, self.quantiles,
                                     activity_rates=view == "output")
                vec = summary_pb.fill_slots(vec, view, self.quantiles, epoch=self.epoch,
                                            **self._step_slots(view, spec))
                protos.append((view, metadata.stats_tag(view, spec.name), vec,
                               summary_pb.tensor_stats_pb(
                                   vec, view=view, name=spec.name, layer=spec.layer,
                                   depth=spec.depth, shape=spec.shape, dtype=spec.dtype,
                                   cadence=self._cadence, quantiles=self.quantiles)))
        return protos

    def _step_slots(self, view: str, spec: modules.OutputSpec) -> dict[str, float]:
        """The window's step counts, for the format versions that have those slots: how
        many steps the statistics and the activity came from, and the window's steps."""
        exact = spec.exact and self.every == "epoch"
        values = {"stats_steps": self._stat_steps, "steps": self._window,
                  "activity_steps": self._window if exact else self._stat_steps}
        fields = metadata.view_extra_fields(view, self.quantiles)
        return {k: float(v) for k, v in values.items() if k in fields}

    def _add_activity(self, spec: modules.OutputSpec, seg: state.Segment,
                      merged: np.ndarray) -> None:
        a = len(state.ADD)
        part = np.concatenate([merged[a - 1:a], merged[a:a + seg.channels + seg.positions]])
        prev = self._epoch_activity.get(spec.name)
        self._epoch_activity[spec.name] = part if prev is None else prev + part

    def _gradient_protos(self) -> list[_Stats]:
        if self.rank != 0:
            self._grad_buf.zero_()
            self._skipped.zero_()
            return []
        flat = _host(self._grad_buf)
        skipped = _host(self._skipped)
        self._grad_buf.zero_()
        self._skipped.zero_()
        gs = [flat[p.offset:p.offset + p.size].reshape(p.param.shape).copy()
              for p in self.params]
        self._gsums = gs
        keep = [i for i, p in enumerate(self.params) if f"gradient {p.name}" not in self.off]
        vecs = params.gradient_vectors(
            [gs[i] for i in keep],
            None if self._grad_prev is None else [self._grad_prev[i] for i in keep],
            skipped[keep], names=[self.params[i].name for i in keep], epoch=self.epoch,
            quantiles=self.quantiles, sample_size=self.options.sample_size)
        self._grad_prev = gs
        return [self._param_proto("gradient", self.params[i], v)
                for i, v in zip(keep, vecs, strict=True)]

    def _variable_protos(self) -> list[_Stats]:
        ws = self._read_weights()
        gsums = getattr(self, "_gsums", None) if self._grad_buf is not None else None
        steps = float(self.every) if isinstance(self.every, int) else 1.0
        vecs = params.variable_vectors(
            ws, self._w_prev, gsums, names=[p.name for p in self.params], epoch=self.epoch,
            quantiles=self.quantiles, sample_size=self.options.sample_size,
            steps_per_sample=steps, seed=self.options.seed + self.step_count)
        self._w_prev = [w.astype(np.float64) for w in ws]
        self._gsums = None
        return [self._param_proto("variable", p, v)
                for p, v in zip(self.params, vecs, strict=True)
                if f"variable {p.name}" not in self.off]

    def _read_weights(self) -> list[np.ndarray]:
        """Every monitored weight, one device-to-host copy."""
        if not self.params:
            return []
        with torch.no_grad():
            flat = torch.cat([p.param.detach().reshape(-1).float() for p in self.params])
        host = _host(flat)
        return [host[p.offset:p.offset + p.size].reshape(p.param.shape) for p in self.params]

    def _param_proto(self, view: str, p: modules.ParamSpec, vec: np.ndarray) -> _Stats:
        return view, metadata.stats_tag(view, p.name), vec, summary_pb.tensor_stats_pb(
            vec, view=view, name=p.name, layer=p.layer, depth=p.depth,
            shape=tuple(p.param.shape), dtype=str(p.param.dtype).replace("torch.", ""),
            cadence=self._cadence, quantiles=self.quantiles)

    @property
    def _cadence(self) -> str:
        return "epoch" if self.every == "epoch" else "step"

    def _write_activity(self) -> None:
        act, self._epoch_activity = self._epoch_activity, {}
        protos = []
        for spec in self.outputs:
            part = act.get(spec.name)
            seg = spec.segments.get("output")
            if part is None or seg is None or part[0] <= 0 or (
                    seg.channels <= 1 and seg.positions == 0):
                continue
            c, p, count = seg.channels, seg.positions, part[0]
            protos.append(summary_pb.activity_pb(
                part[1:1 + c] * c / count, part[1 + c:1 + c + p] * max(p, 1) / count,
                name=spec.name, samples=count / (max(p, 1) * c), epoch=self.epoch,
                layer=spec.layer, depth=spec.depth, shape=spec.shape))
        self._write(protos, self.step_count)

    def _drain(self) -> None:
        """Write the per-step metric values held on the device (one copy)."""
        pending, self._pending = self._pending, []
        if not pending or not self._metric_names:
            return
        ring = self._metric_ring[:len(pending)]
        if self.world > 1:
            import torch.distributed as dist

            ring = ring.clone()
            dist.all_reduce(ring)
            ring /= self.world
        host = _host(ring)
        for row, (step, epoch, cols) in enumerate(pending):
            protos = []
            for m in cols:
                name, value = self._metric_names[m], float(host[row, m])
                self._epoch_values.setdefault(name, []).append(value)
                protos.append(summary_pb.metric_pb(name, value, epoch))
            self._write(protos, step)

    def _write_epoch_metrics(self, extra: dict[str, Any]) -> None:
        protos = [summary_pb.metric_epoch_pb(name, values, self.epoch)
                  for name, values in self._epoch_values.items() if values]
        for name, value in extra.items():
            v = float(value.detach().float().mean()) if isinstance(value, torch.Tensor) \
                else float(value)
            protos.append(summary_pb.metric_pb(name, v, self.epoch))
        self._write(protos, self.step_count)

    def _write(self, protos: list, step: int) -> None:
        if self.writer is None or "writing" in self.off:
            return
        try:
            for p in protos:
                self.writer.add_summary(p, step)
        except OSError as e:
            self.off.add("writing")
            self._warn_once("writing", f"cannot write to the log directory ({e}); logging is"
                            " off for the rest of training, training goes on")

    def _flush(self) -> None:
        if self.writer is not None and "writing" not in self.off:
            try:
                self.writer.flush()
            except OSError as e:
                self.off.add("writing")
                self._warn_once("writing", f"cannot write to the log directory ({e});"
                                " logging is off, training goes on")

    # ------------------------------------------------------------------ failures

    def _guard(self, part: str, fn: Callable, *args: Any) -> Any:
        """Run ``fn``; on error warn once and switch ``part`` off (training goes on)."""
        if part in self.off:
            return None
        try:
            return fn(*args)
        except Exception as e:
            self._fail(part, e)
            return None

    def _fail(self, part: str, error: BaseException) -> None:
        """Switch ``part`` off; one warning line for the first of the parts (tensors of one
        view) that fail the same way."""
        self.off.add(part)
        kind = part.split(" ")[0]
        self._warn_once(f"{kind} {type(error).__name__}: {error}",
                        f"{part} failed ({type(error).__name__}: {error}); it is off for the"
                        f" rest of training, as is any other {kind} failing the same way;"
                        " training goes on")

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(f"tb_introspect: {message}", RuntimeWarning, stacklevel=3)

    # ------------------------------------------------------------------ lifecycle

    def flush(self) -> None:
        """Write the pending metric values and flush the event file."""
        self._guard("metrics", self._drain)
        self._flush()

    def close(self) -> None:
        """Write what is pending, close the event file and remove every hook."""
        if self._closed:
            return
        self._guard("metrics", self._drain)
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._closed = True
        if self.writer is not None:
            self._flush()
            self.writer.close()
            self.writer = None

    def __enter__(self) -> Introspector:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _host(t: torch.Tensor) -> np.ndarray:
    """A host copy of ``t`` that later in-place resets of ``t`` leave alone (``.cpu()`` of
    a CPU tensor is the tensor itself)."""
    host = t.cpu()
    return (host.clone() if host is t else host).numpy()


def _rank_and_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1
