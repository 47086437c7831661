"""Layer outputs and their gradients out of a Flax model: ``tap_layers`` keeps every Linen
layer's output, ``tap`` any array (an activation function's output).

A tapped output is kept twice under one name: its value as an intermediate (``sow``:
Linen's ``intermediates`` collection, NNX's ``nnx.Intermediate``) and a zero added to it
as a perturbation (``perturb``), whose gradient is the output gradient. NNX keeps both
while the model runs under ``nnx.capture`` (whose ``method_outputs`` keeps every layer's
output already). ``trees.leaf_name`` names both after the layer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import jax

from tb_introspect.jax.trees import OUTPUT_KEYS

_LINEN_KEY, _KEY = OUTPUT_KEYS[:2]  # ``__call__``: where capture_intermediates keeps one


def tap(module: Any, x: jax.Array, name: str | None = None) -> jax.Array:
    """``x`` kept as a monitored layer output, in a Flax module's ``__call__`` (Linen) or
    in an NNX module run under ``nnx.capture`` (outside it, ``x`` as it is). ``name``: the
    output's name inside ``module`` (an activation's: ``tap(self, nn.relu(h), "relu_0")``);
    None: ``module``'s own output, named as the layer. Returns the value to use from here
    on (``x`` plus a zero perturbation, so that its gradient is taken)."""
    from flax import linen

    if isinstance(module, linen.Module):
        key = name or _LINEN_KEY
        x = module.perturb(key, x)
        module.sow("intermediates", key, x)
        return x
    from flax import nnx

    if not hasattr(module, "__captures__"):
        # Outside ``nnx.capture`` (an evaluation, a plain call) a tap does nothing: NNX would
        # keep the value on the module itself, a deprecated path where the perturbation and
        # the intermediate of one name clash.
        return x
    key = name or _KEY
    x = module.perturb(key, x)
    module.sow(nnx.Intermediate, key, x)
    return x


@contextlib.contextmanager
def tap_layers() -> Iterator[None]:
    """While open, every Flax Linen layer (a module of ``flax.linen`` itself: ``Dense``,
    ``Conv``, ``LayerNorm``, ``Embed``...) that returns one array has its output tapped
    (``tap``). Open it around ``init`` (the perturbations' shapes are the batch's) and
    around each ``apply`` of the train step, with ``mutable=["intermediates"]``.

    Example:
        >>> import jax, jax.numpy as jnp, flax.linen as nn
        >>> from tb_introspect.jax import tap_layers
        >>> model = nn.Dense(3)
        >>> with tap_layers():
        ...     variables = model.init(jax.random.key(0), jnp.ones((2, 4)))
        >>> sorted(variables)
        ['params', 'perturbations']
    """
    from flax import linen

    def interceptor(next_fun: Any, args: Any, kwargs: Any, context: Any) -> Any:
        y = next_fun(*args, **kwargs)
        module = context.module
        if (context.method_name == "__call__" and isinstance(y, jax.Array)
                and type(module).__module__.startswith("flax.linen")):
            y = tap(module, y)
        return y

    with linen.intercept_methods(interceptor):
        yield
