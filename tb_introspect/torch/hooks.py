"""The step phase (``Phase``) and the hooks it turns on: a forward hook on each leaf
module the phase reads, a tensor hook on each output a statistics step folds the gradient
of, the optimizer's pre-step hook; and the host time they take, for the governor.

The hooks fold straight into the parts that own the buffers (``OutputStates``,
``ParameterViews``): no call in between, as they run per module call and per step."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tb_introspect.pipeline.failures import Part
from tb_introspect.pipeline.governor import Governor, Phase
from tb_introspect.pipeline.plan import Plan, is_sampled
from tb_introspect.torch import modules
from tb_introspect.torch.outputs import OutputStates
from tb_introspect.torch.parameters import ParameterViews
from tb_introspect.torch.passes import ForwardPasses


class StepHooks:
    """Which steps read what, and the hooks that read it.

    With ``every="epoch"`` the governor chooses each step's phase (statistics or lean);
    with ``every=N`` a step is a statistics step or reads nothing. ``instrumented`` is the
    host time of the hooks (and of ``step()``) since the step began."""

    def __init__(self, plan: Plan, model: nn.Module, governor: Governor,
                 outputs: OutputStates, parameters: ParameterViews,
                 optimizer: torch.optim.Optimizer | None) -> None:
        self.plan = plan
        self.model = model
        self.governor = governor
        self.outputs = outputs
        self.parameters = parameters
        self.phase: Phase | None = None
        self.instrumented = 0.0
        self.optimizer_ran = False  # the pre-step hook ran in this step
        self.uncaptured: set[str] = set()  # leaves whose output is no float tensor
        self._last_step_end: float | None = None
        self.passes = ForwardPasses()  # a checkpoint's recompute is not read twice
        self._hooked = [spec.module.register_forward_hook(self._forward_hook(spec))
                        for spec in outputs.specs]
        # told each new phase and whether the step is a probe step (the probes' ``follow``)
        self.listeners: list[Callable[[Phase, bool], None]] = []
        #: Whether a (1-based) step is a probe step (the Introspector's probe points); the
        #: current step's answer is ``probing``.
        self.probe_step: Callable[[int], bool] = lambda step: False
        self.probing = False
        self._optimizer_hook = (optimizer.register_step_pre_hook(self._pre_step)
                                if parameters.sums is not None and optimizer is not None
                                else None)

    # ------------------------------------------------------------------ the phase

    def enter(self, step: int) -> None:
        """Make the phase of ``step`` (1-based) the current one, and whether it is a probe
        step (``probe_step``)."""
        self.passes.new_step()
        probing = self.probe_step(step)
        if self.plan.every == "epoch":
            self.set_phase(Phase.STATS if self.governor.choose() else Phase.LEAN,
                           probing)
        else:
            self.set_phase(Phase.STATS if is_sampled(step, self.plan.every)
                           else Phase.OFF, probing)

    def set_phase(self, phase: Phase, probing: bool = False) -> None:
        """Make ``phase`` the current one: the forward hooks read every monitored leaf on a
        statistics step, the rectifiers of exact activity on a lean one, none on an
        ``every=N`` step between two points. The hooks stay on throughout: ``torch.compile``
        traces a module's hooks when it first compiles and does not guard on them, so a
        hook added later would never run in the graph (and each change, where guarded,
        would compile it again); a hook that reads the phase costs one cached graph per
        phase. ``probing``: the step is a probe step (the probes' light hooks)."""
        if phase == self.phase and probing == self.probing:
            return
        self.phase, self.probing = phase, probing
        for listener in self.listeners:
            listener(phase, probing)

    def take_optimizer_ran(self) -> bool:
        """Whether the optimizer stepped since the last call."""
        ran, self.optimizer_ran = self.optimizer_ran, False
        return ran

    # ------------------------------------------------------------------ timing

    def step_ended(self) -> None:
        """Hand the governor the host time of the step that just ended and of the
        instrumentation in it (not across an epoch end: evaluation and logging run there)."""
        now = self.governor.clock()
        if self.plan.every == "epoch":
            seconds = None if self._last_step_end is None else now - self._last_step_end
            self.governor.ran(self.phase is Phase.STATS, seconds,
                              instrumented=self.instrumented)
        self._last_step_end = now
        self.instrumented = 0.0

    def restart_timing(self, now: bool = False) -> None:
        """An epoch ended: the next step is not timed from this one; ``now``: a window
        ended within the epoch: the next step is timed from now, after its point (a
        window's first step is its statistics step, which the governor weighs)."""
        self._last_step_end = self.governor.clock() if now else None
        self.instrumented = 0.0

    # ------------------------------------------------------------------ the hooks

    def _forward_hook(self, spec: modules.OutputSpec) -> Callable:
        model, outputs, failures = self.model, self.outputs, self.plan.failures
        gradient_hook = outputs.gradient_hook(spec) if outputs.folds_gradients else None
        reads = self.passes.reads

        def hook(module: nn.Module, inputs: Any, output: Any) -> None:
            # Training forward passes only: evaluation (``no_grad``, ``eval()``) is not.
            phase = self.phase
            if (phase is Phase.OFF or (phase is Phase.LEAN and not spec.exact)
                    or not (model.training and reads(module))):
                return  # not read in this phase, or not a training pass
            # Under torch.compile the hook is traced into the graph: no host time to take.
            start = None if torch.compiler.is_compiling() else time.perf_counter()
            x = modules.first_tensor(output)
            if x is None or not (x.is_floating_point() and x.dim() >= 1):
                # Said once per module: which layer is missing from the views, and why.
                self.uncaptured.add(spec.name)
                failures.warn_once(f"not captured {spec.name}", f"layer output {spec.name}"
                                   f" is not monitored: {modules.not_captured(output)}")
                return
            full = phase is Phase.STATS
            try:
                if (outputs.add(spec, x, full) and full
                        and gradient_hook is not None and x.requires_grad
                        and not failures.is_off("output_gradient", spec.name)):
                    if not torch.compiler.is_compiling():  # said from the host, in step()
                        x.register_hook(gradient_hook)
            except Exception as e:  # never break training
                failures.fail(Part("output", spec.name), e)
            if start is not None:
                self.instrumented += time.perf_counter() - start
        return hook

    def _pre_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Gradients are read here: after DDP's all-reduce and ``GradScaler``'s unscale."""
        self.optimizer_ran = True
        if self.phase is not Phase.OFF and not self.plan.failures.is_off("gradient"):
            start = time.perf_counter()
            try:
                self.parameters.add()
            except Exception as e:
                self.plan.failures.fail(Part("gradient"), e)
            self.instrumented += time.perf_counter() - start

    def close(self) -> None:
        """Remove every hook."""
        handles = [*self._hooked]
        if self._optimizer_hook is not None:
            handles.append(self._optimizer_hook)
        for handle in handles:
            handle.remove()
        self._hooked, self._optimizer_hook = [], None
