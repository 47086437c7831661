"""Keras integration: ``Introspect``, a callback for an unmodified ``model.fit``.

Example:
    >>> from tb_introspect.keras import Introspect
    >>> callback = Introspect("logs/run1", every="epoch")  # doctest: +SKIP
    >>> model.fit(x, y, epochs=10, callbacks=[callback])  # doctest: +SKIP
"""

from tb_introspect.collect.keras_callback import Introspect

__all__ = ["Introspect"]
