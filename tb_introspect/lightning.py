"""Lightning: ``IntrospectCallback``, the PyTorch ``Introspector`` driven by a Lightning
``Trainer``'s callback hooks (``pip install 'tb-introspect[lightning]'``).

Example:
    >>> import lightning as L
    >>> from tb_introspect.lightning import IntrospectCallback
    >>> trainer = L.Trainer(max_epochs=3, callbacks=[IntrospectCallback()])  # doctest: +SKIP
    >>> trainer.fit(module, train_loader, val_loader)  # doctest: +SKIP
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch import Callback
from lightning.pytorch.loggers import TensorBoardLogger

from tb_introspect import aliases, slots
from tb_introspect.pipeline.findings import FindingStop
from tb_introspect.pipeline.options import OptionArgs
from tb_introspect.torch.introspector import Introspector, IntrospectorArgs
from tb_introspect.torch.loss import attribute_loss

if TYPE_CHECKING:
    import lightning.pytorch as pl
    from typing_extensions import Unpack

__all__ = ["IntrospectCallback"]


class IntrospectCallback(Callback):
    """The four views of a ``LightningModule`` while a Lightning ``Trainer`` fits it.

    ``log_dir`` defaults to the ``TensorBoardLogger``'s ``log_dir`` (``lightning_logs/
    version_N``), beside the logger's scalars; with another logger, the trainer's
    ``log_dir``. ``every``, ``views`` and the keyword options are the ``Introspector``'s;
    ``every="auto"`` (the default) follows the run: a point per epoch where it plans 20
    epochs or more, else per window of steps (``window``) from
    ``trainer.estimated_stepping_batches``, aligned to ``log_every_n_steps``
    (``pipeline.plan.auto_window``), longer where the points' measured cost would exceed
    ``overhead`` (``Governor.paced_window``).
    A step is an optimizer step (``trainer.global_step``: ``accumulate_grad_batches``'
    micro-batches are one step, their layer outputs all counted, their losses summed as
    Lightning scales them); gradients are read after the optimizer step, as it applied
    them (after ``gradient_clip_val``); the loss is ``training_step``'s, the learning rate
    the first optimizer's; validation metrics (``val*`` names in
    ``trainer.callback_metrics``) are written at the epoch's end. Under DDP the statistics
    cover every rank and rank 0 writes. ``on_finding="stop"`` ends the fit through the
    trainer (``trainer.should_stop``) after the step that showed the finding.

    Example:
        >>> cb = IntrospectCallback(every=16, layers="conv.*")
        >>> trainer = L.Trainer(callbacks=[cb], logger=TensorBoardLogger("logs"))  # doctest: +SKIP
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
        self._steps = 0
        self._loss: torch.Tensor | None = None
        self._val: dict[str, Any] = {}

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # trainer.model is the DistributedDataParallel wrapper under DDP: the Introspector
        # hooks the module inside it and scales the output gradients to the ranks' mean.
        model = trainer.model if trainer.model is not None else pl_module
        self._steps = trainer.global_step
        self._loss, self._val = None, {}
        self.introspector = self.args.make(
            _log_dir(trainer), model, None, initial_step=trainer.global_step,
            initial_epoch=trainer.current_epoch, planned=_planned(trainer),
            criterion=attribute_loss(pl_module))

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        intro = self.introspector
        if intro is None:
            return
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if isinstance(loss, torch.Tensor):
            loss = loss.detach()
            self._loss = loss if self._loss is None else self._loss + loss
        if trainer.global_step == self._steps:
            return  # a micro-batch of gradient accumulation: no optimizer step yet
        self._steps = trainer.global_step
        metrics: dict[str, Any] = {}
        if trainer.optimizers:
            metrics["learning_rate"] = float(trainer.optimizers[0].param_groups[0]["lr"])
        loss, self._loss = self._loss, None
        try:
            intro.step(loss=loss, **metrics)
        except FindingStop:  # the finding is logged; Lightning ends the fit its own way
            trainer.should_stop = True

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.introspector is None or trainer.sanity_checking:
            return
        self._val = {name.replace("val/", "val_", 1): value
                     for name, value in trainer.callback_metrics.items()
                     if name.startswith(("val_", "val/"))}

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.introspector is None:
            return
        val, self._val = self._val, {}
        try:
            self.introspector.end_epoch(**val)
        except FindingStop:
            trainer.should_stop = True

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._close()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        self._close()

    def _close(self) -> None:
        if self.introspector is not None:
            self.introspector.close()
            self.introspector = None


def _planned(trainer: pl.Trainer) -> tuple[float | None, float | None, int | None]:
    """The fit's planned epochs and optimizer steps, and its logging interval
    (``auto_window``)."""
    try:
        steps = float(trainer.estimated_stepping_batches)
    except Exception:  # no length known: per epoch
        return None, None, None
    per_epoch = float(trainer.num_training_batches) / max(trainer.accumulate_grad_batches, 1)
    epochs = steps / per_epoch if math.isfinite(per_epoch) and per_epoch > 0 else None
    if epochs is not None and trainer.max_epochs is not None and trainer.max_epochs > 0:
        epochs = min(epochs, trainer.max_epochs)
    return epochs, steps if math.isfinite(steps) else None, trainer.log_every_n_steps


def _log_dir(trainer: pl.Trainer) -> str:
    """The ``TensorBoardLogger``'s run folder (rank 0's, on every rank), else the
    trainer's ``log_dir``, else its ``default_root_dir``."""
    tb = next((lg for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)), None)
    if tb is not None:
        return trainer.strategy.broadcast(tb.log_dir)
    return trainer.log_dir or trainer.default_root_dir


def __getattr__(name: str) -> Any:
    if name == "Introspect":  # the name before the trainer callbacks were named alike
        return aliases.renamed("tb_introspect.lightning.Introspect",
                               "tb_introspect.lightning.IntrospectCallback", IntrospectCallback)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
