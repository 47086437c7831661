"""Layer-output capture for Keras models, and the per-trace recording context.

Keras has no forward hooks, so the layers whose outputs are monitored get an
instance-level ``call`` wrapper for the duration of training. The wrapper does
nothing unless a recorder is active *in the current thread* (a recorder is
pushed only while the instrumented train step is being traced), so evaluation,
prediction and any other use of the model are untouched. Thread-local because
``MirroredStrategy`` traces each replica's step in its own thread.

Each captured float tensor goes through an identity with a custom gradient
(a "probe"): the forward value is handed to the recorder, and so is the
gradient of the loss with respect to it when the tape differentiates through
it. This gives output gradients without a second backward pass and without
touching the user's train step.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import keras
import tensorflow as tf

from tb_introspect.keras import private
from tb_introspect.pipeline.failures import Part

_local = threading.local()


def active_recorder() -> Any | None:
    """The recorder active in this thread, or None."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


@contextlib.contextmanager
def recording(recorder: Any) -> Iterator[Any]:
    """Make ``recorder`` receive layer outputs traced in this thread."""
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    stack.append(recorder)
    try:
        yield recorder
    finally:
        stack.pop()


def probe(x: tf.Tensor, on_grad: Callable[[tf.Tensor], None]) -> tf.Tensor:
    """Identity on ``x``; calls ``on_grad(dy)`` when a tape differentiates through it."""

    @tf.custom_gradient
    def _identity(t):
        def grad(dy):
            if isinstance(dy, tf.IndexedSlices):
                dy = tf.convert_to_tensor(dy)
            on_grad(dy)
            return dy

        return tf.identity(t), grad

    return _identity(x)


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


class LayerPatcher:
    """Installs and removes the capturing ``call`` wrappers on a model's layers."""

    def __init__(self, captured: list[CapturedLayer]):
        self.captured = captured
        self._saved: list[tuple[keras.layers.Layer, bool, Any]] = []

    def install(self) -> None:
        for entry in self.captured:
            layer = entry.layer
            had_own = "call" in layer.__dict__
            self._saved.append((layer, had_own, layer.__dict__.get("call")))
            private.set_instance_attr(layer, "call", _wrap_call(layer.call, entry.name))

    def remove(self) -> None:
        while self._saved:
            layer, had_own, previous = self._saved.pop()
            if had_own:
                private.set_instance_attr(layer, "call", previous)
            else:
                private.del_instance_attr(layer, "call")


def _wrap_call(call: Callable, name: str) -> Callable:
    @functools.wraps(call)
    def capturing_call(*args, **kwargs):
        outputs = call(*args, **kwargs)
        recorder = active_recorder()
        if recorder is None:
            return outputs
        try:
            return recorder.layer_output(name, outputs)
        except Exception as e:  # the layer's own result stands; training goes on
            recorder.fail(Part("output", name), e)
            return outputs

    return capturing_call


def leaves_with_names(name: str, outputs: Any) -> list[tuple[str, Any]]:
    """Flatten a layer's (possibly nested) outputs into (name, leaf) pairs.

    A single tensor keeps the layer name; a tuple/list/dict output names each
    leaf ``layer/<index or key>``.
    """
    if isinstance(outputs, (tf.Tensor, tf.Variable)) or not tf.nest.is_nested(outputs):
        return [(name, outputs)]
    pairs = keras.tree.flatten_with_path(outputs)
    return [(f"{name}/{'/'.join(str(p) for p in path)}", leaf) for path, leaf in pairs]


def replace_leaves(outputs: Any, new_leaves: list[Any]) -> Any:
    if isinstance(outputs, (tf.Tensor, tf.Variable)) or not tf.nest.is_nested(outputs):
        return new_leaves[0]
    return keras.tree.pack_sequence_as(outputs, new_leaves)


def capturable(leaf: Any) -> bool:
    """A dense tensor of known rank (ragged/sparse/None/Python values are skipped)."""
    return isinstance(leaf, tf.Tensor) and leaf.shape.rank is not None


def is_float(dtype: tf.DType) -> bool:
    return dtype.is_floating
