"""Keras integration: ``Introspect``, a callback for an unmodified ``model.fit``, and
``Introspector``, the same for a custom TensorFlow training loop (TensorFlow backend).

On a Keras backend other than TensorFlow the callback warns once and logs nothing; the
training goes on.

Example:
    >>> from tb_introspect.keras import Introspect
    >>> callback = Introspect("logs/run1", every="epoch")  # doctest: +SKIP
    >>> model.fit(x, y, epochs=10, callbacks=[callback])  # doctest: +SKIP
"""

import keras

if keras.config.backend() == "tensorflow":
    from tb_introspect.keras.callback import Introspect
    from tb_introspect.keras.introspector import Introspector

    __all__ = ["Introspect", "Introspector"]
else:  # TensorFlow need not even be installed
    from tb_introspect.keras.other_backends import Introspect

    __all__ = ["Introspect"]
