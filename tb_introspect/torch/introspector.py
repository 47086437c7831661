"""``Introspector``: the four views of a PyTorch training loop, in the tab's format.

Where each view comes from:

* layer outputs: a forward hook on every leaf module (module order gives the depth); a
  module called several times per forward pass adds every call. The hooks are on only for
  the steps that read them: every leaf's on a statistics step, the rectifiers' (exact
  activity) on a lean one. The non-finite rule (``Phase``): a lean step's rectifier
  output holding NaN or Inf is folded whole, and a lean step with such an output or loss
  makes the next step a statistics step; read on a CPU only, where one sum tells (on a GPU
  it would make every lean step wait for the device);
* output gradients: a tensor hook on each captured output, on statistics steps;
* gradients: ``optimizer.register_step_pre_hook``, so they are read after
  ``DistributedDataParallel``'s all-reduce and ``GradScaler``'s unscale; a step the
  scaler skips adds its gradients' non-finite counts only;
* weights: read when a point is logged;
* the transformer probes (``probes``): on statistics steps, and in a paced run (the
  trainers' ``every="auto"``) on a light probe step every planned window, written there as
  a probe point (``probe_points``) whatever the paced window became.

Between logged points everything stays on the device: gradient sums in one flat float32
buffer (``parameters``), the two output views' states in one float64 buffer each
(``outputs``, ``state``), losses in a ring buffer (``metrics``). A logged point copies
each buffer to the host once, merges ranks (``ranks``; rank 0 writes), and finalizes with
numpy. ``hooks`` holds the step phase and the hooks it turns on; the ``Introspector``
wires these parts, counts the steps and answers the pipeline.
"""

from __future__ import annotations

import math
import numbers
import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from tb_introspect import loss_field, slots
from tb_introspect.pipeline.failures import METRICS, STATISTICS, Part
from tb_introspect.pipeline.governor import Governor, Phase
from tb_introspect.pipeline.options import (
    OptionArgs,
    Options,
    check_log_dir,
)
from tb_introspect.pipeline.pipeline import Pipeline
from tb_introspect.pipeline.plan import Plan, auto_window
from tb_introspect.pipeline.point import Point
from tb_introspect.pipeline.sink import EventSink
from tb_introspect.torch import modules, sharding, state
from tb_introspect.torch.hooks import StepHooks
from tb_introspect.torch.loss import describe as criterion_info
from tb_introspect.torch.loss import describe_run
from tb_introspect.torch.metrics import MetricRing
from tb_introspect.torch.outputs import OutputStates
from tb_introspect.torch.parameters import ParameterViews
from tb_introspect.torch.probe_points import ProbePoints
from tb_introspect.torch.probes import PROBES, Probes
from tb_introspect.torch.ranks import Broken, Ranks

if TYPE_CHECKING:
    from typing_extensions import Unpack


