"""Every patch the Keras callback applies to a model, applied and removed as one unit.

For one ``fit()`` the callback patches three things, all as instance attributes that never
reach a saved model: the monitored layers' ``call`` (``capture.LayerPatcher``), the
optimizer's ``apply`` (to see the gradients), and the model's ``train_function`` (routed
through the callback). It also quiets one TensorFlow warning about Keras's own functions
while it is routed (``KerasRetracing``). ``Installation.remove`` undoes all of them, whatever
happened, so a later ``fit()`` without the callback trains exactly as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import keras

from tb_introspect.keras import capture, private
from tb_introspect.keras.model_parts import CapturedLayer
from tb_introspect.keras.step import StepRecorder
from tb_introspect.pipeline.failures import Part


class KerasRetracing(logging.Filter):
    """Drops TensorFlow's "triggered tf.function retracing" warning about Keras's own train,
    test and predict functions. TensorFlow counts the traces of all of them, of every model,
    together (one code object), and the callback traces its own train function besides
    Keras's, so a process that fits a few models (a notebook, a sweep) would print it for
    traces the user did not cause and cannot avoid. The user's own functions still warn, and
    ``fit`` without the callback is unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not ("triggered tf.function retracing" in text
                    and "TensorFlowTrainer._make_function" in text)


class Installation:
    """The patches of one model, with what they replaced."""

    def __init__(self, model: keras.Model) -> None:
        self.model = model
        self.optimizer = model.optimizer
        self.layers = capture.LayerPatcher([])
        self._saved_apply: tuple[bool, Any] | None = None
        self.original_fn: Callable | None = None
        self.active = False
        self._quiet = KerasRetracing()

    def keep_original(self) -> None:
        """Make and keep the model's own train function (to run and to put back)."""
        self.model.make_train_function()
        self.original_fn = self.model.train_function

    def capture_layers(self, captured: Sequence[CapturedLayer]) -> None:
        self.layers = capture.LayerPatcher(list(captured))

    def patch(self, layers: bool, apply: Callable[[Callable], Callable] | None) -> None:
        """Wrap the layers' ``call`` (when ``layers``) and the optimizer's ``apply`` with
        ``apply(original)`` (when given)."""
        if layers:
            self.layers.install()
        opt = self.optimizer
        if apply is not None and opt is not None and self._saved_apply is None:
            self._saved_apply = ("apply" in opt.__dict__, opt.__dict__.get("apply"))
            private.set_instance_attr(opt, "apply", apply(opt.apply))

    def route(self, train_function: Callable) -> None:
        """Make ``train_function`` the model's train function until ``remove``."""
        self.model.train_function = train_function
        self.active = True
        logging.getLogger("tensorflow").addFilter(self._quiet)

    def remove(self) -> None:
        """Undo every patch; the model gets its own train function back."""
        self.layers.remove()
        opt, saved = self.optimizer, self._saved_apply
        if opt is not None and saved is not None:
            had, previous = saved
            if had:
                private.set_instance_attr(opt, "apply", previous)
            else:
                private.del_instance_attr(opt, "apply")
            self._saved_apply = None
        if self.active and self.original_fn is not None:
            # The plain Keras function (never traced with instrumentation).
            self.model.train_function = self.original_fn
        self.active = False
        logging.getLogger("tensorflow").removeFilter(self._quiet)


def gradients_to_recorder(optimizer: Any) -> Callable:
    """The wrapper of ``optimizer.apply`` that hands the gradients to the step recorder
    recording (``capture.active_recorder``) before they are applied."""
    def wrap(original):
        def apply(grads, trainable_variables=None):
            rec = capture.active_recorder()
            if isinstance(rec, StepRecorder):
                variables = trainable_variables
                if variables is None:
                    variables = private.optimizer_variables(optimizer)
                try:
                    rec.gradients(list(grads), list(variables))
                except Exception as e:
                    rec.fail(Part("gradient"), e)
            return original(grads, trainable_variables)
        return apply

    return wrap
