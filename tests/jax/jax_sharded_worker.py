"""Run with ``--xla_force_host_platform_device_count=8`` in ``XLA_FLAGS``: the same states and
the same training, on a (data, model) mesh of 8 CPU devices and on one device; prints JSON
for ``test_jax_sharded.py`` to compare."""

from __future__ import annotations

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from tb_introspect.jax import fold
from tb_introspect.stats_np import segments
from tests.jax.jax_support import train


def states(log_dir: str) -> dict:
    """Part one: one array with NaN and Inf folded twice, sharded (batch over ``data``,
    channels over ``model``) and whole, under ``jit``."""
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
    rng = np.random.default_rng(3)
    x = rng.normal(size=(16, 6, 6, 8)).astype(np.float32)
    x[x < -1.5] = 0.0
    x[0, 0, 0, 0], x[3, 2, 1, 5] = np.nan, np.inf
    seg = segments.layout(x.shape, False, 256)
    step = jax.jit(lambda st, a, key: fold.fold(st, a, seg, key))
    out = {}
    for name, arr in (("whole", jnp.asarray(x)),
                      ("sharded", jax.device_put(x, NamedSharding(mesh, P("data", None, None,
                                                                          "model"))))):
        st = fold.empty(seg)
        for i in range(3):  # three steps
            st = step(st, arr * (i + 1), jax.random.key(i))
        out[name] = {k: np.asarray(v).tolist() for k, v in jax.device_get(st).items()}
        out[name + "_shards"] = len(arr.sharding.device_set)
    return out


def main() -> None:
    log_dir = sys.argv[1]
    out = {"devices": jax.device_count(), "states": states(log_dir)}
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "model"))
    # Part two: a training's parameters sharded over ``model`` (the hidden units), its
    # batches over ``data``; the same training on one device.
    rules = {"kernel": P(None, "model"), "bias": P("model")}
    train(f"{log_dir}/sharded", epochs=1, steps=4, every=1, mesh=(mesh, rules))
    train(f"{log_dir}/whole", epochs=1, steps=4, every=1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
