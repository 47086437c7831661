"""tb-introspect: see inside a neural network while it trains, in TensorBoard.

The writer side (``tb_introspect.keras``, ``tb_introspect.summary``,
``tb_introspect.stats``) needs TensorFlow; the plugin side
(``tb_introspect.plugin``) and the numpy writer path do not.
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    # Lazy, so that importing the package (the TensorBoard plugin does) never
    # imports TensorFlow.
    if name == "Introspector":  # the custom TensorFlow loop's, now beside the callback
        from tb_introspect import aliases
        from tb_introspect.keras.introspector import Introspector

        return aliases.renamed("tb_introspect.Introspector", "tb_introspect.keras.Introspector",
                               Introspector)
    if name == "FindingStop":
        from tb_introspect.pipeline.findings import FindingStop

        return FindingStop
    raise AttributeError(f"module 'tb_introspect' has no attribute {name!r}")
