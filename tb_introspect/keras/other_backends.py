"""``Introspect`` where Keras runs on neither TensorFlow, PyTorch nor JAX (NumPy): it says
once why it logs nothing, and the user's ``fit`` goes on.

Keras 3 picks its backend once per process (``KERAS_BACKEND``). The callback logs through
TensorFlow's instrumented train step, the PyTorch engine's hooks or the JAX engine's fold;
on NumPy it keeps the user's options checked, as elsewhere, and stays out of the way
instead of failing inside ``fit``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import keras

from tb_introspect import metadata
from tb_introspect.pipeline.failures import warn
from tb_introspect.pipeline.options import OptionArgs, Options, check_log_dir

if TYPE_CHECKING:
    from typing_extensions import Unpack


class Introspect(keras.callbacks.Callback):
    """The Keras callback on a backend it cannot log on: options checked, no statistics (a
    warning at the first ``fit``)."""

    def __init__(self, log_dir: str, views: Sequence[str] = metadata.VIEWS,
                 every: str | int = "epoch", **options: Unpack[OptionArgs]):
        super().__init__()
        self.options = Options.of(views, every, options)
        self.log_dir = check_log_dir(log_dir)
        self._warned = False

    def on_train_begin(self, logs: dict | None = None) -> None:
        if not self._warned:
            self._warned = True
            warn(f"Introspect logs on Keras's TensorFlow, PyTorch and JAX backends; this process"
                 f" runs Keras on {keras.config.backend()!r} (KERAS_BACKEND), so this fit() is"
                 " trained without statistics.")
