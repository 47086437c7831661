"""Hugging Face ``Trainer``: ``IntrospectCallback``, the PyTorch ``Introspector`` driven by
the trainer's callback events (``pip install 'tb-introspect[transformers]'``).

Example:
    >>> from tb_introspect.transformers import IntrospectCallback
    >>> trainer = Trainer(model=model, args=TrainingArguments("out", report_to="tensorboard"),
    ...                   train_dataset=train, eval_dataset=val,
    ...                   callbacks=[IntrospectCallback()])  # doctest: +SKIP
    >>> trainer.train()  # doctest: +SKIP
"""

from __future__ import annotations

import glob
import logging
import math
import numbers
import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from transformers import TrainerCallback

from tb_introspect import slots
from tb_introspect.pipeline.failures import Failures
from tb_introspect.pipeline.findings import FindingStop
from tb_introspect.pipeline.options import OptionArgs
from tb_introspect.torch.introspector import Introspector, IntrospectorArgs

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["IntrospectCallback", "tensorboard_dir"]

#: What the trainer logs that is not a training curve: its clocks and counters, and the
#: end-of-training summary (``train_loss`` is the mean of the ``loss`` already written).
_NOT_CURVES = ("epoch", "step", "total_flos", "train_loss", "num_input_tokens_seen",
               "num_tokens")
_NOT_CURVE_SUFFIXES = ("_runtime", "_per_second")

logger = logging.getLogger("tb_introspect")


