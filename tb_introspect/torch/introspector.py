"""``Introspector``: the four views of a PyTorch training loop, in the tab's format.

Where each view comes from:

* layer outputs: a forward hook on every leaf module (module order gives the depth); a
  module called several times per forward pass adds every call. The hooks are on only for
  the steps that read them: every leaf's on a statistics step, the rectifiers' (exact
  activity) on a lean one;
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
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from tb_introspect import metadata, stats_np
from tb_introspect.pipeline import params
from tb_introspect.pipeline.failures import METRICS, STATISTICS, Part
from tb_introspect.pipeline.governor import Governor, StepMode
from tb_introspect.pipeline.options import (
    OptionArgs,
    Options,
    check_log_dir,
)
from tb_introspect.pipeline.pipeline import Pipeline
from tb_introspect.pipeline.plan import Plan, is_sampled
from tb_introspect.pipeline.point import Block, Point
from tb_introspect.pipeline.sink import EventSink
from tb_introspect.torch import modules, private, state
from tb_introspect.torch.loss import describe as criterion_info

if TYPE_CHECKING:
    from typing_extensions import Unpack

logger = logging.getLogger("tb_introspect")

#: Steps of per-step metric values held on the device between two copies to the host.
METRIC_ROWS = 1024


class Introspector:
    """Per-layer statistics of a PyTorch model while it trains, written to ``log_dir``.

    Call ``step(loss=...)`` after each optimizer step and ``end_epoch()`` after each
    epoch; ``close()`` at the end (or use it as a context manager), which also removes every
    hook. ``every`` is ``"epoch"`` (gradients summed over the epoch, outputs over all its
    batches, weights at its end) or ``N`` (the statistics of every N-th step). ``views`` and
    the keyword ``options`` are the Keras callback's (``pipeline.options.OptionArgs``:
    ``layers``, ``rectifiers``, ``overhead``, ``stats_every``...), with the same meaning;
    ``grad_scaler`` (a ``torch.amp.GradScaler``) unscales the output gradients.
    ``on_finding="stop"`` makes ``step()`` / ``end_epoch()`` raise ``FindingStop`` once a
    finding of at least ``on_finding_severity`` appears, after its point is written.
    ``criterion`` says what the loss is, for the findings (docs/findings.md): the loss module
    (``nn.CrossEntropyLoss(label_smoothing=0.1)``, ``nn.MSELoss()``...), or for a functional
    loss a dict such as ``{"task": "classification", "from_logits": True}``; None: not known.

    With ``every="epoch"``, layer outputs and output gradients get their statistics on each
    epoch's first step and then at most every ``stats_every``-th step, as rarely as keeps
    the time they add, with what the hooks of every other step cost, within ``overhead`` (a
    share of the plain step time, measured on the host; None: exactly every
    ``stats_every``-th step). The rectifier outputs' activity
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
        grad_scaler: Any = None,
        criterion: Any = None,
        initial_step: int = 0,
        initial_epoch: int = 0,
        **options: Unpack[OptionArgs],
    ):
        options = Options.of(views, every, options)
        loss_info = criterion_info(criterion)
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError("optimizer must be a torch.optim.Optimizer or None,"
                            f" got {type(optimizer).__name__}")
        log_dir = os.fspath(log_dir)
        self.plan = Plan(options)
        self.options = options
        self.failures = self.plan.failures
        self.every = options.every
        self.quantiles = options.quantiles
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

        self.step_count = int(initial_step)
        self.epoch = int(initial_epoch)
        self._window = 0  # steps since the last logged point
        self._stat_steps = 0  # statistics steps among them
        # Which steps are statistics steps: the Keras callback's governor, fed with the host
        # time between two ``step`` calls.
        self.governor = Governor(options.overhead if self.plan.per_epoch else None,
                                 self.plan.stats_every)
        self._t_last: float | None = None
        self._instrumented = 0.0  # host seconds in the hooks and step() since the last step
        self._handles: list[Any] = []
        self._closed = False

        self.params = modules.param_specs(self.model, self.plan.chosen)
        self.plan.variables = list(self.params)
        first = self.params[0].param if self.params else next(self.model.buffers(), None)
        if first is None:
            first = next(self.model.parameters(), None)
        self.device = first.device if first is not None else torch.device("cpu")
        self._salt = torch.zeros((), dtype=torch.int64, device=self.device)
        self._arange = torch.arange(options.step_sample_size, device=self.device)
        self._setup_params()
        self._setup_outputs()
        self._metric_names: list[str] = []
        self.metric_rows = METRIC_ROWS
        self._metric_total = torch.zeros((METRIC_ROWS, 0), dtype=torch.float64,
                                         device=self.device)
        self._metric_count = np.zeros((METRIC_ROWS, 0))  # which cells a step wrote
        self.pipeline = Pipeline(self, EventSink(self.log_dir, upload_secs=options.flush_secs)
                                 if self.rank == 0 else None,
                                 lockstep=self.world > 1, governor=self.governor)
        self.pipeline.ring.loss_info = loss_info
        self.pipeline.start(self.step_count)
        self.pipeline.begin_epoch(self.epoch)
        self._phase: StepMode | None = None
        self._set_phase(self._phase_of(self.step_count + 1))

    # ------------------------------------------------------------------ setup

    def _setup_params(self) -> None:
        want_g, want_v = self.plan.want("gradient"), self.plan.want("variable")
        total = sum(p.size for p in self.params)
        self._grad_buf = (torch.zeros(total, dtype=torch.float32, device=self.device)
                          if want_g else None)
        self._grad_views = ([self._grad_buf[p.offset:p.offset + p.size].view(p.param.shape)
                             for p in self.params] if want_g else [])
        self._skipped = (torch.zeros((len(self.params), 3), dtype=torch.float64,
                                     device=self.device) if want_g else None)
        self._params = params.Params(
            self.plan, self._read_weights() if want_v and self.rank == 0 else None,
            channels_first=True)
        self._grad_seen = False
        if want_g and self.optimizer is not None:
            self._handles.append(self.optimizer.register_step_pre_hook(self._pre_step))

    def _setup_outputs(self) -> None:
        self._out_views = self.plan.output_views
        self.outputs = (modules.output_specs(self.model, self.plan.chosen,
                                             self.plan.named_rectifier)
                        if self._out_views else [])
        self.plan.outputs = list(self.outputs)
        self._bufs = {v: torch.zeros(0, dtype=torch.float64, device=self.device)
                      for v in self._out_views}
        self._empty = {v: b.clone() for v, b in self._bufs.items()}
        self._tallies: dict[str, state.ActivityTally] = {}  # lean steps' rectifier counts
        self._compile_skipped = False
        self._uncaptured: set[str] = set()  # leaves whose output is no float tensor
        self._hook_fns = [self._forward_hook(spec) for spec in self.outputs]
        self._hooked: dict[int, Any] = {}  # output index -> its forward hook's handle

    def _fail(self, part: Part, error: BaseException) -> None:
        self.failures.fail(part, error)

    # ------------------------------------------------------------------ in the step

    def _phase_of(self, step: int) -> StepMode:
        """What the forward passes of ``step`` (1-based) contribute."""
        if self.every == "epoch":
            return StepMode.STATS if self.governor.choose() else StepMode.LEAN
        return StepMode.STATS if is_sampled(step, self.every) else StepMode.OFF

    def _set_phase(self, phase: StepMode) -> None:
        """Makes ``phase`` the next step's, with forward hooks on the modules it reads only:
        every monitored leaf on a statistics step, the rectifiers of exact activity on a lean
        one, none on an ``every=N`` step between two points. A module with a forward hook
        leaves PyTorch's fast call path, which on a small model costs more than the hook
        that returns at once."""
        if phase == self._phase:
            return
        self._phase = phase
        for j, spec in enumerate(self.outputs):
            on = phase is StepMode.STATS or (phase is StepMode.LEAN and spec.exact)
            handle = self._hooked.get(j)
            if on and handle is None:
                self._hooked[j] = spec.module.register_forward_hook(self._hook_fns[j])
            elif handle is not None and not on:
                handle.remove()
                del self._hooked[j]

    def _time_step(self) -> None:
        """The host time of the step that just ended and of the instrumentation in it, for
        the governor (not timed across an epoch end: evaluation and logging run there)."""
        now = self.governor.clock()
        if self.every == "epoch":
            seconds = None if self._t_last is None else now - self._t_last
            self.governor.ran(self._phase is StepMode.STATS, seconds,
                              instrumented=self._instrumented)
        self._t_last = now
        self._instrumented = 0.0

    def _counted(self) -> bool:
        """Training forward passes only: evaluation (``no_grad``, ``eval()``) is not."""
        return torch.is_grad_enabled() and self.model.training

    def _forward_hook(self, spec: modules.OutputSpec) -> Callable:
        def hook(module: nn.Module, inputs: Any, output: Any) -> None:
            # Hooked only while the step reads this output (_set_phase).
            if not self._counted():
                return
            # Under torch.compile the hook is traced into the graph: no host time to take.
            start = None if torch.compiler.is_compiling() else time.perf_counter()
            x = modules.first_tensor(output)
            if x is None or not (x.is_floating_point() and x.dim() >= 1):
                # Said once per module: which layer is missing from the views, and why.
                self._uncaptured.add(spec.name)
                self.failures.warn_once(f"not captured {spec.name}", f"layer output"
                                        f" {spec.name} is not monitored:"
                                        f" {modules.not_captured(output)}")
                return
            try:
                self._on_output(spec, x)
            except Exception as e:  # never break training
                self._fail(Part("output", spec.name), e)
            if start is not None:
                self._instrumented += time.perf_counter() - start
        return hook

    def _on_output(self, spec: modules.OutputSpec, x: torch.Tensor) -> None:
        full = self._phase is StepMode.STATS
        if not (full or spec.exact):
            return
        if not spec.segments:
            self._add_segments(spec, x)
        seg = spec.segments[self._out_views[0]]
        if state.widths(x.shape, spec.channels_first) != (seg.channels, seg.positions):
            self.failures.warn_once(f"shape {spec.name}", f"layer output {spec.name}: shape"
                            f" {tuple(x.shape)} differs from the first call's {spec.shape};"
                            " calls of that shape are left out")
            return
        if "output" in self._bufs and not self.failures.is_off("output", spec.name):
            # Only a statistics step draws a sample: a lean one leaves the salt alone.
            state.fold(self._bufs["output"], spec.segments["output"], x,
                       self._salt.add_(1) if full else self._salt, full, self._arange,
                       self._tallies.get(spec.name))
        if (full and "output_gradient" in self._bufs and x.requires_grad
                and not self.failures.is_off("output_gradient", spec.name)):
            if torch.compiler.is_compiling():
                self._compile_skipped = True  # warned from the host, in step()
            else:
                x.register_hook(self._grad_hook(spec))

    def _grad_hook(self, spec: modules.OutputSpec) -> Callable:
        def hook(grad: torch.Tensor) -> None:
            try:
                if self.grad_scaler is not None:
                    scale = private.scaler_scale(self.grad_scaler)
                    if scale is not None:
                        grad = grad.float() / scale.to(grad.device)
                if self._out_grad_scale != 1.0:
                    grad = grad * self._out_grad_scale
                state.fold(self._bufs["output_gradient"], spec.segments["output_gradient"],
                           grad, self._salt.add_(1), True, self._arange)
            except Exception as e:
                self._fail(Part("output_gradient", spec.name), e)
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
        if spec.exact and "output" in spec.segments:
            self._tallies[spec.name] = state.ActivityTally()

    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._grad_seen = True
        if self._phase is not StepMode.OFF and not self.failures.is_off("gradient"):
            start = time.perf_counter()
            try:
                self._add_gradients()
            except Exception as e:
                self._fail(Part("gradient"), e)
            self._instrumented += time.perf_counter() - start

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
            private.add_all(accs, grads)

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
        start = time.perf_counter()
        if not self.pipeline.is_off(STATISTICS) and not self.failures.is_off("gradient"):
            try:
                self._gradients_of_step()
            except Exception as e:
                self._fail(Part("gradient"), e)
        values = dict(metrics)
        if loss is not None:
            values = {"loss": loss, **values}
        self.pipeline.guard(METRICS, self._record_metrics, values)
        self._instrumented += time.perf_counter() - start
        self._time_step()
        if self._phase is StepMode.STATS:
            self._stat_steps += 1
        self.step_count += 1
        self._window += 1
        if self._compile_skipped:
            self.failures.warn_once("compile", "torch.compile: output gradients are not"
                                    " captured inside a compiled graph (AOT autograd cannot"
                                    " compile a tensor hook that updates the statistics); the"
                                    " output_gradient view is off under compile, the other"
                                    " views go on")
        self.pipeline.after_steps(1)
        self._set_phase(self._phase_of(self.step_count + 1))
        self.pipeline.raise_stop()  # on_finding="stop": FindingStop, the point written

    def _gradients_of_step(self) -> None:
        if self._grad_buf is None:
            return
        if self.optimizer is None:
            if self._phase is not StepMode.OFF:
                self._add_gradients()
        elif not self._grad_seen and self._phase is not StepMode.OFF and any(
                p.param.grad is not None for p in self.params):
            self._count_skipped()
        self._grad_seen = False

    def _record_metrics(self, values: dict[str, Any]) -> None:
        row = self.step_count % METRIC_ROWS  # step step_count + 1's row
        self._metric_count[row] = 0
        for name, value in values.items():
            if name not in self._metric_names:
                self._metric_names.append(name)
                total = self._metric_total
                self._metric_total = torch.cat(
                    [total, torch.zeros((METRIC_ROWS, 1), dtype=total.dtype,
                                        device=total.device)], dim=1)
                self._metric_count = np.concatenate(
                    [self._metric_count, np.zeros((METRIC_ROWS, 1))], axis=1)
            m = self._metric_names.index(name)
            cell = self._metric_total[row, m]
            if isinstance(value, torch.Tensor):
                cell.copy_(value.detach().reshape(()))
            else:
                cell.fill_(float(value))
            self._metric_count[row, m] = 1

    # ------------------------------------------------------------------ host side

    def end_epoch(self, **metrics: Any) -> None:
        """After each epoch: the epoch's statistics (``every="epoch"``), activity maps and
        metric bands; ``metrics`` (e.g. ``val_loss=0.3``) are written at this step."""
        if self._closed:
            return
        self.pipeline.end_epoch(metrics)
        self.epoch += 1
        self.pipeline.begin_epoch(self.epoch)
        self._t_last = None
        self._instrumented = 0.0
        self.governor.begin_window()
        self._set_phase(self._phase_of(self.step_count + 1))
        self.pipeline.raise_stop()

    # The ``pipeline.pipeline.FrontEnd`` protocol: what the pipeline asks between steps.

    def current_step(self) -> int:
        return self.step_count

    def read_metrics(self) -> tuple[int, list[str], np.ndarray, np.ndarray]:
        """One copy of the metric ring (every rank's mean under DDP: a collective)."""
        total = self._metric_total
        count = self._metric_count
        if not self._metric_names:  # nothing to copy: no device sync
            return self.step_count, [], count.copy(), count.copy()
        if self.world > 1:
            import torch.distributed as dist

            total = total.clone()
            dist.all_reduce(total)
            count = count * self.world
        return self.step_count, list(self._metric_names), _host(total), count.copy()

    def point(self, step: int) -> Point:
        """The window's statistics: one host copy per buffer, ranks merged (rank 0 gets the
        vectors; every rank calls it at the same steps, the output buffers are gathered)."""
        out = Point(window=self._window, stats_steps=self._stat_steps)
        if self.rank == 0 and self._stat_steps:
            # A leaf no training forward pass called (a transformer's attention dropout
            # inside scaled_dot_product_attention) has no output to show: said once.
            idle = [s.name for s in self.outputs
                    if not s.segments and s.name not in self._uncaptured]
            if idle:
                self.failures.warn_once("uncalled", f"{len(idle)} layer output(s) not"
                                        " monitored: no training forward pass called them"
                                        f" before the first point ({', '.join(idle)})")
        self._output_blocks(out)
        gsums = self._read_gradients(out) if self._grad_buf is not None else None
        if self.rank == 0:
            ws = self._read_weights() if self.plan.want("variable") else None
            self._params.add_blocks(out, ws, gsums, seed=self.options.seed + self.step_count)
        self._window = self._stat_steps = 0
        return out

    def output_widths(self) -> dict[int, tuple[int, int]]:
        widths = {}
        for j, spec in enumerate(self.outputs):
            seg = spec.segments.get(self._out_views[0]) if self._out_views else None
            if seg is not None:
                widths[j] = (seg.channels, seg.positions)
        return widths

    def _gathered(self, buf: torch.Tensor) -> np.ndarray:
        """``[ranks, length]``: every rank's copy of ``buf`` on rank 0 (one host copy)."""
        if self.world > 1:
            import torch.distributed as dist

            parts = [torch.empty_like(buf) for _ in range(self.world)]
            dist.all_gather(parts, buf.contiguous())
            return _host(torch.stack(parts))
        return _host(buf)[None]

    def _output_blocks(self, out: Point) -> None:
        for spec in self.outputs:
            tally = self._tallies.get(spec.name)
            if tally is not None:
                tally.settle(self._bufs["output"], spec.segments["output"])
        for view in self._out_views:
            buf = self._bufs[view]
            host = self._gathered(buf) if buf.numel() else None
            buf.copy_(self._empty[view])
            if host is None or self.rank != 0:
                continue
            specs, states = [], []
            for j, spec in enumerate(self.outputs):
                seg = spec.segments.get(view)
                if seg is None or not self.plan.writes(view, spec):
                    continue
                merged = state.merge_ranks(host[:, seg.offset:seg.offset + seg.length], seg)
                a = len(state.ADD)
                if merged[0] == 0 and merged[a - 1] == 0:
                    continue  # not called in this window
                if view == "output":
                    out.activity[j] = merged[a - 1:a + seg.channels + seg.positions].copy()
                if merged[0] == 0:
                    continue
                specs.append(spec)
                states.append(state.to_state(merged, seg, activity_rates=view == "output"))
            if specs:
                out.blocks.append(Block(view, specs, stats_np.finalize_many(
                    states, view, quantiles=self.quantiles)))

    def _read_gradients(self, out: Point) -> list[np.ndarray] | None:
        """The window's gradient sums, one host copy (rank 0; None elsewhere), and the
        skipped steps' non-finite counts into ``out``; the sums start again."""
        host = None
        if self.rank == 0:
            flat = _host(self._grad_buf)
            out.skipped = _host(self._skipped)
            host = [flat[p.offset:p.offset + p.size].reshape(p.param.shape).copy()
                    for p in self.params]
        self._grad_buf.zero_()
        self._skipped.zero_()
        return host

    def _read_weights(self) -> list[np.ndarray]:
        """Every monitored weight, one device-to-host copy."""
        if not self.params:
            return []
        with torch.no_grad():
            flat = torch.cat([p.param.detach().reshape(-1).float() for p in self.params])
        host = _host(flat)
        return [host[p.offset:p.offset + p.size].reshape(p.param.shape) for p in self.params]

    # ------------------------------------------------------------------ lifecycle

    def flush(self) -> None:
        """Write the pending metric values and flush the event file."""
        self.pipeline.guard(METRICS, self.pipeline.drain)
        self.pipeline.flush()

    def close(self) -> None:
        """Write what is pending, close the event file and remove every hook."""
        if self._closed:
            return
        self.pipeline.guard(METRICS, self.pipeline.drain)
        for handle in [*self._handles, *self._hooked.values()]:
            handle.remove()
        self._handles, self._hooked = [], {}
        state.release_scratch()
        self._closed = True
        self.pipeline.close()

    def __enter__(self) -> Introspector:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class IntrospectorArgs:
    """An ``Introspector``'s arguments, checked when given, for a trainer's callback that
    makes the ``Introspector`` when training starts (``make``)."""

    def __init__(self, log_dir: str | os.PathLike | None, every: str | int,
                 views: Sequence[str], options: dict[str, Any]) -> None:
        Options.of(views, every, dict(options))  # a bad option fails here, not in training
        self.log_dir = None if log_dir is None else os.fspath(log_dir)
        self.every, self.views, self.options = every, tuple(views), dict(options)

    def make(self, default_dir: str, model: nn.Module, optimizer: torch.optim.Optimizer | None,
             **kwargs: Any) -> Introspector:
        """The ``Introspector``, writing to ``log_dir`` or else ``default_dir``."""
        return Introspector(self.log_dir or default_dir, model, optimizer, self.every,
                            views=self.views, **kwargs, **self.options)


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
