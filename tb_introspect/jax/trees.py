"""Names of the arrays in a JAX pytree (Flax Linen variables and intermediates, Flax NNX
states, plain dicts), and the order of their layers.

A leaf's name is its key path joined by ``/``, without what names no layer: a Linen
collection at the root (``params``, ``intermediates``, ``perturbations``), the keys a
layer's output is kept under (``OUTPUT_KEYS``) and an NNX ``Variable``'s ``value``. For layer
outputs the trailing tuple index (one entry per call of a module, ``sow``'s tuple) is
dropped too, so every call of a layer folds into one tensor's statistics.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import jax
from jax.tree_util import DictKey, FlattenedIndexKey, GetAttrKey, SequenceKey

#: Linen's variable collections, dropped from the front of a name.
COLLECTIONS = ("params", "intermediates", "perturbations")
#: The layer name of a model's own output (Linen's captured root ``__call__``).
ROOT = "model"
#: Keys that hold a layer's own output and its perturbation (``taps``): dropped, so both
#: carry the layer's name. ``__call__`` is where Linen's ``capture_intermediates`` keeps it.
OUTPUT_KEYS = ("__call__", "introspect")


def _key(k: Any) -> str:
    if isinstance(k, DictKey):
        return str(k.key)
    if isinstance(k, GetAttrKey):
        return k.name
    if isinstance(k, SequenceKey):
        return str(k.idx)
    if isinstance(k, FlattenedIndexKey):
        return str(k.key)
    return str(k)


def leaf_name(path: tuple, calls: bool = False) -> str:
    """The name of the leaf at ``path``; ``calls``: the path ends in a per-call tuple index
    (a layer output), dropped."""
    keys = list(path)
    if calls:
        while keys and isinstance(keys[-1], SequenceKey):
            keys.pop()
    parts = [_key(k) for k in keys
             if not (isinstance(k, GetAttrKey) and k.name == "value")]
    parts = [p for p in parts if p not in OUTPUT_KEYS]
    if parts and parts[0] in COLLECTIONS:
        parts = parts[1:]
    return "/".join(parts) or ROOT


def named_leaves(tree: Any, calls: bool = False) -> list[tuple[str, Any]]:
    """``(name, leaf)`` of every array leaf of ``tree``, in ``jax.tree`` order."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [(leaf_name(path, calls), leaf) for path, leaf in flat]


def natural_key(name: str) -> tuple:
    """Sort key that puts ``Dense_2`` before ``Dense_10`` (JAX sorts dict keys as strings);
    the model's own output last."""
    parts = tuple((0, int(t), "") if t.isdigit() else (1, 0, t)
                  for t in re.split(r"(\d+)", name) if t)
    return (name == ROOT, parts)



def call_order(tree: Any) -> list[str]:
    """The names of ``tree``'s layer outputs in the order they were kept: a Linen
    ``intermediates`` dict and NNX's captured state keep insertion order (the order the
    layers ran), which ``jax.tree`` loses by sorting the keys."""
    names: list[str] = []

    def walk(node: Any, path: tuple) -> None:
        if isinstance(node, Mapping):
            for k, v in node.items():
                walk(v, (*path, DictKey(k)))
        elif isinstance(node, (list, tuple)):
            for i, v in enumerate(node):
                walk(v, (*path, SequenceKey(i)))
        else:
            names.append(leaf_name(path, calls=True))

    walk(tree, ())
    return list(dict.fromkeys(names))


def layer_order(output_layers: list[str], param_layers: list[str]) -> list[str]:
    """Every layer, nearest the input first: the outputs' layers in call order, each
    layer with parameters but no output placed after the last layer that sorts before it
    (``natural_key``)."""
    order = list(output_layers)
    for layer in sorted(set(param_layers) - set(order), key=natural_key):
        before = [i for i, other in enumerate(order) if natural_key(other) < natural_key(layer)]
        order.insert(before[-1] + 1 if before else 0, layer)
    return order
