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

from tb_introspect.jax.trees import OUTPUT_KEYS, ROOT

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
    if _nnx_calls is not None and (module, key) not in _nnx_calls:
        _nnx_calls.append((module, key))
    x = module.perturb(key, x)
    module.sow(nnx.Intermediate, key, x)
    return x


#: While ``nnx_outputs`` runs a model: the (module, key) of each tap, in the order they ran.
_nnx_calls: list[tuple[Any, str]] | None = None


def nnx_outputs(model: Any, *args: Any, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
    """One call of the NNX ``model`` on ``args``: its taps' perturbations (the zeros whose
    gradients are the output gradients) and their outputs, ``{layer: calls}`` in the order
    the layers ran, for ``Introspector(outputs=...)``. ``nnx.capture`` returns its state
    sorted by name, which loses that order (the layers' depth: which is the first layer).

    Example:
        >>> import jax.numpy as jnp
        >>> from flax import nnx
        >>> from tb_introspect.jax import nnx_outputs, tap
        >>> class Net(nnx.Module):
        ...     def __init__(self, rngs):
        ...         self.z_in = nnx.Linear(4, 8, rngs=rngs)
        ...         self.a_out = nnx.Linear(8, 2, rngs=rngs)
        ...     def __call__(self, x):
        ...         h = tap(self.z_in, self.z_in(x))
        ...         return tap(self.a_out, self.a_out(h))
        >>> taps, outputs = nnx_outputs(Net(nnx.Rngs(0)), jnp.ones((3, 4)))
        >>> list(outputs)
        ['z_in', 'a_out']
    """
    global _nnx_calls
    from flax import nnx

    from tb_introspect.jax.trees import named_leaves

    calls: list[tuple[Any, str]] = []
    _nnx_calls = calls
    try:
        _, perturbations = nnx.capture(model, nnx.Perturbation)(*args, **kwargs)
    finally:
        _nnx_calls = None
    _, captured = nnx.capture(model, nnx.Intermediate, init=perturbations)(*args, **kwargs)
    by_name: dict[str, list] = {}
    for name, leaf in named_leaves(captured, calls=True):
        by_name.setdefault(name, []).append(leaf)
    paths = {id(m): "/".join(str(k) for k in path) for path, m in nnx.iter_modules(model)}
    order = []
    for module, key in calls:
        path = paths.get(id(module), "")
        order.append((path if key == _KEY else f"{path}/{key}".lstrip("/")) or ROOT)
    ranked = {name: i for i, name in enumerate(dict.fromkeys(order))}
    names = sorted(by_name, key=lambda n: ranked.get(n, len(ranked)))
    return perturbations, {name: tuple(by_name[name]) for name in names}


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
