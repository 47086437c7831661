"""``Introspect`` where Keras runs on neither TensorFlow, PyTorch nor JAX (NumPy): it says
once why it logs nothing, and the user's ``fit`` goes on.

Keras 3 picks its backend once per process (``KERAS_BACKEND``). The callback logs through
TensorFlow's instrumented train step, the PyTorch engine's hooks or the JAX engine's fold;
on NumPy it keeps the user's options checked, as elsewhere, and stays out of the way
instead of failing inside ``fit``.
"""

from __future__ import annotations

import keras

from tb_introspect.keras.engine_callback import EngineCallback
from tb_introspect.pipeline.failures import warn


class Introspect(EngineCallback):
    """The Keras callback on a backend it cannot log on: options checked, no statistics (a
    warning at the first ``fit``)."""

    def on_train_begin(self, logs: dict | None = None) -> None:
        if not self._stopped:
            self._stopped = True
            warn(f"Introspect logs on Keras's TensorFlow, PyTorch and JAX backends; this process"
                 f" runs Keras on {keras.config.backend()!r} (KERAS_BACKEND), so this fit() is"
                 " trained without statistics.")
