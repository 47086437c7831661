"""tb-introspect: see inside a neural network while it trains, in TensorBoard.

The writer side (``tb_introspect.keras``, ``tb_introspect.summary``,
``tb_introspect.stats``) needs TensorFlow; the plugin side
(``tb_introspect.plugin``) and the numpy writer path do not.
"""

__version__ = "0.1.0"
