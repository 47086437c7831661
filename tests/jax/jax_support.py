"""A Flax Linen MLP on scikit-learn's digits, trained by a jitted optax step with the JAX
``Introspector``, keeping what the tests check the written statistics against."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import flax.linen as nn
import jax
import numpy as np
import optax
from sklearn.datasets import load_digits

from tb_introspect.jax import Introspector, tap, tap_layers

BATCH = 32


def digits() -> tuple[np.ndarray, np.ndarray]:
    x, y = load_digits(return_X_y=True)
    return (x / 16.0).astype(np.float32), y.astype(np.int32)


class MLP(nn.Module):
    """Dense layers (tapped by ``tap_layers``) with ReLUs tapped by name."""

    width: int = 32
    depth: int = 2

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for i in range(self.depth):
            x = tap(self, nn.relu(nn.Dense(self.width)(x)), f"relu_{i}")
        return nn.Dense(10)(x)


@dataclass
class Record:
    """Per step (1-based): the loss, and on the steps asked for the host copies of the
    gradients, layer outputs, output gradients and the parameters after the update."""

    losses: dict[int, float] = field(default_factory=dict)
    grads: dict[int, Any] = field(default_factory=dict)
    outputs: dict[int, Any] = field(default_factory=dict)
    output_grads: dict[int, Any] = field(default_factory=dict)
    params: dict[int, Any] = field(default_factory=dict)


def train(log_dir: str, *, epochs: int = 2, steps: int = 20, lr: float = 1e-3,
          keep: set[int] = frozenset(), guard: set[int] = frozenset(), mesh: Any = None,
          **options: Any) -> Record:
    """Train and log; ``keep``: the steps whose arrays are recorded; ``guard``: the steps
    whose ``Introspector.step`` runs where a device-to-host transfer raises; ``mesh``: a
    ``(Mesh, {parameter name: PartitionSpec})`` that shards the parameters (where their
    shape divides) and the batches over its ``data`` axis."""
    x, y = digits()
    model = MLP()
    with tap_layers():
        variables = model.init(jax.random.key(0), x[:BATCH])
    params, perturbations = variables["params"], variables["perturbations"]
    place = lambda a: a  # noqa: E731
    if mesh is not None:
        params, perturbations, place = _sharded(mesh, params, perturbations)

    def forward(params, x):
        with tap_layers():
            return model.apply({"params": params, "perturbations": perturbations}, x,
                               mutable=["intermediates"])

    _, outputs = forward(params, x[:BATCH])
    opt = optax.adam(lr)
    opt_state = opt.init(params)
    intro = Introspector(log_dir, params, outputs=outputs, **options)

    def loss_fn(params, perturbations, xb, yb):
        with tap_layers():
            logits, outs = model.apply({"params": params, "perturbations": perturbations},
                                       xb, mutable=["intermediates"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, yb).mean(), outs

    @jax.jit
    def step(params, opt_state, stats, xb, yb):
        (loss, outs), (g, og) = jax.value_and_grad(loss_fn, argnums=(0, 1), has_aux=True)(
            params, perturbations, xb, yb)
        stats = intro.fold(stats, grads=g, outputs=outs, output_grads=og)
        updates, opt_state = opt.update(g, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, stats, loss, g, outs, og

    record = Record()
    stats = intro.init()
    n = 0
    with intro:
        for _ in range(epochs):
            for i in range(steps):
                at = (i * BATCH) % (len(x) - BATCH)
                params, opt_state, stats, loss, g, outs, og = step(
                    params, opt_state, stats, place(x[at:at + BATCH]), place(y[at:at + BATCH]))
                n += 1
                if n in guard:
                    with jax.transfer_guard_device_to_host("disallow"):
                        stats = intro.step(stats, params, loss=loss)
                else:
                    stats = intro.step(stats, params, loss=loss)
                record.losses[n] = float(loss)
                if n in keep:
                    record.grads[n], record.outputs[n], record.output_grads[n], \
                        record.params[n] = jax.device_get((g, outs, og, params))
            stats = intro.end_epoch(stats, params)
    return record


def _sharded(mesh: tuple, params: Any, perturbations: Any) -> tuple[Any, Any, Any]:
    """The parameters placed by the rules (replicated where a shape does not divide), the
    batch-shaped perturbations and a placement of batches, sharded over ``data``."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh, rules = mesh

    def place_param(path: tuple, a: jax.Array) -> jax.Array:
        spec = rules.get(path[-1].key, P())
        fits = all(ax is None or a.shape[i] % mesh.shape[ax] == 0
                   for i, ax in enumerate(spec))
        return jax.device_put(a, NamedSharding(mesh, spec if fits else P()))

    def by_batch(a: Any) -> jax.Array:
        return jax.device_put(a, NamedSharding(mesh, P("data")))

    return (jax.tree_util.tree_map_with_path(place_param, params),
            jax.tree.map(by_batch, perturbations), by_batch)
