"""What ``Introspect`` on Keras's PyTorch and JAX backends holds besides its engine: the
options, checked when it is made, and the rule that a failure of its own glue stops the
logging with one warning while ``fit`` goes on (the engines never raise into ``fit``: their
parts switch off and warn)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import keras

from tb_introspect import slots
from tb_introspect.pipeline.failures import warn
from tb_introspect.pipeline.options import OptionArgs, Options, check_log_dir

if TYPE_CHECKING:
    from typing_extensions import Unpack


class EngineCallback(keras.callbacks.Callback):
    """A Keras callback that drives one of the framework engines (``introspector``)."""

    def __init__(self, log_dir: str | os.PathLike, views: Sequence[str] = slots.VIEWS,
                 every: str | int = "epoch", **options: Unpack[OptionArgs]):
        super().__init__()
        Options.of(views, every, dict(options))  # a bad option fails here, not in fit
        self.log_dir = check_log_dir(os.fspath(log_dir))
        self.views, self.every, self.options = tuple(views), every, dict(options)
        self.introspector: Any = None
        self._stopped = False  # the glue failed: no logging for the rest of this callback

    def _off(self, error: BaseException) -> None:
        warn(f"Introspect stopped logging ({type(error).__name__}: {error}); training goes on")
        self._stopped = True
        self._close()

    def _close(self) -> None:
        intro, self.introspector = self.introspector, None
        if intro is not None:
            try:
                intro.close()
            except Exception as e:  # noqa: BLE001 - training goes on
                warn(f"Introspect could not close its run ({type(e).__name__}: {e})")
