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
from typing import Any

import keras
import tensorflow as tf

from tb_introspect.keras import private
from tb_introspect.keras.model_parts import CapturedLayer
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
