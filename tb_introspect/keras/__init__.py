"""Keras integration: ``Introspect``, a callback for an unmodified ``model.fit``, and
``Introspector``, the same for a custom TensorFlow training loop (TensorFlow backend).

The callback logs on Keras's TensorFlow, PyTorch and JAX backends; on another backend it
warns once and logs nothing, and the training goes on.

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
elif keras.config.backend() == "torch":  # TensorFlow need not even be installed
    from tb_introspect.keras.torch_backend import Introspect

    __all__ = ["Introspect"]
elif keras.config.backend() == "jax":
    from tb_introspect.keras.jax_backend import Introspect

    __all__ = ["Introspect"]
else:
    from tb_introspect.keras.other_backends import Introspect

    __all__ = ["Introspect"]