#: What a model has to monitor (``modules.discover``: its module tree).
Discover = Callable[[nn.Module, Plan], modules.Parts]


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
    ``discover`` finds what to monitor where torch's module tree does not hold the layers
    (Keras 3 on PyTorch): ``discover(model, plan)`` returns its ``modules.Parts``; default:
    the module tree.

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
        views: Sequence[str] = slots.VIEWS,
        grad_scaler: Any = None,
        criterion: Any = None,
        initial_step: int = 0,
        initial_epoch: int = 0,
        discover: Discover | None = None,
        **options: Unpack[OptionArgs],
    ):
        options = Options.of(views, every, options)
        criterion_info(criterion)  # a bad criterion fails before anything starts
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError("optimizer must be a torch.optim.Optimizer or None,"
                            f" got {type(optimizer).__name__}")
        self.plan = Plan(options)
        self.options = options
        self.failures = self.plan.failures
        self.model = modules.unwrap(model)
        self.optimizer = optimizer
        self.ranks = Ranks()
        # A failed collective or a rank's failure: the tool is off on every rank.
        self.ranks.on_broken = lambda: self.failures.off.update((Part(STATISTICS), Part(METRICS)))
        self._failed: Exception | None = None  # rank 0's write side failed: said at the next point
        self.log_dir = check_log_dir(os.fspath(log_dir))
        self.step_count = int(initial_step)
        self.epoch = int(initial_epoch)
        self._window = 0  # steps since the last logged point
        self._stats_steps = 0  # statistics steps among them
        self._closed = False
        # Which steps are statistics steps: the Keras callback's governor, fed with the host
        # time between two ``step`` calls.
        self.governor = Governor(options.overhead if self.plan.per_epoch else None,
                                 self.plan.stats_every)

        parts = (discover or modules.discover)(self.model, self.plan)
        self.params = parts.params
        self.plan.variables = list(self.params)
        self.outputs = parts.outputs if self.plan.output_views else []
        self.plan.outputs = list(self.outputs)
        device = _device_of(self.model, self.params)
        self.parameter_views = ParameterViews(self.plan, self.params, device, self.ranks)
        # DDP averages the ranks' gradients: the loss it trains is the mean of the ranks'
        # losses, so a rank's output gradient of that loss is its own divided by the ranks.
        ddp = sharding.data_parallel(model)  # DDP or FSDP2's fully_shard
        self.output_states = OutputStates(
            self.plan, self.outputs, device, grad_scaler=grad_scaler,
            gradient_scale=1.0 / self.ranks.world if ddp else 1.0)
        if self.ranks.world > 1:  # every rank's steps decided alike (Governor.lockstep)
            self.governor.lockstep()
        self.hooks = StepHooks(self.plan, self.model, self.governor, self.output_states,
                               self.parameter_views, optimizer)
        # The transformer probes, hooked on statistics steps (docs/format.md) and on the
        # probe steps of a paced run (``probe_every``).
        regression = (loss_field.parse_loss(criterion_info(criterion)) or {}).get("task")
        self.probes = Probes(self.model, parts, self.outputs, self.plan, device,
                             self.hooks.passes, regression=regression == "regression",
                             folds=self.output_states)
        self.hooks.listeners.append(self.probes.follow)
        self.metric_ring = MetricRing(device)
        self.pipeline = Pipeline(self, EventSink(self.log_dir, upload_secs=options.flush_secs)
                                 if self.ranks.writes else None,
                                 lockstep=self.ranks.world > 1, governor=self.governor)
        self.probe_points = ProbePoints(self.plan, self.probes, self.pipeline, self.ranks,
                                        self.governor)
        self.hooks.probe_step = self.probe_points.is_probe_step
        # What PyTorch knows of the run (parameters in no optimizer group, the output
        # module), with the loss: read again at a point where the optimizer's groups changed.
        self._criterion, self._groups = criterion, modules.optimizer_signature(optimizer)
        self.pipeline.ring.loss_info = describe_run(criterion, self.model, optimizer)
        self.pipeline.start(self.step_count)
        self.pipeline.begin_epoch(self.epoch)
        self.hooks.enter(self.step_count + 1)

    @property
    def phase(self) -> Phase | None:
        """What the current step's forward passes contribute (``Phase``)."""
        return self.hooks.phase

    # ------------------------------------------------------------------ training loop

    def step(self, loss: Any = None, **metrics: Any) -> None:
        """After each optimizer step: records the step's ``loss`` and other scalar
        ``metrics`` (tensors stay on the device), writes a point when one is due."""
        if self._closed:
            return
        start = time.perf_counter()
        hooks = self.hooks
        optimizer_ran = hooks.take_optimizer_ran()
        probed = self.probes.take_spent()  # a probe step's probes: its instrumentation
        hooks.instrumented += probed
        if hooks.phase is Phase.STATS or hooks.probing:
            self.probe_points.probed = True
        if not self.pipeline.is_off(STATISTICS) and not self.failures.is_off("gradient"):
            try:
                self.parameter_views.end_step(hooks.phase is not Phase.OFF,
                                              self.optimizer is not None, optimizer_ran)
            except Exception as e:
                self.failures.fail(Part("gradient"), e)
        values = dict(metrics)
        if loss is not None:
            values = {"loss": loss, **values}
        self.pipeline.guard(METRICS, self.metric_ring.record, self.step_count, values)
        nonfinite = self.output_states.take_nonfinite() or (
            hooks.phase is Phase.LEAN and _nonfinite_on_host(loss))
        hooks.instrumented += time.perf_counter() - start
        hooks.step_ended()
        if nonfinite:  # the non-finite rule (Phase): the next step reads every output
            self.governor.force()
        if hooks.phase is Phase.STATS:
            self._stats_steps += 1
        self.step_count += 1
        self._window += 1
        released = self.probe_points.release()  # the last step's, no point after it
        self.pipeline.after_steps(1)
        held = self.probe_points.hold(self.step_count, probed)
        if self._window == 0 or released or held:  # their time is not the next step's
            hooks.restart_timing(now=True)
        hooks.enter(self.step_count + 1)
        if hooks.passes.compiled:
            self._said_compiled()
        self.pipeline.raise_stop()  # on_finding="stop": FindingStop, the point written

    def _said_compiled(self) -> None:
        """Once: what a ``torch.compile`` graph keeps from the hooks."""
        off = [what for what, on in (
            ("output gradients (the output_gradient view: AOT autograd cannot compile a"
             " tensor hook that updates the statistics)", self.output_states.folds_gradients),
            ("transformer probes (their numbers cannot leave the graph)",
             self.probes.compiled_off)) if on]
        if off:
            self.failures.warn_once("compile", "torch.compile: inside a compiled graph the"
                                    f" tool takes no {' and no '.join(off)}; they are off"
                                    " under compile, the other views go on")

    def end_epoch(self, **metrics: Any) -> None:
        """After each epoch: the epoch's statistics (``every="epoch"``), activity maps and
        metric bands; ``metrics`` (e.g. ``val_loss=0.3``) are written at this step."""
        if self._closed:
            return
        self.probe_points.to_point()  # a probe point at this step: in the epoch's point
        self.pipeline.end_epoch(metrics)
        self.probe_points.after_epoch()
        self.epoch += 1
        self.pipeline.begin_epoch(self.epoch)
        self.hooks.restart_timing()
        self.governor.begin_window()
        self.hooks.enter(self.step_count + 1)
        self.pipeline.raise_stop()

    # The ``pipeline.pipeline.FrontEnd`` protocol: what the pipeline asks between steps.

    @property
    def metric_rows(self) -> int:
        return self.metric_ring.rows

    def current_step(self) -> int:
        return self.step_count

    def read_metrics(self) -> tuple[int, list[str], np.ndarray, np.ndarray]:
        """One copy of the metric ring (every rank's mean under DDP: a collective)."""
        if modules.optimizer_signature(self.optimizer) != self._groups:  # before it is written
            self._groups = modules.optimizer_signature(self.optimizer)
            self.pipeline.ring.loss_info = describe_run(self._criterion, self.model,
                                                        self.optimizer)
        return (self.step_count, *self.metric_ring.read(self.ranks))

    def point(self, step: int) -> Point | Callable[[], Point]:
        """The window's statistics: one host copy per buffer and the ranks' exchange here;
        rank 0's numpy finalize comes back as a callable the pipeline's worker runs
        (every rank calls it at the same steps, the output buffers are gathered)."""
        out = Point(window=self._window, stats_steps=self._stats_steps)
        # this rank's probe window and the rows seen so far (None: the probes are off),
        # with a probe point held at this step (``end_epoch``)
        probes = self.probe_points.taken(self.pipeline.guard(PROBES.view, self.probes.take))
        if self.ranks.writes and self._stats_steps:
            # A leaf no training forward pass called (a transformer's attention dropout
            # inside scaled_dot_product_attention) has no output to show: said once.
            idle = [s.name for s in self.outputs
                    if not s.segments and s.name not in self.hooks.uncaptured]
            if idle:
                self.failures.warn_once("uncalled", f"{len(idle)} layer output(s) not"
                                        " monitored: no training forward pass called them"
                                        f" before the first point ({', '.join(idle)})")
        finish = self._exchange(out, seed=self.options.seed + self.step_count, probes=probes)
        self._window = self._stats_steps = 0
        return out if finish is None else finish

    def _exchange(self, out: Point, seed: int,
                  probes: tuple[np.ndarray, list[str]] | None = None
                  ) -> Callable[[], Point] | None:
        """The point's one exchange between ranks (``Ranks.exchange``): every rank's output
        states, sharded parameters' states and probe window (``probes``: this rank's
        ``Probes.take``, None when its probes are off: an empty window takes its place),
        and rank 0's governor
        spacing; a part of the statistics that failed on any rank switches them off on
        every rank (``ranks.Broken``). The writing rank gets the blocks' numpy work back as
        a callable (None elsewhere): it reads host copies only, never a buffer training
        writes to."""
        ranks, failed = self.ranks, self._failed
        payload, n_out, n_params, layout, params = None, 0, 0, None, None
        if failed is None:
            try:
                payload, layout = self.output_states.local_payload()
                n_out = payload.size
                local, params = self.parameter_views.local_payload(seed)
                n_params = local.size
                window = self.probes.empty_state() if probes is None else probes[0]
                payload = np.concatenate([payload, local, window.reshape(-1)])
            except Exception as e:
                failed = e
                payload = None
        spacing = self.governor.spacing_to_share() if ranks.writes else math.nan
        try:
            copies, spacing = ranks.exchange(payload, spacing)
        except Broken:
            if failed is not None and ranks.world == 1:
                raise failed from None
            raise
        if ranks.world > 1:
            self.governor.share(spacing)
        if not ranks.writes:
            return None

        def finish() -> Point:
            if probes is not None:  # every rank's window (probe_window.combine)
                out.probes = self.pipeline.guard(PROBES.view, self.probes.values,
                                                 copies[:, n_out + n_params:], probes[1]) or {}
            try:
                self.output_states.add_blocks(out, copies[:, :n_out], layout)
                self.parameter_views.add_blocks(out, copies[:, n_out:n_out + n_params], seed,
                                                params)
            except Exception as e:
                if ranks.world == 1:
                    raise
                # said on every rank at a next point: the statistics stop together
                self._failed = e
                out.blocks.clear()
            return out
        return finish

    def output_widths(self) -> dict[int, tuple[int, int]]:
        return self.output_states.widths()

    # ------------------------------------------------------------------ lifecycle

    def flush(self) -> None:
        """Write the pending metric values and every point logged so far, and flush the
        event file (a probe point held at this step waits for the next step or an epoch's
        end: ``probe_points``)."""
        self.pipeline.guard(METRICS, self.pipeline.drain)
        self.pipeline.flush()

    def close(self) -> None:
        """Write what is pending, close the event file and remove every hook."""
        if self._closed:
            return
        self.probe_points.release()
        self.pipeline.guard(METRICS, self.pipeline.drain)
        self.hooks.close()
        self.probes.close()
        state.release_scratch()
        self._closed = True
        self.pipeline.close()

    def __enter__(self) -> Introspector:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class IntrospectorArgs:
    """An ``Introspector``'s arguments, checked when given, for a trainer's callback that
    makes the ``Introspector`` when training starts (``make``). ``every="auto"`` (the
    trainers' default) is ``every="epoch"`` with the ``window`` that the run's planned
    epochs and steps call for (``plan.auto_window``), unless ``window`` is given; that
    window grows where the points' measured cost would exceed ``overhead``
    (``Governor.paced_window``), and the transformer probes keep the planned one
    (``probe_points``, docs/options.md)."""

    def __init__(self, log_dir: str | os.PathLike | None, every: str | int,
                 views: Sequence[str], options: dict[str, Any]) -> None:
        # a bad option fails here, not in training
        Options.of(views, "epoch" if every == "auto" else every, dict(options))
        self.log_dir = None if log_dir is None else os.fspath(log_dir)
        self.every, self.views, self.options = every, tuple(views), dict(options)

    def make(self, default_dir: str, model: nn.Module, optimizer: torch.optim.Optimizer | None,
             *, planned: tuple[float | None, float | None, int | None] = (None, None, None),
             **kwargs: Any) -> Introspector:
        """The ``Introspector``, writing to ``log_dir`` or else ``default_dir``;
        ``planned``: the run's planned epochs, steps and logging interval (``auto_window``)."""
        every, options, paced = self.every, self.options, False
        if every == "auto":
            every = "epoch"
            if "window" not in options:
                options = {**options, "window": auto_window(*planned)}
                paced = options["window"] is not None
        intro = Introspector(self.log_dir or default_dir, model, optimizer, every,
                             views=self.views, **kwargs, **options)
        intro.plan.paced = paced  # the tool chose the window: it may grow (Governor)
        return intro


def _device_of(model: nn.Module, params: Sequence[modules.ParamSpec]) -> torch.device:
    """Where the buffers live: the first monitored parameter's device, else the model's
    first buffer's or parameter's, else the CPU."""
    first = params[0].param if params else next(model.buffers(), None)
    if first is None:
        first = next(model.parameters(), None)
    return first.device if first is not None else torch.device("cpu")


def _nonfinite_on_host(loss: Any) -> bool:
    """Whether ``loss`` is NaN or infinite, read where no device is waited for: a number
    or a one-element CPU tensor (a GPU's loss is not read: that would sync every step)."""
    if isinstance(loss, torch.Tensor):
        if loss.device.type != "cpu" or loss.numel() != 1:
            return False
    elif not isinstance(loss, numbers.Real):
        return False
    return not math.isfinite(float(loss.detach() if isinstance(loss, torch.Tensor) else loss))
