"""What a Keras model has to monitor, on any backend: the layers whose outputs are captured
(and the layer each trainable variable belongs to), which of them are rectifiers, and the
mean-like metrics whose change per step is that step's value. Nothing here imports
TensorFlow: the PyTorch backend's callback reads the same parts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import keras


@dataclass
class CapturedLayer:
    """A layer whose outputs are captured, with its display name."""

    layer: keras.layers.Layer
    name: str


def layers_to_capture(model: keras.Model) -> list[CapturedLayer]:
    """The layers whose outputs are monitored, in model order.

    Functional/Sequential models contribute their layers, recursing into nested
    models (a model used as a layer); the nested model's own output is its last
    layer's, so it is not captured twice. A subclassed model contributes its
    direct sub-layers (a composite layer counts as one unit).
    """
    found: list[CapturedLayer] = []
    seen: set[int] = set()

    def walk(container: keras.layers.Layer, prefix: str) -> None:
        for layer in getattr(container, "layers", []):
            if id(layer) in seen or isinstance(layer, keras.layers.InputLayer):
                continue
            seen.add(id(layer))
            if isinstance(layer, keras.Model) and getattr(layer, "layers", None):
                walk(layer, f"{prefix}{layer.name}/")
            else:
                found.append(CapturedLayer(layer, f"{prefix}{layer.name}"))

    walk(model, "")
    return found


def variable_owners(layers: list[CapturedLayer]) -> dict[int, str]:
    """``id(variable)`` -> the name of the first of ``layers`` that holds it."""
    owner: dict[int, str] = {}
    for entry in layers:
        for v in entry.layer.trainable_variables:
            owner.setdefault(id(v), entry.name)
    return owner


#: Activations whose output is exactly zero on a whole half-line: only there does a unit that
#: is zero for every sample mean something (a dead unit).
RECTIFIER_ACTIVATIONS = frozenset({"relu", "relu6"})


def is_rectifier(layer: keras.layers.Layer) -> bool:
    """Whether ``layer``'s own function makes exact zeros: ReLU, ReLU6, thresholded ReLU
    (``keras.layers.ReLU`` without a negative slope, ``Activation("relu")``), or a layer
    whose ``activation`` is one of these (``Dense(..., activation="relu")``, Conv...)."""
    kind = type(layer).__name__
    if kind == "ReLU":
        return not float(getattr(layer, "negative_slope", 0.0) or 0.0)
    if kind == "ThresholdedReLU":
        return True
    if kind == "LeakyReLU":
        return float(getattr(layer, "negative_slope", 0.3)) == 0.0
    act = getattr(layer, "activation", None)
    name = act if isinstance(act, str) else getattr(act, "__name__", None)
    return name in RECTIFIER_ACTIVATIONS


def mean_metrics(model: keras.Model) -> list[Any]:
    """Mean-like metrics (``total`` and ``count`` variables), the loss tracker first."""
    found: list[Any] = []

    def walk(m: Any) -> None:
        if hasattr(m, "total") and hasattr(m, "count"):
            found.append(m)
            return
        subs = getattr(m, "metrics", None)
        if isinstance(subs, (list, tuple)):
            for s in subs:
                walk(s)

    for m in model.metrics:
        walk(m)
    out, names = [], set()
    for m in found:
        if m.name not in names and getattr(m, "count", None) is not None:
            names.add(m.name)
            out.append(m)
    return out