class IntrospectCallback(TrainerCallback):
    """The four views of a ``transformers.Trainer``'s model, in the Introspect tab.

    ``log_dir`` defaults to the directory ``report_to="tensorboard"`` writes to
    (``tensorboard_dir``), so the tab's data sits beside the trainer's scalars. ``every``,
    ``views`` and the keyword options are the ``Introspector``'s; ``every="auto"`` (the
    default) follows the run: a point per epoch where it plans 20 epochs or more, else per
    window of steps (``window``) from ``state.max_steps``, aligned to ``logging_steps``,
    about 20 points and at most a few hundred (``pipeline.plan.auto_window``), fewer where
    their measured cost would exceed ``overhead`` (``Governor.paced_window``).
    A step is an optimizer step (``state.global_step``: gradient accumulation's
    micro-batches are one step, their layer outputs all counted); the model and the
    optimizer are the trainer's; gradients are read in the optimizer's step pre-hook, after
    clipping (``max_grad_norm``); ``loss`` is each optimizer step's: what the trainer's
    ``training_step`` returned, summed over the step's micro-batches as the trainer sums
    them for its logged loss, so a ``compute_loss`` or ``training_step`` override's loss
    (where the trainer is not found, the logged loss, said once); ``learning_rate`` and
    ``grad_norm`` (the norm before clipping) are the trainer's logs (every
    ``logging_steps``); ``on_evaluate``'s ``eval_*`` metrics are written as ``val_*``.
    Only the main process writes.
    ``on_finding="stop"`` ends the training through the trainer
    (``control.should_training_stop``) after the step that showed the finding.

    Example:
        >>> cb = IntrospectCallback(every=16, layers=r"transformer\\.h\\.0\\..*")
        >>> trainer = Trainer(model, args, train_dataset=ds,
        ...                   callbacks=[cb])  # doctest: +SKIP
    """

    def __init__(
        self,
        log_dir: str | os.PathLike | None = None,
        every: str | int = "auto",
        *,
        views: Sequence[str] = slots.VIEWS,
        **options: Unpack[OptionArgs],
    ):
        self.args = IntrospectorArgs(log_dir, every, views, options)
        self.introspector: Introspector | None = None
        self._trainer: Any = None  # the Trainer whose training_step is followed
        self._failures = Failures()
        self._reset()

    def _reset(self) -> None:
        self._step_done = False  # an optimizer step whose metrics may still come
        self._metrics: dict[str, Any] = {}
        self._epoch_done = False  # an epoch whose evaluation may still come
        self._val: dict[str, float] = {}
        self._step_loss: Any = None  # the micro-batches' training_step losses so far

    # ------------------------------------------------------------------ trainer events

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                       optimizer: Any = None, **kwargs: Any) -> None:
        if model is None:
            raise ValueError("IntrospectCallback: the Trainer passed no model")
        self._reset()
        trainer = _calling_trainer(self)
        self.introspector = self.args.make(
            tensorboard_dir(args, state), model, _torch_optimizer(optimizer),
            initial_step=int(state.global_step), initial_epoch=int(state.epoch or 0),
            planned=_planned(args, state), criterion=model_loss(model, args, trainer))
        self._follow(trainer)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._settle(control)

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._settle(control)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # The step's logs and evaluation come after this event: the step is told to the
        # Introspector at the next step's beginning (before its forward passes).
        self._step_done = True
        if self._trainer is not None:
            loss, self._step_loss = self._step_loss, None
            if loss is not None:
                self._metrics["loss"] = loss

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._epoch_done = True  # an eval_strategy="epoch" evaluation follows this event

    def on_log(self, args: Any, state: Any, control: Any, logs: Mapping[str, Any] | None = None,
               **kwargs: Any) -> None:
        for name, value in (logs or {}).items():
            if name == "loss" and self._trainer is not None:
                continue  # the step's own loss is kept, not the mean since the last log
            if _is_curve(name, value) and not name.startswith("eval_"):
                self._metrics[name] = float(value)

    def on_evaluate(self, args: Any, state: Any, control: Any,
                    metrics: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        val = {"val_" + name[len("eval_"):]: float(value)
               for name, value in (metrics or {}).items()
               if name.startswith("eval_") and _is_curve(name, value)}
        # After the epoch's end: written with the epoch's bands (as Keras's val_loss);
        # within an epoch: at the step it followed.
        (self._val if self._epoch_done else self._metrics).update(val)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.introspector is None:
            return
        self._settle(None)
        self._unfollow()
        self.introspector.close()
        self.introspector = None

    # ------------------------------------------------------------------ the step's loss

    def _follow(self, trainer: Any) -> None:
        """Wrap ``trainer.training_step`` (this instance's, for this training) to add up
        the losses it returns: the value the trainer adds to its logged loss, after its
        gradient accumulation scaling, so an optimizer step's sum is its loss once."""
        if trainer is None:
            self._failures.warn_once("loss trainer", "IntrospectCallback: the Trainer running"
                                     " it was not found; the loss recorded is the trainer's"
                                     " logged 'loss' (every logging_steps, the mean since the"
                                     " previous log)")
            return
        self._trainer = trainer
        current = trainer.__dict__.get("training_step")
        if getattr(current, "_tb_introspect", None) is self:
            return  # wrapped by an earlier train() of this trainer that did not end
        original = trainer.training_step

        def training_step(*args: Any, **kwargs: Any) -> Any:
            loss = original(*args, **kwargs)
            if self._trainer is trainer:  # not after on_train_end, nor for another trainer
                self._add_loss(loss)
            return loss

        training_step._tb_introspect = self  # type: ignore[attr-defined]
        training_step._tb_original = current  # type: ignore[attr-defined]
        trainer.training_step = training_step
        for method in ("compute_loss", "training_step"):
            if _overrides(trainer, method):
                logger.info("IntrospectCallback: the loss recorded is %s.%s's, each optimizer"
                            " step's micro-batches summed as the Trainer sums them",
                            type(trainer).__name__, method)
                break

    def _add_loss(self, loss: Any) -> None:
        """Add one micro-batch's loss; what cannot be one number falls back, once, to the
        trainer's logged loss (training goes on)."""
        try:
            if isinstance(loss, torch.Tensor):
                if loss.numel() != 1:
                    raise ValueError(f"training_step returned shape {tuple(loss.shape)}")
                loss = loss.detach()
                if loss.dtype in (torch.float16, torch.bfloat16) or not loss.is_floating_point():
                    loss = loss.float()  # added up in float32, as the trainer's own total
            elif not isinstance(loss, numbers.Real):
                raise TypeError(f"training_step returned a {type(loss).__name__}")
            self._step_loss = loss if self._step_loss is None else self._step_loss + loss
        except Exception as e:
            self._unfollow()
            self._failures.warn_once("loss read", f"IntrospectCallback: the step's loss cannot be"
                                     f" read ({type(e).__name__}: {e}); the loss recorded is"
                                     " the trainer's logged 'loss' from now on (every"
                                     " logging_steps, the mean since the previous log)")

    def _unfollow(self) -> None:
        """Give the trainer its ``training_step`` back (where it is still ours; else ours
        passes every call through)."""
        trainer, self._trainer, self._step_loss = self._trainer, None, None
        if trainer is None:
            return
        current = trainer.__dict__.get("training_step")
        if getattr(current, "_tb_introspect", None) is self:
            if current._tb_original is None:
                del trainer.training_step
            else:
                trainer.training_step = current._tb_original

    # ------------------------------------------------------------------

    def _settle(self, control: Any) -> None:
        """Tell the Introspector the step and the epoch end whose events are all in;
        ``on_finding="stop"`` sets ``control``'s stop (None: training is over)."""
        intro = self.introspector
        if intro is None:
            return
        try:
            if self._step_done:
                metrics, self._metrics, self._step_done = self._metrics, {}, False
                intro.step(loss=metrics.pop("loss", None), **metrics)
            if self._epoch_done:
                val, self._val, self._epoch_done = self._val, {}, False
                intro.end_epoch(**val)
        except FindingStop:  # the finding is logged; the trainer ends its own way
            if control is not None:
                control.should_training_stop = True


def tensorboard_dir(args: Any, state: Any = None) -> str:
    """Where ``report_to="tensorboard"`` writes: ``TENSORBOARD_LOGGING_DIR``, else
    ``args.logging_dir`` (transformers 4), else ``<output_dir>/runs/<date>_<host>`` as
    transformers 5's ``TensorBoardCallback`` names it when training begins (that callback
    runs first and has made the folder a moment ago: that one is taken).

    Example:
        >>> from types import SimpleNamespace
        >>> os.environ["TENSORBOARD_LOGGING_DIR"] = "logs/run1"
        >>> tensorboard_dir(SimpleNamespace(output_dir="out"))
        'logs/run1'
        >>> del os.environ["TENSORBOARD_LOGGING_DIR"]
    """
    env = os.getenv("TENSORBOARD_LOGGING_DIR")
    if env:
        return os.path.expanduser(env)
    if getattr(args, "logging_dir", None):
        return os.fspath(args.logging_dir)
    from transformers.integrations.integration_utils import default_logdir

    named = os.path.join(args.output_dir, default_logdir())
    trial = getattr(state, "trial_name", None) if getattr(
        state, "is_hyper_param_search", False) else None
    if trial is not None:
        return os.path.join(named, trial)
    # The callback's folder may carry the previous second's name: the newest one of this
    # host with an event file from the last few seconds.
    host = socket.gethostname()
    recent = [d for d in glob.glob(os.path.join(glob.escape(args.output_dir), "runs", "*"))
              if d.endswith("_" + host) and any(
                  time.time() - os.path.getmtime(f) < 10
                  for f in glob.glob(os.path.join(glob.escape(d), "events.out.tfevents.*")))]
    if os.path.isdir(named) or not recent:
        return named
    return max(recent, key=os.path.getmtime)


def _planned(args: Any, state: Any) -> tuple[float | None, float | None, int | None]:
    """The run's planned epochs, optimizer steps and logging interval (``auto_window``)."""
    steps = getattr(state, "max_steps", None) or None
    epochs = getattr(state, "num_train_epochs", None) or None
    every = getattr(state, "logging_steps", None) or getattr(args, "logging_steps", None)
    if every is not None and 0 < every < 1 and steps:  # a ratio of the run's steps
        every = math.ceil(steps * every)
    if str(getattr(args, "logging_strategy", "steps")).split(".")[-1].lower() != "steps":
        every = None
    return epochs, steps, int(every) if every else None


def _is_curve(name: str, value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and name not in _NOT_CURVES and not name.endswith(_NOT_CURVE_SUFFIXES))


def model_loss(model: Any, args: Any, trainer: Any = None) -> torch.nn.Module | None:
    """The loss the ``Trainer`` computes, where it is certain: label smoothing
    (``label_smoothing_factor``: the Trainer's cross-entropy on the logits), else the
    model's own loss from ``labels`` for a class transformers registers for its config
    (``MODEL_FOR_CAUSAL_LM_MAPPING``: cross-entropy over the logits;
    ``MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING``: by ``config.problem_type``, one label
    being a regression), its ``forward`` not overridden. None otherwise (a subclass, an
    unset ``problem_type`` with several labels, which the labels' dtype decides later, a
    ``trainer`` that overrides ``compute_loss`` or ``training_step`` or has a
    ``compute_loss_func``)."""
    from torch import nn
    from transformers.models.auto import modeling_auto as auto

    if trainer is not None and (getattr(trainer, "compute_loss_func", None) is not None
                                or _overrides(trainer, "compute_loss")
                                or _overrides(trainer, "training_step")):
        return None
    smoothing = float(getattr(args, "label_smoothing_factor", 0.0) or 0.0)
    if smoothing:
        return nn.CrossEntropyLoss(label_smoothing=smoothing)
    config = getattr(model, "config", None)

    def registered(mapping: Any) -> bool:
        try:
            cls = mapping[type(config)]
        except (KeyError, ValueError):
            return False
        return isinstance(model, cls) and type(model).forward is cls.forward

    if config is None:
        return None
    if registered(auto.MODEL_FOR_CAUSAL_LM_MAPPING):
        return nn.CrossEntropyLoss()
    if registered(auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING):
        problem = getattr(config, "problem_type", None)
        if problem is None and getattr(config, "num_labels", 0) == 1:
            problem = "regression"
        return {"single_label_classification": nn.CrossEntropyLoss,
                "multi_label_classification": nn.BCEWithLogitsLoss,
                "regression": nn.MSELoss}.get(problem, lambda: None)()
    return None


def _calling_trainer(callback: TrainerCallback) -> Any:
    """The ``Trainer`` whose callbacks hold ``callback``, from the frames calling it (a
    callback's events are given the model and optimizer, not the trainer); None if none."""
    from transformers import Trainer

    frame = sys._getframe(1)
    try:
        for _ in range(32):
            if frame is None:
                break
            owner = frame.f_locals.get("self")
            if isinstance(owner, Trainer) and any(
                    cb is callback for cb in owner.callback_handler.callbacks):
                return owner
            frame = frame.f_back
    finally:
        del frame  # a frame held here would keep the whole stack's locals alive
    return None


def _overrides(trainer: Any, method: str) -> bool:
    """Whether ``trainer``'s class replaces ``transformers.Trainer``'s ``method``."""
    from transformers import Trainer

    return getattr(type(trainer), method, None) is not getattr(Trainer, method)


def _torch_optimizer(optimizer: Any) -> torch.optim.Optimizer | None:
    """The torch optimizer inside accelerate's ``AcceleratedOptimizer`` (its step runs the
    inner one's, whose step pre-hook sees the clipped gradients)."""
    for _ in range(4):
        inner = getattr(optimizer, "optimizer", None)
        if not isinstance(inner, torch.optim.Optimizer):
            break
        optimizer = inner
    return optimizer if isinstance(optimizer, torch.optim.Optimizer) else None
