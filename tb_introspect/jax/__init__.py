"""The JAX front-end: the four views of a jitted train step (Flax Linen or NNX, optax).

``Introspector`` makes the state a train step carries (``init``), folds a step's
gradients, layer outputs and output gradients into it inside the jitted step (``fold``),
and writes points from the host (``step``, ``end_epoch``). See ``docs/jax.md``.
"""

from tb_introspect.jax.introspector import Introspector
from tb_introspect.jax.taps import nnx_outputs, tap, tap_layers

__all__ = ["Introspector", "nnx_outputs", "tap", "tap_layers"]
